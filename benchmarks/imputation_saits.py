"""SAITS (PyPOTS) on the windows and masks of benchmarks/imputation.py, in an environment of its own.

    python -m venv /tmp/saits && echo "$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')" \
        > "$(/tmp/saits/bin/python -c 'import site; print(site.getsitepackages()[0])')/project.pth"
    /tmp/saits/bin/pip install --no-deps pypots tsdb pygrinder benchpots h5py nonlinear_benchmarks progressbar \
        einops ai4ts && /tmp/saits/bin/pip install tensorboard transformers   # the project's torch is reused
    OMP_NUM_THREADS=1 /tmp/saits/bin/python benchmarks/imputation_saits.py --datasets ETTh1

PyPOTS is not a dependency of the project (it pins its own transformers and pulls a CUDA torch): the
environment above sees the project's packages through a .pth file and adds PyPOTS beside them.

Same protocol as benchmarks/imputation.py: our data module (`experiment=imputation_ett`) gives the
scaled windows of 96 steps, all of them, in dataset order; the validation and test windows get exactly
the masks `MaskedFillIn` scores (`tsformer.nn.masking.eval_masks`, `model.eval_mask_seed=0`). SAITS is
trained on the complete train windows (stride 1; PyPOTS hides values itself while training, its MIT
and ORT losses), validated on the masked validation windows (it keeps its best epoch by their error),
and scored on the hidden values of the masked test windows: MSE and MAE on the scaled values.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from imputation import PUBLISHED_TIMESNET_ETTH1, RATIOS, REPO, machine, write_results


def windows_and_masks(dataset: str, ratio: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """split -> (windows `(W, 96, 7)` scaled, hidden `(W, 96, 7)` bool: the split's masks; none for train)."""
    from hydra.utils import instantiate

    from tsformer.nn.masking import MaskConfig, eval_masks
    from tsformer.tasks.masked import SPLIT_SEED_OFFSET
    from tsformer.train import compose_config

    cfg = compose_config(
        ["experiment=imputation_ett", f"data.name={dataset}", f"model.mask_ratio={ratio}"],
        Path(tempfile.mkdtemp()),
    )
    dm = instantiate(cfg.data)
    dm.setup()
    m = cfg.model
    mask_cfg = MaskConfig(m.mask_kind, float(m.mask_ratio), float(m.mask_mean_length))
    out = {}
    for split in ("train", "val", "test"):
        ds = dm.datasets[split]
        rows = ds.starts[:, None] + np.arange(ds.context_len)  # (W, 96)
        windows = ds.target.numpy()[rows].astype(np.float32)  # (W, 96, 7)
        hidden = np.zeros(windows.shape, dtype=bool)
        if split != "train":  # as MaskedFillIn.split_masks draws them
            seed = m.eval_mask_seed * 2 + SPLIT_SEED_OFFSET[split]
            hidden = eval_masks(len(windows), ds.context_len, windows.shape[-1], mask_cfg, seed).numpy()
        out[split] = (windows, hidden)
    return out


def run_row(dataset: str, ratio: float, args) -> dict:
    from pypots.imputation import SAITS

    data = windows_and_masks(dataset, ratio)
    train, _ = data["train"]
    val, val_hidden = data["val"]
    test, test_hidden = data["test"]
    start = time.perf_counter()
    model = SAITS(
        n_steps=train.shape[1],
        n_features=train.shape[2],
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=4,
        d_k=args.d_model // 4,
        d_v=args.d_model // 4,
        d_ffn=2 * args.d_model,
        dropout=0.0,
        batch_size=32,
        epochs=args.epochs,
        patience=None,
        device="cpu",
        saving_path=None,
    )
    model.fit(
        {"X": train},
        {"X": np.where(val_hidden, np.nan, val), "X_ori": val},
    )
    filled = model.predict({"X": np.where(test_hidden, np.nan, test)})["imputation"]
    seconds = time.perf_counter() - start
    err = (filled - test)[test_hidden]
    return {
        "dataset": dataset,
        "ratio": ratio,
        "mse": float((err**2).mean()),
        "mae": float(np.abs(err).mean()),
        "timesnet_mse": PUBLISHED_TIMESNET_ETTH1.get(ratio) if dataset == "ETTh1" else None,
        "test_windows": len(test),
        "seconds": seconds,
    }


def table(rows: list[dict], args, stamp: str) -> str:
    columns = ["dataset", "ratio", "mse", "mae", "timesnet_mse", "test_windows", "seconds"]
    lines = [
        f"Measured {stamp} on {machine()}: `{' '.join(['python benchmarks/imputation_saits.py', *sys.argv[1:]])}`",
        (
            f"(SAITS: {args.layers} layers per block, d_model {args.d_model}, 4 heads, FFN {2 * args.d_model}, "
            f"no dropout, batch 32, {args.epochs} epochs; `seconds`: fit and test)."
        ),
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for r in rows:
        cells = [f"{r[c]:.4f}" if isinstance(r[c], float) and c not in ("ratio", "seconds") else str(r[c])
                 for c in columns]  # fmt: skip
        cells[-1] = f"{r['seconds']:.0f}"
        lines.append("| " + " | ".join("-" if c == "None" else c for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default="ETTh1")
    parser.add_argument("--ratios", default=",".join(str(r) for r in RATIOS))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "RESULTS_imputation.md")
    parser.add_argument("--table", default="SAITS")
    args = parser.parse_args()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for dataset in args.datasets.split(","):
        for ratio in (float(r) for r in args.ratios.split(",")):
            rows.append(run_row(dataset, ratio, args))
            print(table(rows, args, stamp), flush=True)
    write_results(args.results, table(rows, args, stamp), args.table)
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
