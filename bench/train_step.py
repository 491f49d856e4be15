"""Train-step benchmark on CPU: our DAPO update against a naive update, measured in one run.

Both sides train the same policy on the same rollouts (P prompts x G samples of up to L tokens),
with the same loss (the trainer's ``algo`` entries: DAPO's clip, token-level, global count):

- ours: micro-batches under a token budget, each distinct prompt forwarded once and shared by its
  samples, only response positions projected onto the vocabulary (chunked), zero-advantage
  samples skipped, RMSNorm with a hand-written backward;
- naive: the whole batch padded to its longest sequence, full (B, T, V) logits and log-softmax,
  every sample through forward and backward.

Runs are interleaved (ours, naive, ours, ...), the first of each dropped as warm-up; medians and the
ratio are printed. (Generation throughput: ``python -m bench.generation``.)

    python -m bench.train_step --shapes 16x8x16 8x8x64 --repeats 7
"""

from __future__ import annotations

import statistics
import time

import torch

import bench
from bench import common
from dapo_core.algos import TokenBatch, aggregate
from tasks.data.splits import splits
from tasks.models.loading import load_policy
from tasks.models.resolve import resolve_model_path
from tasks.params import load_params
from tasks.rollout.generators import HFGenerator
from tasks.training.batches import Group
from tasks.training.records import RolloutLog
from tasks.training.trainer import DAPOTrainer


def naive_update(trainer: DAPOTrainer, samples) -> None:
    """One update the straightforward way: pad everything, full-vocabulary log-softmax."""
    model, pad = trainer.model, trainer.tokenizer.pad_token_id
    width = max(len(s.input_ids) for s in samples)
    ids = torch.tensor([s.input_ids + [pad] * (width - len(s.input_ids)) for s in samples])
    attn = (ids != pad).long()
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (B, T-1, V)
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    mask = torch.zeros_like(logp)
    for i, s in enumerate(samples):
        mask[i, s.prompt_len - 1 : len(s.input_ids) - 1] = 1.0
    adv = torch.tensor([s.advantage for s in samples])[:, None].expand_as(logp)
    alg = trainer.algorithm
    loss_t, _ = alg.loss(TokenBatch(logp, logp.detach(), adv, mask))
    loss = aggregate(alg.aggregation.entry, alg.aggregation.params, loss_t, mask.bool())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    trainer.engine.optimizer.step()
    trainer.engine.optimizer.zero_grad(set_to_none=True)


def rollouts(trainer: DAPOTrainer, P: int, L: int) -> list[Group]:
    """Fixed rollouts of up to L tokens (sampled once; reused by both sides)."""
    log = RolloutLog()
    groups, _ = trainer.rollouts.generate(P, log)
    # Mixed correctness, like a batch after dynamic sampling.
    for i, g in enumerate(groups):
        g.acc = [(i + j) % 2 == 0 for j in range(len(g.acc))]
    return groups


def bench_shape(cfg_base, P: int, G: int, L: int, repeats: int) -> dict[str, float]:
    cfg = load_params(
        overrides=[
            *cfg_base,
            f"rollout.group_size={G}",
            f"rollout.max_response_len={L}",
            f"algo.cache_len={max(1, L // 4)}",
            f"train.prompt_batch={P}",
            f"train.mini_batch={P}",
        ]
    )
    model, tok = load_policy(resolve_model_path(cfg), "float32")
    gen = HFGenerator(model, tok, cfg.rollout.max_prompt_len)
    trainer = DAPOTrainer(cfg, model, tok, gen, splits(cfg).train)
    torch.manual_seed(0)
    groups = rollouts(trainer, P, L)
    samples, _ = trainer.loss_samples(groups)
    ours, naive = [], []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        trainer.updater.update(samples)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        naive_update(trainer, samples)
        naive.append(time.perf_counter() - t)
    ours_med, naive_med = statistics.median(ours[1:]), statistics.median(naive[1:])
    return {
        "ours_s": ours_med,
        "naive_s": naive_med,
        "ratio": ours_med / naive_med,
    }


def main(argv: list[str] | None = None) -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--repeats", type=common.positive_int, default=7)
    args = common.parse(ap, argv)
    base = [f"train.cpu_threads={args.threads}"]
    print(f"torch {torch.__version__}, {args.threads} thread(s); medians of {args.repeats} updates")
    print(f"{'shape PxGxL':>12} {'ours s':>8} {'naive s':>8} {'ratio':>6}")
    for P, G, L in args.shapes:
        r = bench_shape(base, P, G, L, args.repeats)
        print(
            f"{common.label(P, G, L):>12} {r['ours_s']:8.3f} {r['naive_s']:8.3f} {r['ratio']:6.2f}"
        )


if __name__ == "__main__":
    bench.run(main)
