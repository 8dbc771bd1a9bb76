"""Random dilated convolution kernels pooled by the proportion of positive values (MiniRocket's design,
Dempster et al. 2021, written here from the paper's description).

The kernels: the 84 length-9 kernels whose weights are -1 except 2 at three of the nine taps. Each is
applied at a set of dilations spread exponentially from 1 to about (length - 1) / 8, half of the
(kernel, dilation) pairs with zero padding (an output at every step) and half without (only the
steps where the kernel lies inside the series). For a multivariate series each (kernel, dilation)
sums its convolution over a random subset of the channels. Each (kernel, dilation) output is compared
with a few biases, quantiles of that output on a random training series, and a feature is the share
of the valid output steps above its bias (PPV). Features are ordered dilation, kernel, bias.

`RandomDilatedKernels.fit` draws the channel subsets and biases from training series;
`forward` is the vectorised transform (a conv1d per dilation, then all biases at once) and
`reference` the same transform as plain loops over series, kernels and steps, to read and to test
`forward` against. Series of unequal length come padded at the end with a `valid` mask: an output
step counts only where every tap it reads lies on a real step or on the zero padding outside the series.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import nn

KERNEL_LENGTH = 9
TAPS_AT_TWO = list(itertools.combinations(range(KERNEL_LENGTH), 3))  # 84 kernels


def kernel_weights() -> np.ndarray:
    """(84, 9): -1 everywhere, 2 at the kernel's three taps (each kernel sums to 0)."""
    w = -np.ones((len(TAPS_AT_TWO), KERNEL_LENGTH))
    for k, taps in enumerate(TAPS_AT_TWO):
        w[k, list(taps)] = 2.0
    return w


def quantile_levels(n: int, offset: int = 0) -> np.ndarray:
    """A low-discrepancy sequence in (0, 1): the fractional parts of (i + 1) x the golden ratio."""
    golden = (math.sqrt(5) + 1) / 2
    return np.array([((offset + i + 1) * golden) % 1 for i in range(n)])


class RandomDilatedKernels(nn.Module):
    """(S, T, D) series -> (S, F) PPV features of random dilated kernels (module docstring)."""

    def __init__(self, n_features: int = 9996, max_dilations: int = 32, seed: int = 0):
        super().__init__()
        self.n_features, self.max_dilations, self.seed = int(n_features), int(max_dilations), int(seed)
        self.register_buffer("weights", torch.tensor(kernel_weights(), dtype=torch.float32))
        self.dilations: list[int] = []
        self.padded: list[np.ndarray] = []  # per dilation (84,) bool: zero padding or not
        self.channels: list[torch.Tensor] = []  # per dilation (D, 84) 0/1: channels each kernel sums
        self.biases: list[torch.Tensor] = []  # per dilation (84, n_b)

    @property
    def fitted(self) -> bool:
        return bool(self.dilations)

    @property
    def n_out(self) -> int:
        return sum(b.numel() for b in self.biases)

    def fit(self, x: torch.Tensor, valid: torch.Tensor) -> RandomDilatedKernels:
        """Draw dilations, channel subsets and biases from training series x (S, T, D), valid (S, T)."""
        rng = np.random.default_rng(self.seed)
        S, _, D = x.shape
        lengths = valid.sum(1).cpu().numpy()  # (S,)
        length = max(int(np.median(lengths)), KERNEL_LENGTH)
        per_kernel = max(1, self.n_features // len(TAPS_AT_TWO))
        n_dilations = min(per_kernel, self.max_dilations)
        top = math.log2(max((length - 1) / (KERNEL_LENGTH - 1), 1))
        raw = np.floor(2 ** np.linspace(0, top, n_dilations)).astype(int)
        dilations, repeats = np.unique(raw, return_counts=True)
        per_dilation = repeats * (per_kernel // n_dilations)
        per_dilation[: per_kernel % n_dilations] += 1  # (n_d,) biases of each (kernel, dilation)
        weights = self.weights.double()
        self.dilations, self.padded, self.channels, self.biases = [], [], [], []
        offset = 0
        for i, (dilation, n_b) in enumerate(zip(dilations.tolist(), per_dilation.tolist(), strict=True)):
            padded = (np.arange(len(TAPS_AT_TWO)) + i) % 2 == 0
            chosen = np.zeros((D, len(TAPS_AT_TWO)))
            for k in range(len(TAPS_AT_TWO)):
                n_ch = int(rng.integers(1, min(D, KERNEL_LENGTH) + 1))
                chosen[rng.choice(D, n_ch, replace=False), k] = 1.0
            channels = torch.tensor(chosen)
            biases = torch.zeros(len(TAPS_AT_TWO), n_b, dtype=torch.float64)
            levels = quantile_levels(n_b, offset)
            offset += n_b
            for k in range(len(TAPS_AT_TWO)):
                s = int(rng.integers(S))
                out, ok = _convolve(x[s : s + 1].double(), valid[s : s + 1], weights[k : k + 1], dilation,
                                    bool(padded[k]), channels[:, k : k + 1])  # fmt: skip
                values = out[0, 0][ok[0, 0]]
                values = values if len(values) else out[0, 0]
                biases[k] = torch.tensor(np.quantile(values.numpy(), levels))
            self.dilations.append(int(dilation))
            self.padded.append(padded)
            self.channels.append(channels.float())
            self.biases.append(biases)
        return self

    def layout(self) -> tuple[list[int], list[int]]:
        """What the fit chose that shapes its tensors: the dilations and each one's number of biases."""
        return list(self.dilations), [int(b.shape[1]) for b in self.biases]

    def fitted_tensors(self) -> dict[str, torch.Tensor]:
        """The fit's draws as tensors: channels `(n_d, D, 84)`, biases `(F,)` in feature order."""
        return {
            "channels": torch.stack(self.channels),
            "biases": torch.cat([b.flatten() for b in self.biases]),
        }

    def restore(self, layout: tuple[list[int], list[int]], tensors: dict[str, torch.Tensor]):
        """The fitted transform again from `layout()` and `fitted_tensors()` (a model folder's)."""
        dilations, n_biases = layout
        self.dilations = [int(d) for d in dilations]
        self.padded = [(np.arange(len(TAPS_AT_TWO)) + i) % 2 == 0 for i in range(len(dilations))]
        self.channels = list(tensors["channels"].float().unbind(0))
        sizes = [len(TAPS_AT_TWO) * int(n) for n in n_biases]
        flat = tensors["biases"].double().split(sizes)
        self.biases = [b.reshape(len(TAPS_AT_TWO), int(n)) for b, n in zip(flat, n_biases, strict=True)]
        return self

    def forward(self, x: torch.Tensor, valid: torch.Tensor, chunk: int = 64) -> torch.Tensor:
        """x (S, T, D), valid (S, T) -> (S, F) features in x's dtype, `chunk` series at a time."""
        if not self.fitted:
            raise RuntimeError("RandomDilatedKernels: call fit(x, valid) on training series first")
        parts = []
        for start in range(0, len(x), chunk):
            xs, vs = x[start : start + chunk], valid[start : start + chunk]
            features = []
            for dilation, padded, channels, biases in self._per_dilation():
                ppv = torch.zeros(len(xs), *biases.shape, dtype=xs.dtype)  # (B, 84, n_b)
                for pad_kind in (True, False):
                    ks = torch.as_tensor(np.flatnonzero(padded == pad_kind))
                    out, ok = _convolve(xs, vs, self.weights[ks], dilation, pad_kind, channels[:, ks])
                    if ok.shape[-1] == 1 and not ok.any():
                        continue  # no unpadded step fits any series of the chunk: PPV 0
                    masked = (out if bool(vs.all()) else out.masked_fill(~ok, -torch.inf)).unsqueeze(2)
                    above = masked > biases[ks].to(out.dtype).unsqueeze(0).unsqueeze(-1)  # (B, k, n_b, T')
                    counted = above.view(torch.uint8).sum(-1, dtype=torch.int32)  # (B, k, n_b); no copy
                    ppv[:, ks] = counted.to(xs.dtype) / ok[:, :1].sum(-1, keepdim=True).clamp(min=1).to(
                        xs.dtype
                    )
                features.append(ppv.flatten(1))
            parts.append(torch.cat(features, dim=1))
        return torch.cat(parts)  # (S, F)

    def reference(self, x: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """The transform as loops (float64): x (S, T, D), valid (S, T) -> (S, F)."""
        weights = kernel_weights()
        rows = []
        for s in range(len(x)):
            n = int(valid[s].sum())
            series = x[s, :n]  # (n, D) the real steps
            feats = []
            for dilation, padded, channels, biases in self._per_dilation():
                for k in range(len(TAPS_AT_TWO)):
                    reach = (KERNEL_LENGTH - 1) // 2 * dilation
                    starts = range(-reach, n - reach) if padded[k] else range(n - 2 * reach)
                    outputs = []
                    for t in starts:
                        total = 0.0
                        for j in range(KERNEL_LENGTH):
                            at = t + j * dilation
                            if 0 <= at < n:
                                total += weights[k, j] * float(series[at] @ channels[:, k].numpy())
                        outputs.append(total)
                    for b in biases[k].numpy():
                        above = sum(o > b for o in outputs)
                        feats.append(above / max(len(outputs), 1))
            rows.append(feats)
        return np.array(rows)

    def _per_dilation(self):
        return zip(self.dilations, self.padded, self.channels, self.biases, strict=True)


def _convolve(x, valid, weights, dilation: int, padded: bool, channels):
    """x (B, T, D) -> outputs (B, K, T') of the K kernels `weights` (K, 9), each summed over its
    channels `channels` (D, K), and `ok` (B, K, T') True where the output step is a real one."""
    B, T, D = x.shape
    K = len(weights)
    reach = (KERNEL_LENGTH - 1) // 2 * dilation
    lengths = valid.sum(1)  # (B,)
    x = x * valid.unsqueeze(-1)  # padding steps read as zeros, as outside the series
    flat = x.permute(0, 2, 1).reshape(B * D, 1, T)
    pad = reach if padded else 0
    if not padded and T <= 2 * reach:  # no unpadded output fits: none counts
        out = torch.zeros(B, K, 1, dtype=x.dtype)
        return out, torch.zeros(B, K, 1, dtype=torch.bool)
    per_channel = torch.nn.functional.conv1d(flat, weights.to(x.dtype).unsqueeze(1), padding=pad,
                                             dilation=dilation)  # fmt: skip
    per_channel = per_channel.reshape(B, D, K, -1)  # (B, D, K, T')
    out = torch.einsum("bdkt,dk->bkt", per_channel, channels.to(x.dtype))
    steps = torch.arange(out.shape[-1])
    last = lengths.unsqueeze(-1) if padded else lengths.unsqueeze(-1) - 2 * reach  # (B, 1)
    ok = (steps.unsqueeze(0) < last).unsqueeze(1).expand(B, K, -1)
    return out, ok
