"""benchmarks/causal_attention.py runs at a tiny shape: its query-block split of causal attention
is checked equal to the fused path before anything is timed (an uneven split: 9 queries in 2-4 blocks)."""

import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow  # a fresh Python process, its imports and the benchmark
def test_causal_attention_benchmark_checks_its_split_and_prints_every_variant(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "causal_attention.py"),
        "--shape",
        "2",
        "2",
        "9",
        "4",
        "--repeats",
        "1",
        "--device",
        "cpu",
    ]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "ms" not in line]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == [
        "causal (fused)",
        "full (fused, no mask)",
        "query blocks 2",
        "query blocks 3",
        "query blocks 4",
        "reference (causal)",
    ]
    assert rows[0].endswith("| 1.00x |")
