"""Anomaly detectors: a window task trained on normal rows that scores every row of a table and each of
its channels (`tsformer.jobs.anomaly.job`, docs/anomaly.md). Two methods, each a task of its family:

- `MaskedAnomalyDetector` (`model=enc_only_anomaly`: masked fill-in, the encoder-only family trained
  the BERT way): windows of `context_len` steps every `stride` steps; in each window every value is
  hidden once in a run of `run_length` steps (`n_masks` interleaved masks: value (t, c) is hidden by
  mask ((t // run_length) + c) mod n_masks) and, with `channel_out`, each channel is hidden over the
  first half of the window and then over the second half, restored from the other channels and its
  own other half (a stuck or drifting sensor that its own neighbours would "explain", or a changed
  relation between two sensors, shows against what the rest of the window says it should read).
  Training hides geometric runs (`mask_ratio`, `mask_mean_length`) and, in half of the windows, one
  channel over a block of N/4 to N steps: what scoring asks of the model. A value's error is the mean
  over every window covering it, per kind of mask.
- `ForecastAnomalyDetector` (`model=dec_only_anomaly`: the decoder-only family with its Gaussian head,
  one step ahead, `horizon` 1): step t is predicted from the `context_len` rows before it alone (the
  first rows of a series from the rows they have), and its surprise is the squared standardised
  residual ((y - mean) / sd)^2 of each channel, the part of the negative log likelihood that does not
  depend on how noisy the sensor is. A score never uses a later row (streaming). The first row of a
  series has no past: its score is 0.

Each kind of error (masked: the runs and the channel halves; forecast: the surprise) of each channel
is divided by its 99th percentile on the validation rows (`calibrate`: 1 is a channel's 1-in-100 error
of that kind on normal rows, whatever its units, noise and tails); the larger kind is the channel's
contribution, and the score of a row is the mean of its channels' contributions. `calibrate` also sets
the alarms' threshold at `false_alarm_rate` of the validation rows' scores (`tasks.alarms`). Values
enter standardised by the train rows' mean and sd per channel (`set_standardisation`), never per window.

The test (after the fit, on the best checkpoint) calibrates on the data's validation rows and logs
`test/loss`, the training loss on the judged rows' windows (fixed masks), and `test/threshold`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from tsformer.data.anomaly import check_table, series_rows
from tsformer.nn.masking import draw_mask
from tsformer.tasks.alarms import EventRule, calibrate_threshold
from tsformer.tasks.forecasting import DecoderOnlyForecaster
from tsformer.tasks.masked import SPLIT_SEED_OFFSET, MaskedFillIn

ERROR_QUANTILE = 0.99  # a channel's error is measured in its validation rows' 99th percentile
# floor of a channel's validation error (squared, in train sd): smaller errors count as none
MIN_SPREAD = 1e-2
EVENT_RULE = {"k": 1, "n": 1, "merge_gap": 10, "min_duration": 1}  # `tasks.alarms.EventRule`'s defaults
CHUNK = 256  # windows per network call while scoring


@dataclass
class Scores:
    """`score (T,)` per row of the scored table (in its order), `contributions (T, C)` per channel."""

    score: np.ndarray
    contributions: np.ndarray
    channels: list[str]

    def top_channels(self, n: int = 3) -> list[list[str]]:
        """The `n` channels contributing most to each row, largest first."""
        order = np.argsort(-self.contributions, axis=1)[:, :n]  # (T, n)
        names = np.asarray(self.channels)
        return [list(names[row]) for row in order]


def covering_window_starts(n_rows: int, length: int, stride: int) -> np.ndarray:
    """Starts of windows every `stride` steps, the last one ending at the last row (every row covered)."""
    starts = np.arange(0, n_rows - length + 1, stride)
    if starts[-1] != n_rows - length:
        starts = np.append(starts, n_rows - length)
    return starts


class AnomalyScoring:
    """What both detectors share: standardising, per-channel error scales, the threshold, scoring a table
    and the test. A detector defines `n_kinds`, `series_errors` and `split_loss`."""

    n_kinds = 1

    def init_scoring(
        self, false_alarm_rate: float, events: dict | None, monitor: str, threshold_confidence: float | None
    ) -> None:

        if monitor != "val/loss":
            raise ValueError(
                f"monitor={monitor!r}: a detector is checkpointed on val/loss (its training loss)"
            )
        if not 0.0 < float(false_alarm_rate) < 1.0:
            raise ValueError(f"false_alarm_rate={false_alarm_rate}: a share of normal rows, in (0, 1)")
        if threshold_confidence is not None and not 0.0 < float(threshold_confidence) < 1.0:
            raise ValueError(f"threshold_confidence={threshold_confidence}: a probability in (0, 1), or null")
        try:  # a bad rule refused now, before any training
            EventRule(**{**EVENT_RULE, **(events or {})})
        except (TypeError, ValueError) as err:  # the rule's own check names it anomaly.events
            raise ValueError(f"events: {str(err).removeprefix('anomaly.events: ')}") from None
        C = self.hparams.d_target
        self.register_buffer("channel_loc", torch.zeros(C, dtype=torch.float64))
        self.register_buffer("channel_scale", torch.ones(C, dtype=torch.float64))
        self.register_buffer("error_scale", torch.ones(self.n_kinds, C, dtype=torch.float64))  # (K, C)
        self.register_buffer("threshold", torch.tensor(float("inf"), dtype=torch.float64))
        self.val_scores = np.zeros(0)  # the validation rows' scores: what the threshold is calibrated on
        self.val_loss = float("nan")  # the training loss on the validation windows at the best weights

    @property
    def channels(self) -> list[str]:
        return list(self.target_names)

    @property
    def window(self) -> int:
        """Rows of one window."""
        return self.hparams.context_len + self.hparams.horizon

    @property
    def event_rule(self) -> dict:
        return {**EVENT_RULE, **(self.hparams.events or {})}

    def set_standardisation(self, loc: np.ndarray, scale: np.ndarray) -> None:
        """The train rows' mean and sd per channel (`AnomalyData.loc`, `.scale`)."""
        self.channel_loc.copy_(torch.as_tensor(np.asarray(loc, dtype=np.float64)))
        self.channel_scale.copy_(torch.as_tensor(np.asarray(scale, dtype=np.float64)))

    # -- scoring ----------------------------------------------------------------------------------

    def raw_errors(self, table: pd.DataFrame) -> np.ndarray:
        """Each row's raw error per kind of error and channel `(K, T, C)`, in the table's row order."""
        loc, scale = self.channel_loc.cpu().numpy(), self.channel_scale.cpu().numpy()
        values = ((table[self.channels].to_numpy(dtype=np.float32) - loc) / scale).astype(np.float32)
        out = np.zeros((self.n_kinds, len(table), len(self.channels)))
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():
                for rows in series_rows(table).values():
                    out[:, rows] = self.series_errors(values[rows])
        finally:
            self.train(was_training)
        return out

    def series_errors(self, values: np.ndarray) -> np.ndarray:
        """`(K, T, C)` raw errors of one series' standardised values `(T, C)`."""
        raise NotImplementedError

    def score(self, table: pd.DataFrame, what: str = "table") -> Scores:
        """Every row's score and its channels' contributions; a table it cannot score is one line."""
        check_table(table, self.channels, self.window, what)
        return self.scores_of(self.raw_errors(table))

    def scores_of(self, raw: np.ndarray) -> Scores:
        """`Scores` of raw errors `(K, T, C)`: each kind of error in its 1-in-100 validation error, the
        largest kind a channel's contribution `(T, C)`, their mean the row's score."""
        contributions = (raw / self.error_scale.cpu().numpy()[:, None, :]).max(axis=0)
        return Scores(contributions.mean(axis=1), contributions, self.channels)

    def calibrate(self, val: pd.DataFrame) -> np.ndarray:
        """Each channel's usual error (`error_scale`) and the threshold from the held-out normal rows
        `val`; returns their scores."""
        check_table(val, self.channels, self.window, "validation rows")
        raw = self.raw_errors(val)  # (K, T_val, C)
        scale = np.maximum(np.quantile(raw, ERROR_QUANTILE, axis=1), MIN_SPREAD)  # (K, C)
        self.error_scale.copy_(torch.as_tensor(scale))
        self.val_scores = self.scores_of(raw).score
        # with `threshold_confidence`, the estimate's upper bound over blocks of one window (scores of
        # neighbouring rows share windows): fewer false alarms, at the cost of faint faults
        confidence = self.hparams.get("threshold_confidence")
        rate = float(self.hparams.false_alarm_rate)
        threshold = calibrate_threshold(self.val_scores, rate, confidence=confidence, block=self.window)
        self.threshold.fill_(threshold)
        return self.val_scores

    # -- Lightning hooks of the test --------------------------------------------------------------

    def split_loss(self, batch: dict, split: str) -> torch.Tensor:
        raise NotImplementedError

    def on_test_start(self) -> None:
        self.calibrate(self.trainer.datamodule.tables["val"])

    def test_step(self, batch: dict, batch_idx: int) -> None:
        B = batch["hist_target"].shape[0]
        self.log("test/loss", self.split_loss(batch, "test"), batch_size=B)

    def on_test_epoch_end(self) -> None:
        self.log("test/threshold", float(self.threshold))


class MaskedAnomalyDetector(AnomalyScoring, MaskedFillIn):
    """The masked method (module docstring): `tasks.masked.MaskedFillIn` with the detector's masks."""

    method = "masked"

    def __init__(
        self,
        *args,
        channel_out: bool = True,
        n_masks: int = 5,
        run_length: int = 4,
        stride: int = 8,
        false_alarm_rate: float = 0.001,
        threshold_confidence: float | None = None,
        events: dict | None = None,
        monitor: str = "val/loss",  # what checkpoints and early stopping follow (conf/callbacks reads it)
        **kwargs,  # and `MaskedFillIn`'s
    ):
        super().__init__(*args, **kwargs)
        for name, value in (("n_masks", n_masks), ("run_length", run_length), ("stride", stride)):
            if int(value) < 1:
                raise ValueError(f"{name}={value}: at least 1")
        self.n_kinds = 2 if channel_out else 1
        self.init_scoring(false_alarm_rate, events, monitor, threshold_confidence)

    def hidden_mask(
        self, shape: tuple[int, int, int], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A training mask `(B, N, C)`: geometric runs and, in half the windows (with `channel_out`), one
        channel hidden over a block of N/4..N steps."""
        B, N, C = shape
        hidden = draw_mask(shape, self.masking.config, generator)  # (B, N, C)
        if not self.hparams.channel_out:
            return hidden
        channel = torch.randint(C, (B,), generator=generator)
        length = torch.randint(N // 4, N + 1, (B,), generator=generator)
        start = (torch.rand(B, generator=generator) * (N - length + 1)).long()
        steps = torch.arange(N).unsqueeze(0)  # (1, N)
        in_block = (steps >= start.unsqueeze(1)) & (steps < (start + length).unsqueeze(1))  # (B, N)
        picked = torch.rand(B, generator=generator) < 0.5
        block = (in_block & picked.unsqueeze(1)).unsqueeze(2) & (
            torch.arange(C) == channel.unsqueeze(1)
        ).unsqueeze(1)
        return hidden | block  # (B, N, C)

    def split_masks(self, split: str) -> torch.Tensor:
        """The fixed masks `(W, N, C)` of every window of a split, drawn as in training."""
        if split not in self._eval_masks:
            hp = self.hparams
            generator = torch.Generator().manual_seed(hp.eval_mask_seed * 2 + SPLIT_SEED_OFFSET[split])
            n_windows = self.trainer.datamodule.n_windows(split)
            self._eval_masks[split] = self.hidden_mask((n_windows, hp.context_len, hp.d_target), generator)
        return self._eval_masks[split]

    def masked_batch(self, batch: dict, split: str | None) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """`(batch, hidden, scored)`: every hidden value is scored (the table has no empty cell)."""
        values = batch["hist_target"]
        if split is None:
            hidden = self.hidden_mask(tuple(values.shape)).to(values.device)
        else:
            hidden = self.split_masks(split)[batch["window"].cpu()].to(values.device)
        return batch | {"hidden": hidden}, hidden, hidden

    def split_loss(self, batch: dict, split: str) -> torch.Tensor:
        return self.masked_loss_of(*self.masked_batch(batch, split))

    def scoring_masks(self) -> list[torch.Tensor]:
        """The masks `(N, C)` each window is restored under: interleaved runs, then each channel alone."""
        hp = self.hparams
        N, C = hp.context_len, hp.d_target
        phase = (torch.arange(N).unsqueeze(1) // hp.run_length + torch.arange(C).unsqueeze(0)) % hp.n_masks
        masks = [phase == k for k in range(hp.n_masks)]
        if hp.channel_out:  # each channel's first half, then its second half, restored from the rest
            first = (torch.arange(N) < N // 2).unsqueeze(1)  # (N, 1)
            for c in range(C):
                channel = (torch.arange(C) == c).unsqueeze(0)  # (1, C)
                masks += [first & channel, ~first & channel]
        return [m.to(self.device) for m in masks]

    def series_errors(self, values: np.ndarray) -> np.ndarray:
        hp = self.hparams
        T, C = values.shape
        N = hp.context_len
        starts = covering_window_starts(T, N, hp.stride)
        windows = torch.from_numpy(np.stack([values[a : a + N] for a in starts])).to(self.device)  # (W, N, C)
        masks = self.scoring_masks()
        kinds = [masks[: hp.n_masks], masks[hp.n_masks :]] if hp.channel_out else [masks]
        total = np.zeros((len(kinds), T, C))
        for k, kind in enumerate(kinds):  # runs, channels out: each value hidden once per kind and window
            err = torch.zeros_like(windows)  # (W, N, C)
            for chunk in torch.split(torch.arange(len(windows), device=self.device), CHUNK):
                x = windows[chunk]
                empty = x[..., :0]
                batch = {"hist_target": x, "hist_known": empty, "hist_observed": empty}
                for mask in kind:
                    hidden = mask.expand_as(x)
                    restored = self.restore(batch, hidden)  # (b, N, C)
                    err[chunk] += torch.where(hidden, (restored - x) ** 2, 0.0)
            err = err.double().cpu().numpy()
            summed, count = np.zeros((T, C)), np.zeros((T, 1))
            for w, a in enumerate(starts):  # every window covering a step: the mean
                summed[a : a + N] += err[w]
                count[a : a + N] += 1
            total[k] = summed / count
        return total  # (K, T, C)


class ForecastAnomalyDetector(AnomalyScoring, DecoderOnlyForecaster):
    """The forecast method (module docstring): `tasks.forecasting.DecoderOnlyForecaster` with a Gaussian
    head, one step ahead; its training loss is the family's own (teacher-forced negative log likelihood)."""

    method = "forecast"

    def __init__(
        self,
        *args,
        false_alarm_rate: float = 0.001,
        threshold_confidence: float | None = None,
        events: dict | None = None,
        monitor: str = "val/loss",
        head: dict | None = None,
        **kwargs,  # and `DecoderOnlyForecaster`'s
    ):
        kind = (head or {}).get("kind", "point")
        if kind not in ("point", "gaussian"):
            raise ValueError(
                f"head={kind}: the forecast detector's head is Gaussian (head=gaussian, or the default head=point)"
            )
        head = {"kind": "gaussian"} if kind == "point" else dict(head)  # the point head: the group's default
        super().__init__(*args, head=head, **kwargs)
        if self.hparams.horizon != 1:
            raise ValueError(
                f"horizon={self.hparams.horizon}: the forecast detector predicts one step ahead (1)"
            )
        self.init_scoring(false_alarm_rate, events, monitor, threshold_confidence)

    def split_loss(self, batch: dict, split: str) -> torch.Tensor:
        return self.loss(batch)

    def step_params(self, values: torch.Tensor) -> torch.Tensor:
        """One-step-ahead Gaussian `(B, L - 1, C, 2)` of steps 1..L-1 of windows `(B, L, C)`."""
        return self.head.params(self.net(values[:, :-1]))

    def series_errors(self, values: np.ndarray) -> np.ndarray:
        T, C = values.shape
        L = self.window  # the rows before a step, and it
        x = torch.from_numpy(values).to(self.device)
        out = np.zeros((T, C))
        first = x[None, :L]  # (1, L, C): steps 1..L-1 from the rows before them
        out[1:L] = self.surprise(self.step_params(first), first[:, 1:])[0]
        ends = np.arange(L, T)  # every later step: the window of the L - 1 rows before it, and it
        for chunk in np.array_split(ends, max(1, -(-len(ends) // CHUNK))):
            if len(chunk) == 0:
                continue
            windows = torch.stack([x[e - L + 1 : e + 1] for e in chunk])  # (b, L, C)
            params = self.step_params(windows)[:, -1:]  # (b, 1, C, 2): the last step only
            out[chunk] = self.surprise(params, windows[:, -1:])[:, 0]
        return out[None]  # (1, T, C): one kind of error

    @staticmethod
    def surprise(params: torch.Tensor, target: torch.Tensor) -> np.ndarray:
        """Squared standardised residual `(B, T, C)` of `target (B, T, C)` under the Gaussians."""
        return (((target - params[..., 0]) / params[..., 1]) ** 2).double().cpu().numpy()


DETECTORS = {cls.method: cls for cls in (MaskedAnomalyDetector, ForecastAnomalyDetector)}
