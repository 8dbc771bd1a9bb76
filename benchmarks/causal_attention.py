"""What a causal mask saves in the fused attention kernel, at the step-level decoder-only's shape.

    python benchmarks/causal_attention.py                     # (224, 4, 191, 16): --throughput's dec_only
    python benchmarks/causal_attention.py --shape 224 4 96 16

The decoder-only model trains one token per step on L + H - 1 tokens under a causal mask: half the
scores are masked. Whether that halves the attention's work depends on the kernel. This times one
self-attention forward + backward (`tsformer.nn.attention.scaled_dot_product_attention`) with and
without the mask, and two ways round the kernel, all in one run, as ratios to the causal fused path:
- "full": the same kernel without the mask (what the mask saves: the difference);
- "query blocks k": the queries cut in k blocks, each attending only to the keys up to its end (the
  later blocks with a lower-right causal mask): the masked scores above the blocks are never computed;
- "reference": the formula spelled out (matmuls and a masked softmax).
The outputs of the block split are checked equal to the fused path's first. Medians of `--repeats`
rounds, each round timing every variant once, interleaved (the machine's load hits all alike).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import platform

import torch
import torch.nn.functional as F
from timing import seconds

from tsformer.nn.attention import scaled_dot_product_attention


def query_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Causal attention with the queries in `n_blocks` blocks, block [a, b) over keys [0, b) only."""
    T = q.shape[-2]
    edges = [round(T * i / n_blocks) for i in range(n_blocks + 1)]
    outs = []
    for a, b in itertools.pairwise(edges):
        if a == 0:  # the first block is square: the kernel's own causal mask
            out = F.scaled_dot_product_attention(q[:, :, :b], k[:, :, :b], v[:, :, :b], is_causal=True)
        else:  # query a + i sees keys 0 .. a + i: a lower-right causal mask over the b keys
            mask = torch.ones(b - a, b, dtype=torch.bool, device=q.device).tril(a)  # (b - a, b)
            out = F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, :b], v[:, :, :b], attn_mask=mask)
        outs.append(out)  # (B, H, b - a, Dh)
    return torch.cat(outs, dim=-2)  # (B, H, T, Dh)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape", type=int, nargs=4, default=[224, 4, 191, 16], metavar=("B", "H", "T", "DH")
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    dev = torch.device(args.device)
    q, k, v = (torch.randn(*args.shape, device=dev, requires_grad=True) for _ in range(3))  # (B, H, T, Dh)
    grad = torch.randn(*args.shape, device=dev)
    variants = {
        "causal (fused)": lambda: scaled_dot_product_attention(q, k, v, causal=True)[0],
        "full (fused, no mask)": lambda: scaled_dot_product_attention(q, k, v)[0],
        **{f"query blocks {n}": functools.partial(query_blocks, q, k, v, n) for n in (2, 3, 4)},
        "reference (causal)": lambda: scaled_dot_product_attention(q, k, v, causal=True, fused=False)[0],
    }
    with torch.no_grad():
        want = variants["causal (fused)"]()
        for n in (2, 3, 4):
            torch.testing.assert_close(query_blocks(q, k, v, n), want, rtol=1e-4, atol=1e-5)

    def timed(fn) -> float:
        return seconds(lambda: fn().backward(grad), args.device)

    for fn in variants.values():
        timed(fn)  # warm-up
    times = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            times[name].append(timed(fn))
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    base = median["causal (fused)"]
    print(
        f"{platform.machine()} {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"q, k, v {tuple(args.shape)} (B, H, T, Dh); forward + backward, median of {args.repeats}\n"
    )
    print("| variant | ms | vs causal (fused) |\n|---|---|---|")
    for name, t in median.items():
        print(f"| {name} | {t * 1e3:.1f} | {t / base:.2f}x |")


if __name__ == "__main__":
    main()
