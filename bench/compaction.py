"""Rollout decode with finished sequences dropped from the batch, against decoding the whole batch
to the end (the baseline, measured in the same run, interleaved).

A trained model's responses vary in length; without compaction every decode step runs the whole
batch until its longest response ends. Both sides sample with the same seed, and compaction
changes no sample (``HFGenerator`` draws one uniform per sequence of the whole batch), so both
decode exactly the same rollouts: the bench checks that, then reports the median wall time, the
decoded rows (sequences x decode steps, the hardware-independent work) and the length mix.

    python -m bench.compaction                                   # the chain task's model
    python -m bench.compaction -c configs/smollm2-135m.yaml -S rollout.max_response_len=96

The model is the config's (built or warm-started first if missing, as training would); prompts
are the first ``-P`` problems of its training split, ``rollout.group_size`` samples each, at the
rollout temperature and top-p, up to ``rollout.max_response_len`` tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import bench
from bench.common import positive_int
from tasks.data.splits import splits
from tasks.models.loading import chat_prompt, load_policy
from tasks.models.resolve import resolve_model_path
from tasks.params import load_params
from tasks.rollout.decode import LeanDecoder
from tasks.rollout.generators import HFGenerator
from tasks.rollout.graphs import StaticDecoder

DECODERS = (LeanDecoder, StaticDecoder)  # the decode steps whose rows are counted


def rollout(gen: HFGenerator, prompts: list[str], cfg, seed: int):
    """(rollouts, seconds, rows decoded) of one seeded call."""
    rows = 0
    steps = {cls: cls.step for cls in DECODERS}  # StaticDecoder (CUDA) has its own step

    def counting(step):
        def count(self, tokens, positions):
            nonlocal rows
            rows += len(tokens)
            return step(self, tokens, positions)

        return count

    for cls, step in steps.items():
        cls.step = counting(step)
    try:
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        r = cfg.rollout
        out = gen.generate(prompts, r.group_size, r.temperature, r.top_p, r.max_response_len)
        return out, time.perf_counter() - t0, rows
    finally:
        for cls, step in steps.items():
            cls.step = step


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", type=Path, action="append", default=None)
    ap.add_argument("-S", "--set", dest="overrides", action="append", default=[])
    ap.add_argument("-P", "--prompts", type=positive_int, default=32)
    ap.add_argument("--repeats", type=positive_int, default=5)
    ap.add_argument("--threads", type=positive_int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    configs = a.config or [Path("configs/chain.yaml")]
    cfg = load_params(overlays=configs, overrides=a.overrides)
    model, tok = load_policy(resolve_model_path(cfg))
    if not LeanDecoder.supports(model):
        raise SystemExit(f"{cfg.model.name_or_path}: no lean decode path, so no compaction")
    prompts = [chat_prompt(tok, p.prompt) for p in splits(cfg).train[: a.prompts]]
    gens = {k: HFGenerator(model, tok, cfg.rollout.max_prompt_len, compact=k) for k in (1, 0)}
    times: dict[int, list[float]] = {1: [], 0: []}
    rows: dict[int, int] = {}
    for rep in range(a.repeats + 1):  # the first round warms up
        outs = {}
        for k, gen in gens.items():
            outs[k], seconds, rows[k] = rollout(gen, prompts, cfg, seed=rep)
            if rep:
                times[k].append(seconds)
        assert outs[1].response_ids == outs[0].response_ids, "compaction changed a sample"
    lengths = sorted(outs[1].lengths)
    n, L = len(lengths), cfg.rollout.max_response_len
    print(
        f"{', '.join(map(str, configs))}: {a.prompts} prompts x {cfg.rollout.group_size} samples,"
        f" up to {L} tokens, {a.threads} thread(s), medians of {a.repeats}"
    )
    print(
        f"response lengths: min {lengths[0]}, median {lengths[n // 2]}, max {lengths[-1]}; "
        f"{sum(not f for f in outs[1].finished) / n:.0%} truncated at {L}"
    )
    tokens = sum(lengths)
    for k, name in ((0, "whole batch"), (1, "compacted")):
        med = statistics.median(times[k])
        print(f"{name:>12}: {med:.3f} s, {tokens / med:,.0f} tokens/s, {rows[k]:,} rows decoded")
    ratio = statistics.median(times[1]) / statistics.median(times[0])
    print(f"compacted / whole: time {ratio:.2f}, rows {rows[1] / rows[0]:.2f}")


if __name__ == "__main__":
    bench.run(main)
