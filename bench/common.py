"""What the step benchmarks share: P x G x L shapes and the thread count on the command line, the
synthetic prompts, and the random-init embedded model they run on."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from dapo_core.problem import Problem
from dapo_core.synthetic import arith_problems
from tasks.models.tiny import build_tiny_model
from tasks.params import load_params

DEFAULT_SHAPES = ["16x8x16", "8x8x64"]


def shape(text: str) -> tuple[int, int, int]:
    """'PxGxL' -> (P, G, L); an argparse type, so a bad shape is a one-line usage error."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not PxGxL with positive integers, e.g. 8x8x64"
        )
    P, G, L = (int(p) for p in parts)
    return P, G, L


def sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (asynchronous on CUDA) before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (a rate, a width, a length in seconds)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def top_p(text: str) -> float:
    """An argparse type: a nucleus mass in (0, 1]."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"top-p {text} is above 1: give a value in (0, 1]")
    return value


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser with --shapes and --threads, described by the module docstring."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument(
        "--shapes",
        nargs="+",
        type=shape,
        default=[shape(s) for s in DEFAULT_SHAPES],
        help="P prompts x G samples x L tokens, e.g. 16x8x16",
    )
    ap.add_argument(
        "--threads", type=positive_int, default=1, help="torch threads (1: see docs/benchmarks.md)"
    )
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    return args


def label(P: int, G: int, L: int) -> str:
    return f"{P}x{G}x{L}"


def problems() -> list[Problem]:
    """The synthetic training prompts every step benchmark draws from."""
    return arith_problems(1, 800, 0, 9, 3)[0]


def random_tiny_model(out_dir: Path) -> Path:
    """The embedded model's architecture and tokenizer, random weights (no warm start)."""
    return build_tiny_model(load_params().tiny, problems(), out_dir, seed=0)
