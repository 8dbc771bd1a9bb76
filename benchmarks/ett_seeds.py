"""Mean and sd over seeds of benchmarks/ett.py rows, from the results files its runs wrote (issue 48's
table: a recipe's mean of 3 seeds per row, beside the same runs' linear forecaster).

    python benchmarks/ett_seeds.py benchmarks/RESULTS_recipe/*.md
    python benchmarks/ett_seeds.py --gate benchmarks/RESULTS_gate/*.md   # rows with model.linear_gate (issue 56)

Each file is one `ett.py --seed S --results FILE` invocation's: its main table (model, dataset, L, H,
mse, mae, train_s, ...) and its detail table (..., linear_mse_same_run, best_val_mse, ...). Rows are
grouped by (model, dataset, L, H); printed: the seeds found, the test MSE's mean and sd (ddof 1), the
same-run linear forecaster's test MSE (the same for every seed: it does not depend on the seed), the
validation MSE's mean (what chose each checkpoint) and the train seconds of each seed.
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def rows(path: Path) -> tuple[list[dict], list[dict]]:
    """The (main, detail) table rows of one results file, as dicts of strings."""
    tables, header = [], None
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
            tables.append([])
        elif not set(line) <= set("|-"):
            tables[-1].append(dict(zip(header, cells)))
    main = [r for t in tables for r in t if "train_s" in r and r.get("source", "").startswith("measured")]
    detail = [r for t in tables for r in t if "best_val_mse" in r]
    return main, detail


FORMS = ("global", "step", "channel")


def gate_tables(paths: list[Path]) -> None:
    """Rows with `model.linear_gate` (issue 56): per row, the mean over seeds of each form's test MSE
    beside the model ungated and the same-run linear forecaster, the mean share kept; then the selection
    rule's figure, per form: the mean over the seed-0 rows of gated / linear validation MSE."""
    runs = defaultdict(list)
    for path in paths:
        seed = re.search(r"seed(\d+)", path.name)
        main_rows, detail = rows(path)
        for r in main_rows:
            key = (r["model"], r["dataset"], r["L"], r["H"])
            d = next(x for x in detail if (x["model"], x["dataset"], x["L"], x["H"]) == key)
            if d.get("gate_val_linear", "-") == "-":
                continue
            runs[key].append(
                {"seed": seed.group(1) if seed else path.name, "train_s": float(r["train_s"]), **d}
            )

    def mean(seeds, column):
        return statistics.mean(float(s[column]) for s in seeds)

    def sd(seeds, column):
        return f"{statistics.stdev(float(s[column]) for s in seeds):.4f}" if len(seeds) > 1 else "-"

    print(
        "| dataset | L | H | seeds | linear (same run) | ungated | global | step | channel | sd (global / step / channel) "
        "| share kept (configured form) | val: linear | val: ungated | val: global | val: step | val: channel "
        "| train s a seed |"
    )
    print("|" + "---|" * 17)
    ordered = sorted(runs.items(), key=lambda kv: (kv[0][1], int(kv[0][3])))
    for key, seeds in ordered:
        tests = " | ".join(f"{mean(seeds, f'gate_test_{f}'):.4f}" for f in ("ungated", *FORMS))
        vals = " | ".join(f"{mean(seeds, f'gate_val_{f}'):.4f}" for f in ("linear", "model", *FORMS))
        seconds = ", ".join(f"{s['train_s']:.0f}" for s in seeds)
        print(
            f"| {key[1]} | {key[2]} | {key[3]} | {', '.join(s['seed'] for s in seeds)} "
            f"| {mean(seeds, 'linear_mse_same_run'):.4f} | {tests} | {' / '.join(sd(seeds, f'gate_test_{f}') for f in FORMS)} "
            f"| {mean(seeds, 'gate_share'):.3f} | {vals} | {seconds} |"
        )
    first = [s for _, seeds in ordered for s in seeds if s["seed"] == "0"]
    if first:
        print(f"\nselection figure over {len(first)} seed-0 rows (mean of gated / linear validation MSE):")
        for f in FORMS:
            ratio = statistics.mean(float(s[f"gate_val_{f}"]) / float(s["gate_val_linear"]) for s in first)
            print(f"  {f}: {ratio:.5f}")


def main() -> None:
    if sys.argv[1:2] == ["--gate"]:
        gate_tables([Path(p) for p in sys.argv[2:]])
        return
    runs = defaultdict(list)
    for path in map(Path, sys.argv[1:]):
        seed = re.search(r"seed(\d+)", path.name)
        main_rows, detail = rows(path)
        for r in main_rows:
            key = (r["model"], r["dataset"], r["L"], r["H"])
            d = next(x for x in detail if (x["model"], x["dataset"], x["L"], x["H"]) == key)
            runs[key].append(
                {
                    "seed": seed.group(1) if seed else path.name,
                    "mse": float(r["mse"]),
                    "train_s": float(r["train_s"]),
                    "linear": float(d["linear_mse_same_run"]),
                    "val": float(d["best_val_mse"]),
                    "steps": d["steps"],
                }
            )
    print(
        "| model | dataset | L | H | seeds | test MSE mean | sd | linear (same runs) | mean - linear "
        "| best validation MSE, mean | train s a seed | steps a seed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key, seeds in sorted(runs.items(), key=lambda kv: (kv[0][1], int(kv[0][3]))):
        mse = [s["mse"] for s in seeds]
        sd = f"{statistics.stdev(mse):.4f}" if len(mse) > 1 else "-"
        mean = statistics.mean(mse)
        linear = statistics.mean(s["linear"] for s in seeds)
        names = ", ".join(s["seed"] for s in seeds)
        val = statistics.mean(s["val"] for s in seeds)
        seconds = ", ".join(f"{s['train_s']:.0f}" for s in seeds)
        steps = ", ".join(s["steps"] for s in seeds)
        print(
            f"| {' | '.join(key)} | {names} | {mean:.4f} | {sd} | {linear:.4f} | {mean - linear:+.4f} "
            f"| {val:.4f} | {seconds} | {steps} |"
        )


if __name__ == "__main__":
    main()
