"""Cost of sampled trajectories: S paths per window through the KV cache against one point rollout.

    python benchmarks/sampling.py                      # 64 windows, 100 paths, 18 steps, the T1 model's size
    python benchmarks/sampling.py --samples 200 --device cuda

Both run the same network (decoder-only and encoder-decoder, with a Student-t head) on the same
batch: the point rollout feeds back the point value (one path per window, B sequences); sampling
feeds back a random draw (S paths per window, B * S sequences in one batch: the history is run once
per window and its keys/values are shared by the paths, `KVCache.share`, not copied). Repeats are interleaved (point, sampled, point, ...)
so that a noisy neighbour on a shared machine hits both alike; the ratio of the medians is printed.
Issue 7 asks for less than 5x at 64 windows x 100 paths x 18 steps.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import seconds

from tsformer.models import DecoderOnly, DecoderOnlyConfig, EncoderDecoder, EncoderDecoderConfig
from tsformer.nn.heads import StudentTHead


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--horizon", type=int, default=18)
    parser.add_argument("--context", type=int, default=100)
    parser.add_argument("--d-model", type=int, default=32)  # experiment=wind_scada's model
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    dev, B, S, N, M = args.device, args.batch, args.samples, args.context, args.horizon
    head = StudentTHead()
    shared = {
        "d_model": args.d_model,
        "n_heads": args.heads,
        "n_layers": args.layers,
        "n_params": head.n_params,
    }
    d_target, d_known = 1, 3  # T1: power; wind speed, direction sin and cos
    dec = DecoderOnly(DecoderOnlyConfig(d_target=d_target, d_known=d_known, **shared)).to(dev).eval()
    encdec = (
        EncoderDecoder(
            EncoderDecoderConfig(d_enc_in=d_target + d_known, d_target=d_target, d_known=d_known, **shared)
        )
        .to(dev)
        .eval()
    )
    hist_y, hist_k = torch.randn(B, N, d_target, device=dev), torch.randn(B, N, d_known, device=dev)
    fut_k = torch.randn(B, M, d_known, device=dev)
    hist = torch.cat([hist_y, hist_k], dim=-1)

    runs = {
        "DecoderOnly": (
            lambda: dec.generate(hist_y, hist_k, fut_k, draw=head.point_of_raw),
            lambda: dec.generate(hist_y, hist_k, fut_k, draw=head.sample_of_raw, num_samples=S),
        ),
        "EncoderDecoder": (
            lambda: encdec.generate(hist, hist_y[:, -1], fut_k, draw=head.point_of_raw),
            lambda: encdec.generate(hist, hist_y[:, -1], fut_k, draw=head.sample_of_raw, num_samples=S),
        ),
    }
    print(
        f"device={dev} torch={torch.__version__} threads={torch.get_num_threads()} windows={B} paths={S} "
        f"steps={M} context={N} d_model={args.d_model} layers={args.layers} heads={args.heads} "
        f"repeats={args.repeats} (interleaved; medians)"
    )
    print(f"{'model':<16}{'point s':>10}{'sampled s':>12}{'ratio':>8}")
    for name, (point, sampled) in runs.items():
        assert sampled().shape == (B * S, M, d_target)
        point()  # warm-up
        t_point, t_sampled = [], []
        for _ in range(args.repeats):
            t_point.append(seconds(point, dev))
            t_sampled.append(seconds(sampled, dev))
        p, s = statistics.median(t_point), statistics.median(t_sampled)
        print(f"{name:<16}{p:>10.4f}{s:>12.4f}{s / p:>7.2f}x")


if __name__ == "__main__":
    main()
