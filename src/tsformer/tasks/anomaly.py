"""Anomaly detectors: a window task trained on normal rows that scores windows of a table, and from them
every row and each of its channels (`tsformer.jobs.anomaly`, docs/anomaly.md).

Every score is a score of windows, split over the window's rows and channels (each row's own error in
the window; `contributions` sum to the score). `row_score` says how a row gets its score from the
windows every `stride` rows (`data.window_scores`):
- `window`: the mean of the scores of the windows that cover it (a window's score: the mean over its
  rows), or, with `causal`, of the windows that end at or before it within a window's length;
- `own`: the mean of its own part in each window that covers it, or, with `causal`, its part in the
  window that ends at it (never a later row);
- `value` (how issue 34's detectors scored, and their model folders still read): each value's raw
  error is averaged over the windows covering it, then scaled (the score does not sum over a window).
The channels with the largest contributions are a row's top channels. State channels (`state_channels`: every train value 0 or 1, `data.anomaly`) enter as they
are, are never hidden nor forecast, and are not scored by restoration or forecast; known inputs
(`known_channels`) enter z-scored, never hidden nor scored: they condition. Constant channels
(`constant_channels`: one value in the train rows) enter at it; each row's departure from it is added to
its score in every score kind (`departures`). With no measured channel, a masked detector scores by its
memory (a table of states and constants is never refused).

`MaskedAnomalyDetector` (`model=enc_only_anomaly`), the encoder-only family trained by masked fill-in
(BERT's cloze task on normal windows: geometric runs of values hidden and, in half of the windows, one
channel over a block of N/4..N steps), `model.score`:
- `memory`: the encoder's output tokens of a window, flattened, are its embedding; the embeddings of
  every window of the normal rows are kept (a greedy k-centre coreset of `memory_size` windows when
  there are more), with the rows they come from. A window's score is its mean distance to its
  `n_neighbours` nearest kept windows; a channel's share is its share of the squared difference
  between the window's values and those of the nearest kept window.
- `restoration`: every value of a window hidden once in a run of `run_length` steps (`n_masks`
  interleaved masks) and, with `channel_out`, each scored channel hidden over the first and then the
  second half of the window; each kind of squared error divided by its `ERROR_QUANTILE` on the
  validation rows (floored at `ERROR_FLOOR` times the median over the channels: a channel flat in the
  validation rows is not weighted up without end), the larger kind a value's error; a window's
  contribution of a channel is the mean of its errors over the window, divided by the scored channels.
- `hybrid`: the mean over memory and restoration of log(1 + part / its median on the validation
  rows), a rule fixed in advance; each part's row scores are kept beside it (`Scores.parts`).
- `restoration+window_memory`: restoration beside the memory of raw windows (`window_memory`: as
  `memory`, the window's standardised values themselves in place of its embedding, known inputs left
  out; the benchmarks' window-memory peer at the detector's stride, in float32, a coreset of
  `memory_size`); each part divided by its `PART_QUANTILE` on the validation rows (their distances to
  the train rows' windows alone), restoration to the power `restoration_power` (0.5: its square root),
  and the two averaged.

`ForecastAnomalyDetector` (`model=dec_only_anomaly`, `model.score=forecast`): the decoder-only family
with a Gaussian head predicts each step from the `context_len` rows before it alone; a step's surprise
per channel is its squared standardised residual ((y - mean) / sd)^2, divided by its validation
quantile as above; a window of `score_window` steps scores the mean of its steps' surprises. The first
row of a series has no past: its surprise is 0.

Values enter standardised by the train rows' mean and sd (`set_standardisation`), never per window.
`prepare_scoring(train, val)` (the test's start) builds the memory from the train rows, calibrates on
the validation rows (the error scales, the hybrid's medians, the threshold at `false_alarm_rate` of
their scores, `tasks.alarms`), then adds the validation rows' windows to the memory (the
validation windows' distances were measured to the train rows' windows alone: a window is never its
own neighbour). The test logs `test/loss`, the training loss on the judged rows' windows side by side, and
`test/threshold`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from tsformer.data.anomaly import check_table, series_rows
from tsformer.data.window_scores import (
    causal_rows_of_windows,
    covering_window_starts,
    rows_of_window_rows,
    rows_of_windows,
)
from tsformer.nn.attention import SelfAttention
from tsformer.nn.embedding import InputProjection
from tsformer.nn.masking import draw_mask, interpolate
from tsformer.nn.patching import step_positions
from tsformer.tasks.alarms import DriftRule, EventRule, calibrate_threshold
from tsformer.tasks.forecasting import DecoderOnlyForecaster
from tsformer.tasks.masked import SPLIT_SEED_OFFSET, MaskedFillIn

ERROR_QUANTILE = 0.99  # a channel's error is measured in its validation rows' 99th percentile
DEPARTURE_UNIT = 1.0  # a constant channel's departure of its size (1 below 1) is one unit ...
DEPARTURE_QUANTILE = 0.99  # ... which scores as the validation rows' 99th percentile score (each part's)
ERROR_FLOOR = 0.5  # ... and at least this share of the median of the scored channels' (relative floor)
EVENT_RULE = {"k": 1, "n": 1, "merge_gap": 10, "min_duration": 1}  # `tasks.alarms.EventRule`'s defaults
HYBRID_PARTS = ("memory", "restoration")
# restoration beside the memory of raw windows (issue 57): each part over its validation rows'
# `PART_QUANTILE`, restoration through its square root (squared errors on the footing of distances), averaged
WINDOW_COMBINATION = "restoration+window_memory"
WINDOW_PARTS = ("restoration", "window_memory")
PART_QUANTILE = 0.99
RESTORATION_POWER = 0.5  # restoration's normalised score to this power in the combination
# a row's score: its covering windows' scores, its own part in them, or (issue 34's folders) each of its
# values' raw errors over the covering windows, scaled after
ROW_SCORES = ("window", "own", "value")
THRESHOLD_ROWS = ("validation", "normal")  # the rows the threshold is read from (`threshold_rows`)
CHUNK = 256  # windows per network call while scoring
PROJECTION = 128  # dimensions of the random projection the coreset is chosen in


@dataclass
class Scores:
    """`score (T,)` per row of the scored table (in its order), `contributions (T, C)` per channel
    (summing to the score), and each part's row score of a hybrid (`parts`, empty otherwise)."""

    score: np.ndarray
    contributions: np.ndarray
    channels: list[str]
    parts: dict[str, np.ndarray] = field(default_factory=dict)

    def top_channels(self, n: int = 3) -> list[list[str]]:
        """The `n` channels contributing most to each row, largest first ("" for one adding nothing)."""
        return [list(row) for row in ranked_channels(self.contributions, self.channels, n)]


def ranked_channels(contributions: np.ndarray, channels: list[str], n: int) -> np.ndarray:
    """`(..., n)` the names of the `n` channels contributing most to each row of `contributions`
    `(..., C)`, largest first, and "" in place of a channel whose contribution is 0: a known input (never
    scored) is not named as a sensor to look at because it ranks next after the scored ones."""
    order = np.argsort(-contributions, axis=-1)[..., :n]  # (..., n)
    adds = np.take_along_axis(contributions, order, axis=-1) > 0
    return np.where(adds, np.asarray(channels, dtype=object)[order], "")


def chosen_part(parts: dict[str, np.ndarray]) -> str:
    """`model.score=auto`'s choice between the memory and restoration from their row contributions
    `(T, C)` on the validation rows (normal rows, no label): the part whose normal rows' scores are the
    most concentrated, the smallest ratio of their 99th percentile to their median (restoration's
    squared errors through their square root, on the footing of the memory's distances); restoration on a
    tie. Fixed before any run (issue 49, point 7)."""
    ratios = {}
    for name in ("restoration", "memory"):
        score = parts[name].sum(axis=1)
        score = np.sqrt(score) if name == "restoration" else score
        ratios[name] = np.quantile(score, 0.99) / max(float(np.median(score)), 1e-12)
    return "memory" if ratios["memory"] < ratios["restoration"] else "restoration"


def relative_floor(quantiles: np.ndarray, scored: np.ndarray) -> np.ndarray:
    """Error scales `(K, C)`: each kind's per-channel quantiles, at least `ERROR_FLOOR` times their
    median over the scored channels (1 where nothing is scored)."""
    if not scored.any():
        return np.ones_like(quantiles)
    floor = ERROR_FLOOR * np.median(quantiles[:, scored], axis=1, keepdims=True)  # (K, 1)
    return np.maximum(quantiles, np.maximum(floor, 1e-12))


class AnomalyScoring:
    """What both detectors share: standardising, state channels, window scores back to rows, the
    hybrid's combination, the threshold and the test. A detector defines `scores` (the score names it
    offers), `window_length`, `stride`, `window_parts`, `calibrate_errors` and `split_loss`."""

    scores: tuple[str, ...] = ()
    n_kinds = 1  # kinds of error with their own scale (`error_scale`)

    def init_scoring(
        self,
        score: str,
        false_alarm_rate: float,
        events: dict | None,
        monitor: str,
        threshold_confidence: float | None,
        state_channels: list[str] | None,
        constant_channels: list[str] | None = None,
    ) -> None:

        if score not in self.scores:
            raise ValueError(f"score={score!r}: {type(self).__name__} scores by one of {list(self.scores)}")
        if self.hparams.row_score not in ROW_SCORES:
            raise ValueError(f"row_score={self.hparams.row_score!r}: one of {list(ROW_SCORES)}")
        if monitor != "val/loss":
            raise ValueError(
                f"monitor={monitor!r}: a detector is checkpointed on val/loss (its training loss)"
            )
        if not float(self.hparams.get("departure_unit", DEPARTURE_UNIT)) > 0.0:
            raise ValueError(
                f"departure_unit={self.hparams.departure_unit}: a share of a constant's size, above 0"
            )
        if not 0.0 < float(false_alarm_rate) < 1.0:
            raise ValueError(f"false_alarm_rate={false_alarm_rate}: a share of normal rows, in (0, 1)")
        if threshold_confidence is not None and not 0.0 < float(threshold_confidence) < 1.0:
            raise ValueError(f"threshold_confidence={threshold_confidence}: a probability in (0, 1), or null")
        if self.threshold_rows not in THRESHOLD_ROWS:
            raise ValueError(f"threshold_rows={self.threshold_rows!r}: one of {list(THRESHOLD_ROWS)}")
        try:  # a bad drift rule refused now, before any training
            DriftRule(**(self.hparams.get("threshold_drift") or {}))
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"threshold_drift: {str(err).removeprefix('anomaly.threshold_drift: ')}"
            ) from None
        try:  # a bad rule refused now, before any training
            EventRule(**{**EVENT_RULE, **(events or {})})
        except (TypeError, ValueError) as err:  # the rule's own check names it anomaly.events
            raise ValueError(f"events: {str(err).removeprefix('anomaly.events: ')}") from None
        known_channels = self.hparams.get("known_channels") or []
        kinds = (("state_channels", state_channels), ("constant_channels", constant_channels),
                 ("known_channels", known_channels))  # fmt: skip
        for name, listed in kinds:
            unknown = sorted(set(listed or []) - set(self.channels))
            if unknown:
                raise ValueError(f"{name}: {unknown} are not channels of the model ({self.channels})")
        for (name, listed), (other, others) in [
            (kinds[1], kinds[0]),
            (kinds[2], kinds[0]),
            (kinds[2], kinds[1]),
        ]:
            both = sorted(set(listed or []) & set(others or []))
            if both:
                raise ValueError(f"{name}: {both} are {other} too; a channel is one kind")
        self.is_state = np.isin(self.channels, state_channels or [])  # (C,)
        self.is_constant = np.isin(self.channels, constant_channels or [])  # (C,)
        self.is_known = np.isin(self.channels, known_channels)  # (C,): conditions, never hidden nor scored
        if self.threshold_rows == "normal" and self.remembers:
            what = (
                f"score={score}" if self.is_scored.any() else "a table of states and constants (the memory)"
            )
            raise ValueError(
                f"threshold_rows='normal' with {what}: the train rows' windows are in the memory of normal "
                "windows (each its own neighbour), so their scores say nothing; use threshold_rows=validation"
            )
        C = self.hparams.d_target
        self.register_buffer("channel_loc", torch.zeros(C, dtype=torch.float64))
        self.register_buffer("channel_scale", torch.ones(C, dtype=torch.float64))
        self.register_buffer("error_scale", torch.ones(self.n_kinds, C, dtype=torch.float64))  # (K, C)
        n_parts = len(HYBRID_PARTS) if score == "auto" else len(self.parts)
        self.register_buffer("part_median", torch.ones(n_parts, dtype=torch.float64))  # hybrid's
        self.register_buffer("threshold", torch.tensor(float("inf"), dtype=torch.float64))
        self.val_scores = np.zeros(0)  # the validation rows' scores: what the threshold is calibrated on

    @property
    def channels(self) -> list[str]:
        return list(self.target_names)

    @property
    def is_scored(self) -> np.ndarray:
        """`(C,)` bool: the measured channels, those restoration and forecast score (not the states, not
        the known inputs, which condition, not the constants, whose departures score apart)."""
        return ~self.is_state & ~self.is_constant & ~self.is_known

    @property
    def parts(self) -> tuple[str, ...]:
        """The scores a row's score is made of (the hybrid's two, else the score itself). With no
        measured channel, nothing is restored: a detector with a memory scores by the memory alone (a
        table of states and constants is scored, never refused)."""
        if not self.is_scored.any() and "memory" in self.scores:
            return ("window_memory",) if self.hparams.score == WINDOW_COMBINATION else ("memory",)
        if self.hparams.score == "auto":  # both until the validation rows choose one (`chosen_part`)
            chosen = self.hparams.get("chosen_score")
            return (chosen,) if chosen else HYBRID_PARTS
        if self.hparams.score == WINDOW_COMBINATION:
            return WINDOW_PARTS
        return HYBRID_PARTS if self.hparams.score == "hybrid" else (self.hparams.score,)

    @property
    def remembers(self) -> bool:
        """Whether a part scores by the memory (of embeddings or of raw windows)."""
        return bool({"memory", "window_memory"} & set(self.parts))

    @property
    def window(self) -> int:
        """Rows of one network window (the least a series must hold)."""
        return self.hparams.context_len + self.hparams.horizon

    @property
    def window_length(self) -> int:
        """Rows of one scored window."""
        raise NotImplementedError

    @property
    def stride(self) -> int:
        """Rows between the scored windows of a whole table."""
        raise NotImplementedError

    @property
    def event_rule(self) -> dict:
        return {**EVENT_RULE, **(self.hparams.events or {})}

    @property
    def state_names(self) -> list[str]:
        return [c for c, state in zip(self.channels, self.is_state, strict=True) if state]

    @property
    def constant_names(self) -> list[str]:
        return [c for c, constant in zip(self.channels, self.is_constant, strict=True) if constant]

    @property
    def known_names(self) -> list[str]:
        return [c for c, known in zip(self.channels, self.is_known, strict=True) if known]

    def set_standardisation(self, loc: np.ndarray, scale: np.ndarray) -> None:
        """The train rows' mean and sd per channel (`AnomalyData.loc`, `.scale`: 0 and 1 for states)."""
        self.channel_loc.copy_(torch.as_tensor(np.asarray(loc, dtype=np.float64)))
        self.channel_scale.copy_(torch.as_tensor(np.asarray(scale, dtype=np.float64)))

    def standardised(self, table: pd.DataFrame | np.ndarray) -> np.ndarray:
        """`(T, C)` float32 values of `table`'s channels (or of those values `(T, C)` themselves),
        standardised by the train rows; a constant channel at its train value (0): its departures are
        scored apart (`departures`)."""
        loc, scale = self.channel_loc.cpu().numpy(), self.channel_scale.cpu().numpy()
        raw = self._channel_values(table, np.float32)
        values = ((raw - loc) / scale).astype(np.float32)
        values[:, self.is_constant] = 0.0
        return values

    def departures(self, table: pd.DataFrame | np.ndarray) -> np.ndarray:
        """`(T, C)`: each constant channel's departure from its train value, in units of
        `departure_unit` of its size (of 1 when smaller); 0 on the other channels. A row's own
        departure only: it reads no other row."""
        values = self._channel_values(table, np.float64)  # (T, C)
        level = self.channel_loc.cpu().numpy()  # a constant's value (its train mean)
        unit = float(self.hparams.get("departure_unit", DEPARTURE_UNIT)) * np.maximum(np.abs(level), 1.0)
        return np.where(self.is_constant, np.abs(values - level) / unit, 0.0)

    def _channel_values(self, table: pd.DataFrame | np.ndarray, dtype) -> np.ndarray:
        """`(T, C)` of `dtype`: the channels of a table, or values `(T, C)` already in the channels' order."""
        if isinstance(table, np.ndarray):
            return table.astype(dtype, copy=False)
        return table[self.channels].to_numpy(dtype=dtype)

    def departure_score(self, name: str) -> float:
        """What one unit of departure adds to score `name` (`"score"`, or a hybrid's part): the
        validation rows' `DEPARTURE_QUANTILE` of that score (`calibrate`), so a departure weighs as a
        large error of the detector's own scale; 1 in a folder written before (issue 49's first rule:
        a departure of `departure_unit` scored 1)."""
        return float((self.hparams.get("departure_scores") or {}).get(name, 1.0))

    def with_departures(self, scores: Scores, table: pd.DataFrame) -> Scores:
        """`scores` with the constant channels' departures added to the row score, to their channels'
        contributions and to each part's score (every score kind sees them, each on its own scale)."""
        if not self.is_constant.any():
            return scores
        away = self.departures(table)  # (T, C)
        total = away.sum(axis=1)
        parts = {name: part + total * self.departure_score(name) for name, part in scores.parts.items()}
        unit = self.departure_score("score")
        return Scores(scores.score + total * unit, scores.contributions + away * unit, scores.channels, parts)

    # -- scoring ----------------------------------------------------------------------------------

    def window_parts(self, values: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
        """Each part's contributions `(W, L, C)` of the windows of `L = window_length` rows starting at
        `starts` of one series' standardised values `(T, C)`, per row of the window and channel: their
        mean over the window's rows, summed over the channels, is the window's score."""
        raise NotImplementedError

    def to_rows(self, parts: np.ndarray, starts: np.ndarray, n_rows: int, causal: bool) -> np.ndarray:
        """Row contributions `(n_rows, C)` of window contributions `(W, L, C)` (`row_score`); with
        `value`, raw errors `(K, W, L, C)` are first averaged over the covering windows, then scaled."""
        if self.hparams.row_score == "value" and parts.ndim == 4:
            raw = np.stack([rows_of_window_rows(kind, starts, n_rows, causal) for kind in parts])  # (K, T, C)
            return self.scaled_errors(raw) / max(1, int(self.is_scored.sum()))
        if self.hparams.row_score in ("own", "value"):
            return rows_of_window_rows(parts, starts, n_rows, causal)
        to_rows = causal_rows_of_windows if causal else rows_of_windows
        return to_rows(parts.mean(axis=1), starts, parts.shape[1], n_rows)

    def row_parts(self, table: pd.DataFrame, causal: bool | None = None) -> dict[str, np.ndarray]:
        """Each part's row contributions `(T, C)` of `table` (checked), series by series."""
        causal = bool(self.hparams.causal) if causal is None else causal
        values, L = self.standardised(table), self.window_length
        out = {part: np.zeros((len(table), len(self.channels))) for part in self.parts}
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():
                for rows in series_rows(table).values():
                    starts = covering_window_starts(len(rows), L, 1 if causal else self.stride)
                    for part, windows in self.window_parts(values[rows], starts).items():
                        out[part][rows] = self.to_rows(windows, starts, len(rows), causal)
        finally:
            self.train(was_training)
        return out

    def score(self, table: pd.DataFrame, what: str = "table", causal: bool | None = None) -> Scores:
        """Every row's score and its channels' contributions; a table it cannot score is one line.
        `causal` (default: `model.causal`): each row from the windows that end at or before it."""
        check_table(table, self.channels, max(self.window, self.window_length), what)
        return self.with_departures(self.combined(self.row_parts(table, causal)), table)

    def combined(self, parts: dict[str, np.ndarray]) -> Scores:
        """`Scores` of the parts' row contributions: one part as it is; the hybrid's parts each as
        log(1 + part / its validation median), averaged, each part's log split over its channels as the
        part itself is."""
        if len(parts) == 1:
            (contributions,) = parts.values()
            return Scores(contributions.sum(axis=1), contributions, self.channels)
        if self.hparams.score == WINDOW_COMBINATION:
            return self.window_combination(parts)
        medians = self.part_median.cpu().numpy()
        total, part_scores = 0.0, {}
        for (name, contributions), median in zip(parts.items(), medians, strict=True):
            score = contributions.sum(axis=1)  # (T,)
            share = contributions / np.where(score > 0, score, 1.0)[:, None]  # (T, C)
            total = total + np.log1p(score / median)[:, None] * share / len(parts)
            part_scores[name] = score
        return Scores(total.sum(axis=1), total, self.channels, part_scores)

    def window_combination(self, parts: dict[str, np.ndarray]) -> Scores:
        """`model.score=restoration+window_memory`: the mean of (restoration / its scale) ** p and
        window_memory / its scale, each scale the part's `PART_QUANTILE` on the validation rows
        (`part_scales`, set by `calibrate`), p `restoration_power` (0.5: squared errors through their
        square root); each normalised part split over its channels as the part is."""
        scales = self.hparams.get("part_scales") or {}
        power = float(self.hparams.get("restoration_power", RESTORATION_POWER))
        total, part_scores = 0.0, {}
        for name, contributions in parts.items():
            score = contributions.sum(axis=1)  # (T,)
            share = contributions / np.where(score > 0, score, 1.0)[:, None]  # (T, C)
            normalised = score / float(scales.get(name, 1.0))
            if name == "restoration":
                normalised = normalised**power
            total = total + normalised[:, None] * share / len(parts)
            part_scores[name] = score
        return Scores(total.sum(axis=1), total, self.channels, part_scores)

    @property
    def threshold_rows(self) -> str:
        """`model.threshold_rows`: the rows the threshold is read from (folders written before it: validation)."""
        return self.hparams.get("threshold_rows", "validation")

    # -- calibration ------------------------------------------------------------------------------

    def prepare_scoring(
        self, train: pd.DataFrame, val: pd.DataFrame, normal: pd.DataFrame | None = None
    ) -> np.ndarray:
        """What scoring needs from the normal rows once the network is trained: (the memory,) the
        calibration on `val` (the threshold on `normal`, every normal row, with `threshold_rows=normal`);
        returns the validation rows' scores."""
        return self.calibrate(val, normal)

    def calibrate_errors(self, val: pd.DataFrame) -> None:
        """Each scored channel's usual error of each kind (`error_scale`) on the validation rows."""

    def calibrate(self, val: pd.DataFrame, normal: pd.DataFrame | None = None) -> np.ndarray:
        """The error scales, the hybrid's medians and the threshold from the held-out normal rows
        `val`; returns their scores. With `threshold_rows=normal` and `normal` (every normal row, train
        and validation rows in their order) given, the threshold is read from `normal`'s scores."""
        check_table(val, self.channels, max(self.window, self.window_length), "validation rows")
        self.calibrate_errors(val)
        parts = self.row_parts(val)
        if self.hparams.score == "auto" and len(parts) > 1:  # the series' own choice, no label read
            self.hparams.chosen_score = chosen_part(parts)
            parts = {self.hparams.chosen_score: parts[self.hparams.chosen_score]}
        if self.hparams.score == WINDOW_COMBINATION:  # each part's scale, of these normal rows alone
            self.hparams.part_scales = {
                name: max(float(np.quantile(p.sum(axis=1), PART_QUANTILE)), 1e-12)
                for name, p in parts.items()
            }
        elif len(parts) > 1:
            medians = [np.median(p.sum(axis=1)) for p in parts.values()]
            self.part_median.copy_(torch.as_tensor(np.maximum(medians, 1e-12)))
        combined = self.combined(parts)
        # a departure's unit: each score's 99th percentile on these normal rows (constants do not depart
        # in them), measured before the departures are added
        scores = {"score": combined.score, **combined.parts}
        self.hparams.departure_scores = {
            name: max(float(np.quantile(values, DEPARTURE_QUANTILE)), 1e-12)
            for name, values in scores.items()
        }
        self.val_scores = self.with_departures(combined, val).score
        # `threshold_rows=normal`: read from the whole normal period, not its last stretch alone (which may be
        # its quietest): rows like the judged ones, the network's training rows among them
        by_normal = normal is not None and self.threshold_rows == "normal"
        threshold_scores = self.score(normal, "normal rows").score if by_normal else self.val_scores
        # with `threshold_confidence`, the estimate's upper bound over blocks of one window (scores of
        # neighbouring rows share windows): fewer false alarms, at the cost of faint faults
        confidence = self.hparams.get("threshold_confidence")
        rate = float(self.hparams.false_alarm_rate)
        block = min(self.window_length, len(threshold_scores))
        self.threshold.fill_(calibrate_threshold(threshold_scores, rate, confidence=confidence, block=block))
        # what a drifting threshold scales by (its `level`: the median, or the tail), of the same rows
        self.hparams.val_score_median = float(np.median(threshold_scores))
        self.hparams.val_score_tail = float(DriftRule(level="tail").of(threshold_scores))
        return self.val_scores

    def scaled_errors(self, raw: np.ndarray) -> np.ndarray:
        """Raw errors `(K, ..., C)` in their kinds' validation scales, the larger kind kept `(..., C)`;
        0 on the channels not scored (states, constants)."""
        scale = self.error_scale.cpu().numpy().reshape(len(raw), -1)  # (K, C)
        out = raw[0] / scale[0]  # float64; kind by kind, not a (K, ...) copy: the same numbers
        for kind, kind_scale in zip(raw[1:], scale[1:], strict=True):
            np.maximum(out, kind / kind_scale, out=out)
        out[..., ~self.is_scored] = 0.0
        return out

    def reference_scaled_errors(self, raw: np.ndarray) -> np.ndarray:
        """`scaled_errors` in one expression (the tests' reference)."""
        scale = self.error_scale.cpu().numpy().reshape(len(raw), *(1,) * (raw.ndim - 2), -1)
        return np.where(self.is_scored, (raw / scale).max(axis=0), 0.0)

    # -- Lightning hooks of the test --------------------------------------------------------------

    def split_loss(self, batch: dict, split: str) -> torch.Tensor:
        raise NotImplementedError

    def on_test_start(self) -> None:
        datamodule = self.trainer.datamodule
        tables = datamodule.tables
        self.prepare_scoring(tables["train"], tables["val"], datamodule.normal_rows)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        B = batch["hist_target"].shape[0]
        self.log("test/loss", self.split_loss(batch, "test"), batch_size=B)

    def on_test_epoch_end(self) -> None:
        self.log("test/threshold", float(self.threshold))


class WindowMemory(torch.nn.Module):
    """The embeddings of normal windows (`keys (M, D)`), the standardised normal rows they come from
    (`rows (R, C)`) and each kept window's first row in them (`starts (M,)`); saved with the weights.
    Its sizes are the detector's `memory_windows` and `memory_rows` (the model folder's hparams), so a
    folder builds it in its shape before the weights are read."""

    def __init__(self, n_windows: int, n_rows: int, dim: int, n_channels: int):
        super().__init__()
        self.register_buffer("keys", torch.zeros(n_windows, dim))
        self.register_buffer("rows", torch.zeros(n_rows, n_channels))
        self.register_buffer("starts", torch.zeros(n_windows, dtype=torch.long))

    def replace(self, keys: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor) -> None:
        self.keys, self.rows, self.starts = keys.float(), rows.float(), starts.long()

    def nearest(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean distance to the `k` nearest keys `(Q,)`, index of the nearest `(Q,)`) of `queries (Q, D)`."""
        squared = (
            (queries**2).sum(1, keepdim=True) + (self.keys**2).sum(1) - 2 * queries @ self.keys.T
        )  # (Q, M)
        distance, index = squared.clamp_min(0).sqrt().topk(min(k, len(self.keys)), dim=1, largest=False)
        return distance.mean(dim=1), index[:, 0]

    def windows(self, index: torch.Tensor, length: int) -> torch.Tensor:
        """The kept windows' values `(Q, length, C)` of memory entries `index (Q,)`."""
        return self.rows[self.starts[index].unsqueeze(1) + torch.arange(length, device=index.device)]


def coreset(keys: torch.Tensor, size: int, seed: int = 0) -> torch.Tensor:
    """Indices of `size` of `keys (M, D)` chosen greedily, each the farthest from those chosen before
    (k-centre, in a random projection to `PROJECTION` dimensions): the kept windows cover the rest."""
    generator = torch.Generator().manual_seed(seed)
    projection = torch.randn(keys.shape[1], PROJECTION, generator=generator) / PROJECTION**0.5
    points = keys.cpu() @ projection  # (M, P)
    chosen = [0]
    distance = ((points - points[0]) ** 2).sum(1)  # (M,): to the nearest chosen
    for _ in range(size - 1):
        far = int(distance.argmax())
        chosen.append(far)
        distance = torch.minimum(distance, ((points - points[far]) ** 2).sum(1))
    return torch.tensor(sorted(chosen))


class MaskedAnomalyDetector(AnomalyScoring, MaskedFillIn):
    """The masked detector (module docstring): `tasks.masked.MaskedFillIn` with the detector's masks, a
    memory of normal windows on its encoder and the restoration of hidden values."""

    method = "masked"
    scores = ("memory", "restoration", "hybrid", "auto", WINDOW_COMBINATION)

    def __init__(
        self,
        *args,
        score: str = "restoration",
        channel_out: bool = True,
        channel_groups: int = 0,  # 0: each scored channel its own group (the folders written before)
        n_masks: int = 5,
        run_length: int = 4,
        stride: int = 4,
        row_score: str = "window",
        memory_size: int = 4096,
        n_neighbours: int = 1,
        memory_windows: int = 0,  # the memory's size once built (set by `prepare_scoring`)
        memory_rows: int = 0,
        state_channels: list[str] | None = None,
        constant_channels: list[str] | None = None,
        known_channels: list[str] | None = None,
        departure_unit: float = DEPARTURE_UNIT,
        causal: bool = False,
        false_alarm_rate: float = 0.001,
        threshold_confidence: float | None = None,
        threshold_drift: dict | None = None,
        threshold_rows: str = "validation",
        val_score_median: float | None = None,  # the threshold rows' median score (set by `calibrate`)
        val_score_tail: float | None = None,  # their (1 - TAIL_FRACTION) quantile (set by `calibrate`)
        departure_scores: dict | None = None,  # a departure unit's score per score (set by `calibrate`)
        chosen_score: str | None = None,  # score=auto: the part the validation rows chose (`calibrate`)
        part_scales: dict | None = None,  # score=restoration+window_memory: each part's scale (`calibrate`)
        restoration_power: float = RESTORATION_POWER,  # ... and restoration's power in it
        events: dict | None = None,
        monitor: str = "val/loss",  # what checkpoints and early stopping follow (conf/callbacks reads it)
        **kwargs,  # and `MaskedFillIn`'s
    ):
        super().__init__(*args, **kwargs)
        if not float(restoration_power) > 0.0:
            raise ValueError(f"restoration_power={restoration_power}: above 0 (0.5: the square root)")
        settings = {"n_masks": n_masks, "run_length": run_length, "stride": stride, "memory_size": memory_size,
                    "n_neighbours": n_neighbours}  # fmt: skip
        for name, value in settings.items():
            if int(value) < 1:
                raise ValueError(f"{name}={value}: at least 1")
        if int(channel_groups) < 0:
            raise ValueError(f"channel_groups={channel_groups}: at least 1, or 0 (one group per channel)")
        if int(stride) > self.hparams.context_len:
            raise ValueError(
                f"stride={stride}: at most context_len ({self.hparams.context_len}), or rows go unscored"
            )
        if min(int(memory_windows), int(memory_rows)) < 0 or int(memory_windows) > int(memory_size):
            raise ValueError(f"memory_windows={memory_windows}: between 0 and memory_size ({memory_size})")
        self.n_kinds = 2 if channel_out else 1
        self.init_scoring(score, false_alarm_rate, events, monitor, threshold_confidence, state_channels,
                          constant_channels)  # fmt: skip
        # the memory holds the encoder's embeddings, or with the window memory the raw windows themselves
        width = self.hparams.d_target if score == WINDOW_COMBINATION else self.hparams.net["d_model"]
        dim = self.hparams.context_len * width
        self.memory = WindowMemory(int(memory_windows), int(memory_rows), dim, self.hparams.d_target)

    @property
    def window_length(self) -> int:
        return self.hparams.context_len

    @property
    def stride(self) -> int:
        return int(self.hparams.stride)

    # -- training ---------------------------------------------------------------------------------

    def hidden_mask(
        self, shape: tuple[int, int, int], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A training mask `(B, N, C)`: geometric runs and, in half the windows (with `channel_out`), one
        scored channel hidden over a block of N/4..N steps; state channels are never hidden."""
        B, N, C = shape
        # with no measured channel (the memory scores), the states are hidden like measurements: the
        # encoder still learns from restoring them; a constant is never hidden (nothing to learn)
        learned = self.is_scored if self.is_scored.any() else ~self.is_constant & ~self.is_known
        scored = torch.from_numpy(learned if learned.any() else np.ones_like(learned))  # (C,)
        hidden = draw_mask(shape, self.masking.config, generator) & scored  # (B, N, C)
        if not self.hparams.channel_out:
            return hidden
        choices = torch.nonzero(scored).flatten()
        channel = choices[torch.randint(len(choices), (B,), generator=generator)]
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

    # -- the windows of a series ------------------------------------------------------------------

    def windows_of(self, values: np.ndarray, starts: np.ndarray) -> torch.Tensor:
        N = self.hparams.context_len
        return torch.from_numpy(np.stack([values[a : a + N] for a in starts])).to(self.device)  # (W, N, C)

    def memory_keys(self, windows: torch.Tensor) -> torch.Tensor:
        """`(W, D)` what the memory compares of whole windows `(W, N, C)`: their encoder embeddings, or
        with `model.score=restoration+window_memory` their standardised values themselves, flattened
        (known inputs zeroed: they condition, they are not compared)."""
        if self.hparams.score != WINDOW_COMBINATION:
            return self.embed(windows)
        return torch.where(torch.from_numpy(self.is_known).to(windows.device), 0.0, windows).flatten(1)

    def embed(self, windows: torch.Tensor) -> torch.Tensor:
        """The encoder's output tokens of whole windows `(W, N, C)`, flattened: `(W, N * d_model)`."""
        out = []
        for chunk in torch.split(windows, CHUNK):
            empty = chunk[..., :0]
            shown = torch.cat([chunk, torch.zeros_like(chunk), empty, empty], -1)  # nothing hidden
            out.append(self.net.encode(shown).flatten(1))
        return torch.cat(out)

    def window_parts(self, values: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
        windows = self.windows_of(values, starts)
        out = {}
        if "memory" in self.parts:
            out["memory"] = self.memory_contributions(windows)
        if "restoration" in self.parts:
            out["restoration"] = self.restoration_contributions(windows)
        if "window_memory" in self.parts:
            out["window_memory"] = self.memory_contributions(windows)
        return out

    # -- memory -----------------------------------------------------------------------------------

    def memory_contributions(self, windows: torch.Tensor) -> np.ndarray:
        """`(W, N, C)`: each window's distance to its nearest normal windows, split over its rows and
        channels by their shares of the squared difference to the nearest one (times N: their mean over
        the rows sums to the distance)."""
        if len(self.memory.keys) == 0:
            raise RuntimeError("the detector's memory is empty: prepare_scoring(train, val) builds it")
        distance, nearest = [], []
        for chunk in torch.split(self.memory_keys(windows), CHUNK):
            d, i = self.memory.nearest(chunk, int(self.hparams.n_neighbours))
            distance.append(d)
            nearest.append(i)
        distance, nearest = torch.cat(distance), torch.cat(nearest)
        W, N, C = windows.shape
        squared = (windows - self.memory.windows(nearest, N)) ** 2  # (W, N, C)
        if self.hparams.score == WINDOW_COMBINATION:  # the raw windows' distance leaves the known inputs out
            squared = torch.where(torch.from_numpy(self.is_known).to(squared.device), 0.0, squared)
        total = squared.sum((1, 2), keepdim=True)
        share = torch.where(total > 0, squared / total.clamp_min(1e-30), 1.0 / (N * C))
        return (N * distance.view(W, 1, 1) * share).double().cpu().numpy()

    def build_memory(self, tables: list[pd.DataFrame]) -> None:
        """The memory of every window (stride 1) of `tables`' series, a coreset of `memory_size` when
        there are more; its sizes go into the hyperparameters (the model folder)."""
        N = self.hparams.context_len
        rows, starts, keys, offset = [], [], [], 0
        with torch.inference_mode():
            for table in tables:
                values = self.standardised(table)
                for at in series_rows(table).values():
                    if len(at) < N:
                        continue
                    local = np.arange(len(at) - N + 1)
                    keys.append(self.memory_keys(self.windows_of(values[at], local)))
                    rows.append(torch.from_numpy(values[at]))
                    starts.append(torch.from_numpy(local + offset))
                    offset += len(at)
        keys, starts = torch.cat(keys), torch.cat(starts)
        if len(keys) > self.hparams.memory_size:
            kept = coreset(keys, int(self.hparams.memory_size), seed=0).to(keys.device)
            keys, starts = keys[kept], starts[kept.cpu()]
        self.memory.replace(keys.clone(), torch.cat(rows).to(self.device), starts.to(self.device))
        self.hparams.memory_windows, self.hparams.memory_rows = len(keys), offset

    def prepare_scoring(
        self, train: pd.DataFrame, val: pd.DataFrame, normal: pd.DataFrame | None = None
    ) -> np.ndarray:
        """The memory of the train rows' windows, the calibration on `val` (their distances to it), then
        the validation windows added to the memory."""
        if self.remembers:
            self.build_memory([train])
        val_scores = self.calibrate(val, normal)
        if self.remembers:  # score=auto's choice is made by `calibrate`
            self.build_memory([train, val])
        elif len(self.memory.keys):  # score=auto chose restoration: no memory kept in the folder
            self.memory.replace(self.memory.keys[:0], self.memory.rows[:0], self.memory.starts[:0])
            self.hparams.memory_windows, self.hparams.memory_rows = 0, 0
        return val_scores

    # -- restoration ------------------------------------------------------------------------------

    def scoring_masks(self) -> list[list[torch.Tensor]]:
        """Per kind of error, the masks `(N, C)` each window is restored under: interleaved runs over the
        scored channels, then (with `channel_out`) the first half and the second half of each group of
        scored channels: at most `channel_groups` groups, every `channel_groups`-th scored channel in one
        (one channel a group up to that many channels; 0: always one: a wide table costs 2 x
        channel_groups passes, not 2 per channel, each channel restored from the channels outside its
        group)."""
        hp = self.hparams
        N, C = hp.context_len, hp.d_target
        # kept between calls (a stream's request restores one window: building them cost as much)
        key = (self.is_scored.tobytes(), N, C, hp.n_masks, hp.run_length, hp.channel_out, hp.get("channel_groups"),
               str(self.device))  # fmt: skip
        cache = self.__dict__.setdefault("_scoring_masks", {})
        if key not in cache:
            cache[key] = self._built_masks(N, C)
        return cache[key]

    def _built_masks(self, N: int, C: int) -> list[list[torch.Tensor]]:
        hp = self.hparams
        scored = torch.from_numpy(self.is_scored).unsqueeze(0)  # (1, C)
        phase = (torch.arange(N).unsqueeze(1) // hp.run_length + torch.arange(C).unsqueeze(0)) % hp.n_masks
        kinds = [[(phase == k) & scored for k in range(hp.n_masks)]]
        if hp.channel_out:
            first = (torch.arange(N) < N // 2).unsqueeze(1)  # (N, 1)
            halves = []
            scored_channels = np.flatnonzero(self.is_scored)
            n_groups = int(hp.get("channel_groups") or 0) or len(scored_channels)
            for g in range(min(n_groups, len(scored_channels))):
                group = torch.from_numpy(np.isin(np.arange(C), scored_channels[g::n_groups])).unsqueeze(
                    0
                )  # (1, C)
                halves += [first & group, ~first & group]
            kinds.append(halves)
        return [[m.to(self.device) for m in kind if m.any()] for kind in kinds]

    def restoration_errors(self, windows: torch.Tensor) -> np.ndarray:
        """`(K, W, N, C)` float32 squared errors of each value restored while hidden, per kind of mask (0
        on state channels, never hidden). A table's chunks of windows: with the recipe's network
        (`fast_path`) each pass computes only what its hidden values need (`hidden_errors`), otherwise
        `restore_under` whole, a call per mask. Fewer than `CHUNK / 2` windows (a stream's new ones)
        share one call for several masks, up to `CHUNK` windows in all (15 calls of one window each cost
        10x one call of 15)."""
        kinds = self.scoring_masks()
        err = torch.zeros(len(kinds), *windows.shape, device=windows.device)
        per_call = CHUNK // max(1, len(windows))
        if per_call > 1:  # a few windows: several masks a call
            masks = [(k, mask) for k, kind in enumerate(kinds) for mask in kind]
            for b in range(0, len(masks), per_call):
                group = masks[b : b + per_call]
                hidden = torch.stack([mask for _, mask in group])  # (G, N, C)
                restored = self.restore_under(windows, hidden)  # (G, B, N, C)
                squared = torch.where(hidden.unsqueeze(1), (restored - windows) ** 2, 0.0)
                kind = torch.tensor([k for k, _ in group])
                for k in kind.unique().tolist():  # a kind's masks never hide one value twice: sums exact
                    err[k] += squared[kind == k].sum(0)
            return err.cpu().numpy()
        fast = self.fast_path()
        if fast:
            plans = [[self.pass_plan(mask) for mask in kind] for kind in kinds]
            projection = self.net.input_proj.proj.weight[:, : windows.shape[-1]]  # the values' share (d, C)
        for a in range(0, len(windows), CHUNK):
            x = windows[a : a + CHUNK]
            if fast:
                base = x @ projection.T  # (B, N, d): the values' projection, shared by every pass
                for k, kind in enumerate(plans):
                    for plan in kind:
                        self.hidden_errors(x, base, plan, err[k, a : a + CHUNK])
                continue
            for k, kind in enumerate(kinds):
                for mask in kind:
                    err[k, a : a + CHUNK] += torch.where(mask, (self.restore_under(x, mask) - x) ** 2, 0.0)
        return err.cpu().numpy()  # float32: scaled in float64 (`scaled_errors`), as the values are exact

    def fast_path(self) -> bool:
        """Whether the network is the recipe's kind (one linear input projection, additive positions,
        pre-norm self-attention blocks without RoPE, a relative bias or residual scores, the per-step
        point head, interpolated hidden values, no window norm): `hidden_errors` then gives the errors
        of `restore_under` for less work."""
        net, hp = self.net, self.hparams
        blocks = list(net.encoder.blocks)
        return bool(
            hp.interpolate_hidden and not hp.window_norm and self.head.kind == "point"
            and isinstance(net.input_proj, InputProjection) and net.input_proj.d_in == 2 * hp.d_target
            and net.patching is None and not net.conv and not net.use_cls and net.linear_skip is None
            and net.cfg.head == "per_step" and net.encoder.relative_bias is None
            and not net.encoder.residual_attention and not net.encoder.causal and blocks
            and all(b.pre_norm and b.cross_attn is None and isinstance(b.self_attn, SelfAttention)
                    and b.self_attn.rope is None for b in blocks)
        )  # fmt: skip

    def pass_plan(self, mask: torch.Tensor) -> dict:
        """What one scoring pass under `mask (N, C)` needs, the same for every window: the channels it
        hides (`channels`, indices), the rows that hold a hidden value (`rows`: a slice when they are
        one run, else indices), their interpolation matrices `(c, N, N)`, the hidden flags' and the
        positions' share of the input projection `(1, N, d)`, and the mask on those rows and channels."""
        N, C = mask.shape
        channels = torch.nonzero(mask.any(0)).flatten()
        held = torch.nonzero(mask.any(1)).flatten()
        lo, hi = int(held[0]), int(held[-1]) + 1
        rows = slice(lo, hi) if hi - lo == len(held) else held
        proj = self.net.input_proj.proj
        flags = mask.to(proj.weight.dtype) @ proj.weight[:, C:].T + proj.bias  # (N, d)
        shared = self.net.positional(flags.unsqueeze(0), step_positions(None, N, device=mask.device))
        return {"channels": channels, "rows": rows, "interpolation": self.interpolation(mask)[channels],
                "shared": shared, "mask": mask[rows][:, channels]}  # fmt: skip

    def hidden_errors(self, x: torch.Tensor, base: torch.Tensor, plan: dict, err: torch.Tensor) -> None:
        """Adds to `err (B, N, C)` the squared errors of windows `x (B, N, C)` restored under one
        pass's mask (`pass_plan`), as `restore_under` restores them with less work: the interpolation
        only on the channels the mask hides, the input projection as the shared `base` plus the hidden
        channels' change, and the last block's queries, feed-forward and head only on the rows holding a
        hidden value and the channels hidden (no other output is scored)."""
        net, channels, rows = self.net, plan["channels"], plan["rows"]
        values = x[..., channels]  # (B, N, c)
        change = torch.einsum("cnm,bmc->bnc", plan["interpolation"], values) - values  # line - values
        projection = net.input_proj.proj.weight[:, : x.shape[-1]]
        h = base + change @ projection[:, channels].T + plan["shared"]  # (B, N, d)
        *blocks, last = net.encoder.blocks
        for block in blocks:
            h, _ = block(h)
        attention = last.self_attn
        q, k, v = attention.split_heads(attention.qkv_proj(last.norm_self(h)), 3)  # (B, H, N, Dh)
        out = h[:, rows] + last.dropout_attn(
            attention.merge_heads(attention.attend(q[:, :, rows], k, v, None))
        )
        out = out + last.dropout(last.ffn(last.norm_ffn(out)))
        head = net.head
        correction = net.encoder.final_norm(out) @ head.weight[channels].T + head.bias[channels]  # (B, n, c)
        squared = torch.where(plan["mask"], (correction + change[:, rows]) ** 2, 0.0)  # restored - x = both
        if isinstance(rows, slice):
            err[:, rows, channels] += squared
        else:
            err[:, rows.unsqueeze(1), channels] += squared

    def restore_under(self, windows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`restore` of windows `(B, N, C)` with the values of `mask (N, C)` hidden in every one of them;
        masks `(G, N, C)`: each mask over every window, `(G, B, N, C)`, in one network call. A mask is
        the same for all windows, so the interpolation the hidden values enter as is one matrix per
        channel, computed once per mask (`interpolation`), not searched for window by window; with
        `window_norm` (each window its own scale), `restore` itself."""
        masks = mask.unsqueeze(0) if mask.dim() == 2 else mask  # (G, N, C)
        G, (B, N, C) = len(masks), windows.shape
        hidden = masks.unsqueeze(1).expand(G, B, N, C).reshape(G * B, N, C)
        if self.hparams.window_norm or not self.hparams.interpolate_hidden:
            x = windows.repeat(G, 1, 1)
            empty = x[..., :0]
            out = self.restore({"hist_target": x, "hist_known": empty, "hist_observed": empty}, hidden)
        else:
            line = torch.einsum("gcnm,bmc->gbnc", self.interpolations(masks), windows).reshape(G * B, N, C)
            params = self.head.params(self.net(torch.cat([line, hidden.to(windows.dtype)], -1)))
            out = self.head.point(params + line.unsqueeze(-1))  # the network's correction to the line
        return out.reshape(B, N, C) if mask.dim() == 2 else out.reshape(G, B, N, C)

    def interpolations(self, masks: torch.Tensor) -> torch.Tensor:
        """`(G, C, N, N)`: `interpolation` of each of `masks` `(G, N, C)`, kept by the masks."""
        key = masks.cpu().numpy().tobytes()
        cache = self.__dict__.setdefault("_stacked_interpolations", {})
        if key not in cache:
            cache[key] = torch.stack([self.interpolation(m) for m in masks])
        return cache[key]

    def interpolation(self, mask: torch.Tensor) -> torch.Tensor:
        """`(C, N, N)`: per channel, the matrix taking a window's values to them with the values of `mask
        (N, C)` replaced by `nn.masking.interpolate`'s line (its response to each step's unit value)."""
        key = mask.cpu().numpy().tobytes()
        cache = self.__dict__.setdefault("_interpolations", {})
        if key not in cache:
            N, C = mask.shape
            units = torch.eye(N, device=mask.device).unsqueeze(2).expand(N, N, C)  # (N: unit at step j, N, C)
            cache[key] = interpolate(units, mask.expand(N, N, C)).permute(2, 1, 0).contiguous()  # (C, n, j)
        return cache[key]

    def restoration_contributions(self, windows: torch.Tensor) -> np.ndarray:
        """`(W, N, C)`: each scored value's scaled error, / the scored channels (`row_score=value`: the
        raw errors `(K, W, N, C)`, scaled once averaged over the covering windows, `to_rows`)."""
        raw = self.restoration_errors(windows)
        if self.hparams.row_score == "value":
            return raw
        scaled = self.scaled_errors(raw)
        scaled /= max(1, int(self.is_scored.sum()))  # in place: one (W, N, C) copy fewer
        return scaled

    def calibrate_errors(self, val: pd.DataFrame) -> None:
        if "restoration" not in self.parts:
            return
        raw = []
        with torch.inference_mode():
            for at in series_rows(val).values():
                values = self.standardised(val.iloc[at])
                starts = covering_window_starts(len(at), self.window_length, self.stride)
                errors = self.restoration_errors(self.windows_of(values, starts))  # (K, W, N, C)
                if self.hparams.row_score == "value":  # each value's error over its covering windows
                    errors = np.stack([rows_of_window_rows(k, starts, len(at)) for k in errors])  # (K, T, C)
                raw.append(errors.reshape(len(errors), -1, errors.shape[-1]))
        raw = np.concatenate(raw, axis=1)  # (K, values, C)
        quantiles = np.quantile(raw, ERROR_QUANTILE, axis=1)  # (K, C)
        self.error_scale.copy_(torch.as_tensor(relative_floor(quantiles, self.is_scored)))


class ForecastAnomalyDetector(AnomalyScoring, DecoderOnlyForecaster):
    """The forecast detector (module docstring): `tasks.forecasting.DecoderOnlyForecaster` with a
    Gaussian head, one step ahead; its training loss is the family's own (teacher-forced negative log
    likelihood)."""

    method = "forecast"
    scores = ("forecast",)

    def __init__(
        self,
        *args,
        score: str = "forecast",
        score_window: int = 16,
        row_score: str = "window",
        state_channels: list[str] | None = None,
        constant_channels: list[str] | None = None,
        known_channels: list[str] | None = None,
        departure_unit: float = DEPARTURE_UNIT,
        causal: bool = False,
        false_alarm_rate: float = 0.001,
        threshold_confidence: float | None = None,
        threshold_drift: dict | None = None,
        threshold_rows: str = "validation",
        val_score_median: float | None = None,  # the threshold rows' median score (set by `calibrate`)
        val_score_tail: float | None = None,  # their (1 - TAIL_FRACTION) quantile (set by `calibrate`)
        departure_scores: dict | None = None,  # a departure unit's score per score (set by `calibrate`)
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
        if int(score_window) < 1:
            raise ValueError(f"score_window={score_window}: at least 1")
        self.init_scoring(score, false_alarm_rate, events, monitor, threshold_confidence, state_channels,
                          constant_channels)  # fmt: skip

    @property
    def window_length(self) -> int:
        return int(self.hparams.score_window)

    @property
    def stride(self) -> int:
        return 1

    def split_loss(self, batch: dict, split: str) -> torch.Tensor:
        return self.loss(batch)

    def step_params(self, values: torch.Tensor) -> torch.Tensor:
        """One-step-ahead Gaussian `(B, L - 1, C, 2)` of steps 1..L-1 of windows `(B, L, C)`."""
        return self.head.params(self.net(values[:, :-1]))

    def surprises(self, values: np.ndarray) -> np.ndarray:
        """`(1, T, C)` surprise of every step of one series' standardised values `(T, C)`, from the
        rows before it only (0 for the first row)."""
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
        return out[None]

    def window_parts(self, values: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
        scaled = self.scaled_errors(self.surprises(values)) / max(1, int(self.is_scored.sum()))  # (T, C)
        return {"forecast": np.lib.stride_tricks.sliding_window_view(scaled, self.window_length, axis=0)[
            starts].transpose(0, 2, 1)}  # (W, L, C): each window's steps  # fmt: skip

    def calibrate_errors(self, val: pd.DataFrame) -> None:
        raw = []
        with torch.inference_mode():
            for at in series_rows(val).values():
                raw.append(self.surprises(self.standardised(val.iloc[at])))
        raw = np.concatenate(raw, axis=1)  # (1, T, C)
        self.error_scale.copy_(torch.as_tensor(relative_floor(np.quantile(raw, ERROR_QUANTILE, axis=1),
                                                              self.is_scored)))  # fmt: skip

    @staticmethod
    def surprise(params: torch.Tensor, target: torch.Tensor) -> np.ndarray:
        """Squared standardised residual `(B, T, C)` of `target (B, T, C)` under the Gaussians."""
        return (((target - params[..., 0]) / params[..., 1]) ** 2).double().cpu().numpy()


DETECTORS = {cls.method: cls for cls in (MaskedAnomalyDetector, ForecastAnomalyDetector)}
