"""benchmarks/classification_pool.py on a pool of two tiny sets written here: validation rows from the
TRAIN files only, the rule's choice, test rows, resumption (nothing measured twice), ranks in the file."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from conftest import import_benchmark


def write_set(folder, name: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    (folder / name).mkdir(parents=True)
    for split, n in (("TRAIN", 16), ("TEST", 10)):
        lines = ["@problemName " + name, "@univariate true", "@equalLength true", "@seriesLength 24",
                 "@classLabel true a b", "@data"]  # fmt: skip
        for i in range(n):
            label = "ab"[i % 2]
            values = np.sin(np.arange(24) / (2 if label == "a" else 6)) + rng.normal(0, 0.2, 24)
            lines.append(",".join(f"{v:.4f}" for v in values) + f":{label}")
        (folder / name / f"{name}_{split}.ts").write_text("\n".join(lines) + "\n")


def run(monkeypatch, *args) -> None:
    pool = import_benchmark("classification_pool")
    for name, settings in pool.CANDIDATES.items():  # the same candidates, fewer features: seconds
        monkeypatch.setitem(pool.CANDIDATES, name, settings | {"n_features": 168})
    monkeypatch.setattr(sys, "argv", ["classification_pool.py", *args])
    pool.main()


def test_pool_validates_chooses_tests_and_resumes(tmp_path, monkeypatch):
    for seed, name in enumerate(["SetA", "SetB"]):
        write_set(tmp_path / "pool", name, seed)
    pd.DataFrame(
        {
            "dataset": ["SetA", "SetB"],
            **{f"{p}_split0": [0.9, 0.8] for p in ("MiniROCKET", "MultiROCKET", "HC2", "InceptionTime")},
        }
    ).to_csv(tmp_path / "pool" / "published_accuracy.csv", index=False)
    rows, results = tmp_path / "rows.csv", tmp_path / "R.md"
    common = ["--pool", str(tmp_path / "pool"), "--rows", str(rows), "--results", str(results)]
    run(monkeypatch, "--stage", "validate", *common)
    table = pd.read_csv(rows)
    n_candidates = len(import_benchmark("classification_pool").ATTEMPTS[2]["candidates"])
    assert len(table) == 2 * n_candidates and set(table.stage) == {"validate"}
    assert (table.n_train + table.n_eval == 16).all()  # the TRAIN file's 16 series, split; no TEST series
    run(monkeypatch, "--stage", "test", "--sets", "SetA", *common)
    run(monkeypatch, "--stage", "test", *common)  # SetA is done: only SetB is measured
    table = pd.read_csv(rows)
    test = table[table.stage == "test"]
    assert sorted(test.set) == ["SetA", "SetB"] and (test.n_eval == 10).all()
    text = results.read_text()
    assert text.index("# Attempt 2") < text.index("# Attempt 1")  # the latest first, the first kept
    assert (
        "Chosen by the rule" in text
        and "| SetA |" in text
        and "rank ours" in text
        and "Sets run: 2 of 2" in text
    )
