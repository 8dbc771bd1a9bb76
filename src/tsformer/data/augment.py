"""Training-set augmentation for labelled sequences (`model.augment`): new training batches from old ones.

A few hundred labelled series are few for a network; the convolutional classifiers that lead on the
UEA/UCR archive are trained on distorted copies of them (Iwana & Uchida 2021 survey the kinds). Each
kind is named in `model.augment` (conf/model/enc_only_classifier.yaml) and off (0) by default:

- `jitter`: sigma of Gaussian noise added to every real step (the channels are standardised: 0.03 is
  3 % of a channel's spread);
- `scaling`: sigma of one factor N(1, sigma) per sample and channel;
- `shift`: the largest shift, as a share of each sample's length; each sample moves by a uniform
  number of steps in [-shift * T, shift * T]. `circular: true` wraps the steps that leave at one end
  round to the other (a leaf outline, a rotation: data with no start), else the end steps are
  repeated into the gap;
- `window_warp`: share of the length of one random window that is sped up (x2) or slowed down (x0.5),
  the sample then resampled to its own length (Le Guennec et al. 2016);
- `mixup`: alpha of Beta(alpha, alpha); each sample is mixed with another of the batch, x and the
  one-hot labels alike (Zhang et al. 2018): the batch gets `soft_label` `(B, C)`, which the loss reads.

The classification task applies them in its `training_step` only: validation and test batches are never
touched (tested). Padded steps stay 0 and each sample keeps its own length (mixup marks the steps
either sample has as real). The draws come from a generator seeded by the run's seed, so a run is
repeatable. The settings are part of the run's config, hence its params (`model/augment/...`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from tsformer.settings import SettingError


@dataclass
class Augmentation:
    jitter: float = 0.0
    scaling: float = 0.0
    shift: float = 0.0
    circular: bool = False
    window_warp: float = 0.0
    mixup: float = 0.0

    def __post_init__(self):
        for name in ("jitter", "scaling", "shift", "window_warp", "mixup"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise SettingError(f"model.augment.{name}={value}: must be a number >= 0 (0: off)")
        for name in ("shift", "window_warp"):
            if getattr(self, name) >= 1:
                raise SettingError(
                    f"model.augment.{name}={getattr(self, name)}: a share of the length, below 1"
                )

    @property
    def active(self) -> bool:
        return any(v > 0 for k, v in asdict(self).items() if k != "circular")

    def __call__(self, batch: dict, n_classes: int, rng: np.random.Generator) -> dict:
        """A padded training batch (`tsformer.data.sequences.pad_batch`) -> an augmented copy (the same
        device; the draws and the per-sample resampling are done on the CPU)."""
        device = batch["x"].device
        batch = {k: v.cpu() if torch.is_tensor(v) else v for k, v in batch.items()}
        x, valid = batch["x"].clone(), batch["valid"]  # (B, T, D), (B, T)
        lengths = valid.sum(dim=1).tolist()
        B, T, D = x.shape
        for b, n in enumerate(lengths):
            s = x[b, :n].numpy()  # (n, D), a view of the copy
            if self.window_warp > 0:
                s[:] = _window_warp(s, self.window_warp, rng)
            if self.shift > 0:
                s[:] = _shift(s, self.shift, self.circular, rng)
        if self.scaling > 0:
            x = x * torch.as_tensor(rng.normal(1.0, self.scaling, (B, 1, D)), dtype=x.dtype)
        if self.jitter > 0:
            x = x + torch.as_tensor(rng.normal(0.0, self.jitter, (B, T, D)), dtype=x.dtype)
        x = x * valid.unsqueeze(-1).to(x.dtype)  # padding stays 0
        out = batch | {"x": x}
        if self.mixup > 0:
            out = _mixup(out, self.mixup, n_classes, rng)
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in out.items()}


def _shift(s: np.ndarray, share: float, circular: bool, rng) -> np.ndarray:
    n = len(s)
    k = int(rng.integers(-int(share * n), int(share * n) + 1))
    if k == 0:
        return s
    if circular:
        return np.roll(s, k, axis=0)
    index = np.clip(np.arange(n) - k, 0, n - 1)  # the end steps repeated into the gap
    return s[index]


def _window_warp(s: np.ndarray, share: float, rng) -> np.ndarray:
    n = len(s)
    w = max(2, round(share * n))
    if n < 4 or w >= n:
        return s
    start = int(rng.integers(0, n - w + 1))
    factor = float(rng.choice([0.5, 2.0]))
    t = np.arange(n, dtype=np.float64)
    inside = np.linspace(start, start + w - 1, max(2, round(w * factor)))
    warped_t = np.concatenate([t[:start], inside, t[start + w :]])  # the window's steps, resampled
    warped = np.stack([np.interp(warped_t, t, s[:, d]) for d in range(s.shape[1])], axis=1)
    back = np.linspace(0, len(warped_t) - 1, n)  # back to n steps
    idx = np.arange(len(warped_t), dtype=np.float64)
    return np.stack([np.interp(back, idx, warped[:, d]) for d in range(s.shape[1])], axis=1)


def _mixup(batch: dict, alpha: float, n_classes: int, rng) -> dict:
    B = len(batch["label"])
    lam = torch.as_tensor(rng.beta(alpha, alpha, B), dtype=batch["x"].dtype)  # (B,)
    partner = torch.as_tensor(rng.permutation(B))
    one_hot = torch.nn.functional.one_hot(batch["label"], n_classes).to(batch["x"].dtype)  # (B, C)
    x = lam[:, None, None] * batch["x"] + (1 - lam[:, None, None]) * batch["x"][partner]
    soft = lam[:, None] * one_hot + (1 - lam[:, None]) * one_hot[partner]
    return batch | {"x": x, "valid": batch["valid"] | batch["valid"][partner], "soft_label": soft}
