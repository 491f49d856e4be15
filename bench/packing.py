"""Micro-batch packing: tokens fed to the update (padding included) on math-like length mixes.

The update runs each micro-batch as rectangles: its distinct prompts padded to the longest prompt,
its responses padded to the longest response (``tasks.training.forward``). The baseline, measured
in the same run, is group-major packing (whole groups, longest first: a group's prompt runs once,
its responses pad up to the group's longest); ``best`` is what the trainer uses, the cheaper of
that and length-major packing (``tasks.training.batches.micro_batches``). Hardware-independent:
fewer fed tokens is proportionally less forward and backward work on any device.

Response lengths follow a log-normal (median ``--median`` x L, sigma ``--sigma``), clipped to
[8, L] so that a tail is truncated at L as in real math rollouts; prompt lengths are uniform in
``--prompt-len``. Each figure is the median over ``--trials`` random batches.

    python -m bench.packing
    python -m bench.packing --cases 8x8x1024@16384 --trials 50
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import bench
from bench.common import positive_float, positive_int, shape
from tasks.training.batches import fed_tokens, micro_batches, padding_fraction

PACKINGS = ("group", "length", "best")
# (P x G x L, token budget): the chain preset's step, the issue-12 shape, a long-response shape.
DEFAULT_CASES = [("16x8x50", 4096), ("8x8x1024", 16384), ("64x16x8192", 32768)]


def lengths(P: int, G: int, L: int, args, rng) -> tuple[list[int], list[int], list[int]]:
    """(prompt id, prompt length, response length) per sample, G samples per prompt."""
    lo, hi = args.prompt_len
    prompt_len = rng.integers(lo, hi + 1, size=P)
    resp = rng.lognormal(np.log(args.median * L), args.sigma, size=P * G)
    resp = np.clip(resp, min(8, L), L).astype(int)
    prompts = [p for p in range(P) for _ in range(G)]
    return prompts, [int(prompt_len[p]) for p in prompts], resp.tolist()


def measure(P: int, G: int, L: int, budget: int, args) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(args.seed)
    rows: dict[str, list[tuple[int, float]]] = {k: [] for k in PACKINGS}
    for _ in range(args.trials):
        prompts, prompt_lens, response_lens = lengths(P, G, L, args, rng)
        for k in PACKINGS:
            batches = micro_batches(prompts, prompt_lens, response_lens, budget, packing=k)
            fed = sum(fed_tokens(b, prompts, prompt_lens, response_lens) for b in batches)
            rows[k].append((fed, padding_fraction(prompts, prompt_lens, response_lens, batches)))
    return {
        k: {
            "fed": statistics.median(f for f, _ in v),
            "padding": statistics.median(p for _, p in v),
            "vs_group": statistics.median(
                f / g for (f, _), (g, _) in zip(v, rows["group"], strict=True)
            ),
        }
        for k, v in rows.items()
    }


def _case(text: str) -> tuple[tuple[int, int, int], int]:
    shape_text, _, budget = text.partition("@")
    return shape(shape_text), positive_int(budget or "16384")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases",
        nargs="*",
        type=_case,
        default=[_case(f"{s}@{b}") for s, b in DEFAULT_CASES],
        help="PxGxL@budget, e.g. 8x8x1024@16384",
    )
    ap.add_argument("--median", type=positive_float, default=0.3, help="median length / L")
    ap.add_argument("--sigma", type=positive_float, default=0.7, help="log-normal sigma of lengths")
    ap.add_argument("--prompt-len", type=positive_int, nargs=2, default=[60, 200])
    ap.add_argument("--trials", type=positive_int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(
        f"response lengths log-normal (median {args.median} L, sigma {args.sigma}, in [8, L]), "
        f"prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens; medians of {args.trials}"
    )
    header = ("P x G x L @ budget", "packing", "fed tokens", "padding", "vs group")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (22, 8, 11, 8, 9), strict=True)))
    for (P, G, L), budget in args.cases:
        for k, r in measure(P, G, L, budget, args).items():
            case = f"{P}x{G}x{L} @ {budget}"
            print(f"{case:>22} {k:>8} {r['fed']:>11.0f} {r['padding']:>8.1%} {r['vs_group']:>9.2f}")


if __name__ == "__main__":
    bench.run(main)
