"""KV cache speed-up: time to generate H steps with and without the cache, measured in one run.

    python benchmarks/kv_cache.py                 # d_model 128, 3 layers, 4 heads, batch 32, context 96
    python benchmarks/kv_cache.py --horizons 96 336 --device cuda

Without the cache every new step re-runs the decoder over the whole sequence so far (O(t^2)
attention per step); with it each step projects only the new token (O(t) per step). The figures
printed are measured here and now; compare ratios, not absolute times (shared machines are noisy).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from timing import seconds

from tsformer.models import DecoderOnly, DecoderOnlyConfig, EncoderDecoder, EncoderDecoderConfig


def timed(fn, device: str, repeats: int) -> float:
    """Best wall-clock seconds of `repeats` calls."""
    return min(seconds(fn, device) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--horizons", type=int, nargs="+", default=[96, 336, 720])
    parser.add_argument("--context", type=int, default=96)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="best of this many runs per setting")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    dev = args.device
    shared = {
        "d_model": args.d_model,
        "n_heads": args.heads,
        "n_layers": args.layers,
        "positional": "sinusoidal",
    }
    d_target, d_known = 1, 2
    models = {
        "DecoderOnly": DecoderOnly(DecoderOnlyConfig(d_target=d_target, d_known=d_known, **shared)),
        "EncoderDecoder": EncoderDecoder(
            EncoderDecoderConfig(d_enc_in=d_target + d_known, d_target=d_target, d_known=d_known, **shared)
        ),
    }
    B, N = args.batch, args.context
    print(
        f"device={dev} torch={torch.__version__} threads={torch.get_num_threads()} batch={B} context={N} "
        f"d_model={args.d_model} layers={args.layers} heads={args.heads}"
    )
    print(
        f"{'model':<15} {'horizon':>7} {'uncached s':>11} {'cached s':>9} {'speed-up':>9} {'cached ms/step':>15}"
    )
    for name, model in models.items():
        model.to(dev).eval()
        for H in [8, *args.horizons]:  # the first, short horizon only warms up (not printed)
            hist_y = torch.randn(B, N, d_target, device=dev)
            hist_k = torch.randn(B, N, d_known, device=dev)
            fut_k = torch.randn(B, H, d_known, device=dev)
            if name == "DecoderOnly":
                inputs = (hist_y, hist_k, fut_k)
            else:
                inputs = (torch.cat([hist_y, hist_k], dim=-1), hist_y[:, -1], fut_k)
            cached = timed(partial(model.generate, *inputs, use_cache=True), dev, args.repeats)
            uncached = timed(partial(model.generate, *inputs, use_cache=False), dev, args.repeats)
            if H == 8:
                continue
            print(
                f"{name:<15} {H:>7} {uncached:>11.3f} {cached:>9.3f} {uncached / cached:>8.1f}x "
                f"{1000 * cached / H:>15.2f}"
            )


if __name__ == "__main__":
    main()
