"""What the classifier looked at: occlusion of time ranges (Zeiler & Fergus 2014, for time series).

For a sample of T steps, windows of `width` steps (T / 16, at least 1) slide by half a window; each is
replaced in turn by the same steps of a sample the model puts in ANOTHER class (`REFERENCES` of them, drawn
from the same table, seeded), and the sample classified again. A window's score is how much that lowers
the log-odds of the class the model predicts for the whole sample, ln(p / (1 - p)), averaged over the
references: 2.3 means that with those steps as another class's samples have them, the odds of this class
are 10 times lower. Only where no sample of another class is there (a table of one class) is a window
set to 0, the training mean of the standardised channels.

Why other samples' steps and not zeros alone: a model may know a class by what it lacks (class "up"
by the missing dip of class "down"); zeros remove nothing from such a sample, and the explanation would
point nowhere, while another class's steps put the dip back (tested on a set whose classes differ in one
range). Why log-odds and not the probability: a sure model (p = 0.9999) keeps p near 1 when half of its
evidence is changed, and the drops would all be near 0 and ranked by noise. A step's score is the mean of
the windows that cover it. Occlusion needs nothing but the model's probabilities: it explains a network,
an ensemble or a calibrated model alike, where gradients x input need the network's inside and depend
on the scaling of the inputs.

- `occlusion`: per sample, the windows' and the steps' scores;
- `top_ranges`: a sample's `k` highest windows that do not overlap (predict.py --explain writes them as
  `range_<i>_start`, `range_<i>_end` (the table's step values or times) and `range_<i>_score`);
- `explanation_figure`: per predicted class, the mean step scores of its test samples over the mean
  of their channels (the run's `plots/explanation.png`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt
import numpy as np

N_WINDOWS = 16  # a window is 1/16 of the sample's length
TOP = 3  # ranges per sample that predict.py --explain writes
PER_CLASS = 100  # test samples per class the run's figure averages (the first ones)
REFERENCES = 4  # samples of other classes whose steps replace a window, in turn
CHUNK = 256  # samples occluded at a time (a few hundred thousand copies at most)


@dataclass
class Occlusion:
    """One sample's occlusion scores."""

    target: int  # the class whose probability is followed (the predicted one)
    starts: np.ndarray  # (W,) first step of each window
    width: int  # steps per window
    drops: np.ndarray  # (W,) log-odds of the target for the sample minus with the window replaced
    steps: np.ndarray  # (T,) mean drop of the windows covering each step


def windows(n_steps: int) -> tuple[np.ndarray, int]:
    """(first steps `(W,)`, width): windows of n_steps / 16 steps every half window, the last one
    ending at the last step, so that every step is covered."""
    width = max(1, round(n_steps / N_WINDOWS))
    stride = max(1, width // 2)
    starts = np.arange(0, max(1, n_steps - width + 1), stride)
    if starts[-1] + width < n_steps:
        starts = np.append(starts, n_steps - width)
    return starts, width


def occlusion(
    proba: Callable[[list[np.ndarray]], np.ndarray],
    samples: list[np.ndarray],
    targets=None,
    references: int = REFERENCES,
    seed: int = 0,
) -> list[Occlusion]:
    """Occlusion scores of scaled samples `(T_i, D)` (module docstring); `proba(samples) -> (S, C)` is
    the model's; `targets` `(S,)`: the class to follow per sample (None: the predicted one). Samples are
    occluded `CHUNK` at a time: a table's copies all at once would not fit in memory."""
    predicted = proba(samples).argmax(axis=1)  # (S,): whom a sample may borrow steps from
    targets = predicted if targets is None else np.asarray(targets)
    rng = np.random.default_rng(seed)
    found = []
    for lo in range(0, len(samples), CHUNK):
        chunk = range(lo, min(lo + CHUNK, len(samples)))
        found += _occlude(proba, samples, chunk, predicted, targets, references, rng)
    return found


def _occlude(proba, samples, chunk, predicted, targets, references, rng) -> list[Occlusion]:
    """`occlusion` of the samples of `chunk` (indices into `samples`)."""
    copies, plans = [], []
    for i in chunk:
        x = samples[i]
        starts, width = windows(len(x))
        others = np.flatnonzero(predicted != targets[i])
        donors = rng.choice(others, min(references, len(others)), replace=False) if len(others) else [None]
        first = len(copies)
        copies.append(x)
        for s in starts:
            for donor in donors:
                changed = x.copy()
                changed[s : s + width] = 0.0  # the training mean of every (standardised) channel
                if donor is not None:  # the donor's steps where it has them
                    part = samples[donor][s : s + width]
                    changed[s : s + len(part)] = part
                copies.append(changed)
        plans.append((i, first, starts, width, len(donors)))
    p = proba(copies)  # (sum of (1 + W_i * R_i), C)
    found = []
    for i, first, starts, width, n_donors in plans:
        target = int(targets[i])
        odds = log_odds(p[first : first + 1 + len(starts) * n_donors], target)  # (1 + W * R,)
        drops = odds[0] - odds[1:].reshape(len(starts), n_donors).mean(axis=1)  # (W,)
        total, count = np.zeros(len(samples[i])), np.zeros(len(samples[i]))
        for s, d in zip(starts, drops, strict=True):
            total[s : s + width] += d
            count[s : s + width] += 1
        found.append(Occlusion(target, starts, width, drops, total / np.maximum(count, 1)))
    return found


def log_odds(p: np.ndarray, target: int) -> np.ndarray:
    """ln(p_target / (sum of the other classes' p)) of probabilities `(S, C)`: the other classes' sum is
    taken as it is, not as 1 - p_target, which is 0 in floating point once the model is sure enough."""
    others = np.delete(p, target, axis=1).sum(axis=1)
    return np.log(np.maximum(p[:, target], 1e-300)) - np.log(np.maximum(others, 1e-300))


def top_ranges(found: Occlusion, k: int = TOP) -> list[tuple[int, int, float]]:
    """The `k` windows that lower the log-odds most and overlap no higher one: (first step, last step,
    score), highest first (fewer when the sample has fewer windows)."""
    chosen: list[tuple[int, int, float]] = []
    for w in np.argsort(-found.drops, kind="stable"):
        lo, hi = int(found.starts[w]), int(found.starts[w]) + found.width - 1
        if all(hi < a or lo > b for a, b, _ in chosen):
            chosen.append((lo, hi, float(found.drops[w])))
        if len(chosen) == k:
            break
    return chosen


def range_columns(found: list[Occlusion], steps: list[np.ndarray], k: int = TOP) -> dict[str, list]:
    """`range_<i>_start`, `range_<i>_end` (the sample's step values or times) and `range_<i>_score` for
    i = 1..k, one value per sample (empty where a sample has fewer ranges)."""
    parts = ("start", "end", "score")
    columns: dict[str, list] = {f"range_{i}_{part}": [] for i in range(1, k + 1) for part in parts}
    for occ, values in zip(found, steps, strict=True):
        ranges = top_ranges(occ, k)
        for i in range(1, k + 1):
            lo, hi, score = ranges[i - 1] if i <= len(ranges) else (None, None, np.nan)
            columns[f"range_{i}_start"].append(values[lo] if lo is not None else None)
            columns[f"range_{i}_end"].append(values[hi] if hi is not None else None)
            columns[f"range_{i}_score"].append(score)
    return columns


def explanation_figure(samples: list[np.ndarray], found: list[Occlusion], classes: list[str]):
    """One panel per predicted class: the mean (over its samples and channels) of the scaled values, and
    the mean occlusion score of each step (how much other classes' steps around it lower the log-odds of
    that class); samples of unequal length are aligned at their first step."""
    predicted = sorted({occ.target for occ in found})
    n = max(1, len(predicted))
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, c in zip(axes.flat, predicted, strict=False):
        members = [i for i, occ in enumerate(found) if occ.target == c][:PER_CLASS]
        T = max(len(samples[i]) for i in members)
        value, score, count = np.zeros(T), np.zeros(T), np.zeros(T)
        for i in members:
            t = len(samples[i])
            value[:t] += samples[i].mean(axis=1)
            score[:t] += found[i].steps
            count[:t] += 1
        value, score = value / np.maximum(count, 1), score / np.maximum(count, 1)
        ax.plot(value, color="grey", linewidth=1, label="mean value (scaled)")
        ax.set_title(f"predicted {classes[c]} ({len(members)} samples)", fontsize=9)
        ax.set_xlabel("step")
        twin = ax.twinx()
        twin.fill_between(np.arange(T), 0, score, color="tab:red", alpha=0.35, step="mid")
        twin.set_ylabel("log-odds lost when replaced", color="tab:red", fontsize=8)
        twin.set_ylim(min(0.0, float(score.min())), max(1e-3, float(score.max())) * 1.1)
    fig.suptitle("what the model looked at: occlusion of time ranges, test samples", fontsize=10)
    fig.tight_layout()
    return fig
