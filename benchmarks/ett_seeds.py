"""Mean and sd over seeds of benchmarks/ett.py rows, from the results files its runs wrote (issue 48's
table: a recipe's mean of 3 seeds per row, beside the same runs' linear forecaster).

    python benchmarks/ett_seeds.py benchmarks/RESULTS_recipe/*.md
    python benchmarks/ett_seeds.py --gate benchmarks/RESULTS_gate/*.md   # rows with model.linear_gate (issue 56)
    python benchmarks/ett_seeds.py --ungated benchmarks/RESULTS_recipe/*.md benchmarks/RESULTS_gate/E*_seed*.md \
        benchmarks/RESULTS_gate/I*_seed*.md        # the recipe as configured (ungated) on every row
    python benchmarks/ett_seeds.py --compare BASE.md ... -- NEW.md ...   # an option against the rows without it

`--ungated`: where a file's row was run with a linear gate, its test MSE is the model's as trained
(`gate_test_ungated`, the share 1), which is what the recipe without a gate (`model.linear_gate: none`)
scores; other rows keep `mse`. `--compare`: per row present in both sets (same model, dataset, L, H and
seed), the new run's `best_val_mse` over the base's (r) with both test MSEs beside, then the mean r
over the rows and per dataset (the figures the channel-mixing rule of RESULTS_forecasting.md reads).

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


def measured_rows(paths: list[Path]):
    """(seed, main row, its detail row, path) for each measured row of each file of `paths`: the seed
    read from the file's name (the name itself where it holds none)."""
    for path in paths:
        seed = re.search(r"seed(\d+)", path.name)
        main_rows, detail = rows(path)
        for r in main_rows:
            key = (r["model"], r["dataset"], r["L"], r["H"])
            d = next(x for x in detail if (x["model"], x["dataset"], x["L"], x["H"]) == key)
            yield (seed.group(1) if seed else path.name), r, d, path


FORMS = ("global", "step", "channel")


def gate_tables(paths: list[Path]) -> None:
    """Rows with `model.linear_gate` (issue 56): per row, the mean over seeds of each form's test MSE
    beside the model ungated and the same-run linear forecaster, the mean share kept; then the selection
    rule's figure, per form: the mean over the seed-0 rows of gated / linear validation MSE."""
    runs = defaultdict(list)
    for seed, r, d, _ in measured_rows(paths):
        if d.get("gate_val_linear", "-") != "-":
            runs[(r["model"], r["dataset"], r["L"], r["H"])].append(
                {"seed": seed, "train_s": float(r["train_s"]), **d}
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


def test_mse(main_row: dict, detail_row: dict, ungated: bool) -> float:
    """A row's test MSE; with `ungated`, a gated run's model as trained (`gate_test_ungated`)."""
    if ungated and detail_row.get("gate_test_ungated", "-") != "-":
        return float(detail_row["gate_test_ungated"])
    return float(main_row["mse"])


def seed_rows(paths: list[Path], ungated: bool = False) -> dict[tuple, dict]:
    """{(model, dataset, L, H, seed): figures} over `paths`; a row found twice must agree."""
    found = {}
    for seed, r, d, path in measured_rows(paths):
        figures = {
            "val": float(d["best_val_mse"]),
            "mse": test_mse(r, d, ungated),
            "linear": float(d["linear_mse_same_run"]),
            "train_s": float(r["train_s"]),
            "steps": d["steps"],
            "file": path.name,
        }
        full = (r["model"], r["dataset"], r["L"], r["H"], seed)
        old = found.get(full)
        if old is not None and (old["val"], old["mse"]) != (figures["val"], figures["mse"]):
            raise SystemExit(f"{path}: row {' '.join(full)} differs from {old['file']}'s")
        found[full] = figures
    return found


def compare(base_paths: list[Path], new_paths: list[Path]) -> None:
    """Per row in both sets: validation MSE new / base (r), test MSE of each; mean r overall and per
    dataset. The base's test MSE is the ungated model's (`--ungated`), as the recipe is configured."""
    base, new = seed_rows(base_paths, ungated=True), seed_rows(new_paths, ungated=True)
    missing = sorted(set(new) - set(base))
    if missing:
        raise SystemExit(f"no base row for: {', '.join(' '.join(k) for k in missing)}")
    print(
        "| dataset | L | H | seed | val MSE without | val MSE with | r (with / without) | test MSE without "
        "| test MSE with | linear (same run) | train s without / with | steps without / with |"
    )
    print("|" + "---|" * 12)
    ratios = defaultdict(list)
    for key in sorted(new, key=lambda k: (k[1], int(k[3]), k[4])):
        b, n = base[key], new[key]
        r = n["val"] / b["val"]
        ratios[key[1]].append(r)
        print(
            f"| {key[1]} | {key[2]} | {key[3]} | {key[4]} | {b['val']:.4f} | {n['val']:.4f} | {r:.4f} "
            f"| {b['mse']:.4f} | {n['mse']:.4f} | {n['linear']:.4f} | {b['train_s']:.0f} / {n['train_s']:.0f} "
            f"| {b['steps']} / {n['steps']} |"
        )
    every = [r for rs in ratios.values() for r in rs]
    print(f"\nmean r over {len(every)} rows: {statistics.mean(every):.5f}")
    for dataset, rs in sorted(ratios.items()):
        print(f"  {dataset} ({len(rs)} rows): {statistics.mean(rs):.5f}")


def main() -> None:
    if sys.argv[1:2] == ["--gate"]:
        gate_tables([Path(p) for p in sys.argv[2:]])
        return
    if sys.argv[1:2] == ["--compare"]:
        if "--" not in sys.argv:
            raise SystemExit("--compare BASE.md ... -- NEW.md ...: the '--' between the two sets is missing")
        cut = sys.argv.index("--")
        compare([Path(p) for p in sys.argv[2:cut]], [Path(p) for p in sys.argv[cut + 1 :]])
        return
    ungated = sys.argv[1:2] == ["--ungated"]
    runs = defaultdict(list)
    for path in map(Path, sys.argv[1 + ungated :]):
        seed = re.search(r"seed(\d+)", path.name)
        main_rows, detail = rows(path)
        for r in main_rows:
            key = (r["model"], r["dataset"], r["L"], r["H"])
            d = next(x for x in detail if (x["model"], x["dataset"], x["L"], x["H"]) == key)
            runs[key].append(
                {
                    "seed": seed.group(1) if seed else path.name,
                    "mse": test_mse(r, d, ungated),
                    "train_s": float(r["train_s"]),
                    "linear": float(d["linear_mse_same_run"]),
                    "val": float(d["best_val_mse"]),
                    "steps": d["steps"],
                }
            )
    print(
        "| model | dataset | L | H | seeds | test MSE mean | sd | linear (same runs) | mean - linear "
        "| mean / linear | best validation MSE, mean | train s a seed | steps a seed |"
    )
    print("|" + "---|" * 13)
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
            f"| {mean / linear:.4f} | {val:.4f} | {seconds} | {steps} |"
        )


if __name__ == "__main__":
    main()
