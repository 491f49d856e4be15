"""The demo that `make demo` runs: the largest slice of the pipeline that works end to end.

Until the RL engine lands, it walks one DAPO step through the pure core on the synthetic task:
a stand-in policy answers each prompt G times, the rule-based reward scores the text, dynamic
sampling drops the uninformative groups, advantages and the decoupled-clip loss follow, and the
evaluation metrics summarise the samples.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from dapo_core.advantages import group_advantages
from dapo_core.config import ABLATION_LADDER, apply_variant
from dapo_core.loss import policy_loss
from dapo_core.metrics import avg_at_k, bootstrap_ci, mean_pass_at_k
from dapo_core.overlong import overlong_filter_mask, shaped_rewards
from dapo_core.reward import score
from dapo_core.sampling import GroupAccumulator, fill_batch
from tasks.params import load_params


def _noisy_policy(a: int, b: int, skill: float, rng: random.Random) -> tuple[str, int, bool]:
    """A stand-in for the model: right with probability ``skill``; sometimes rambles on."""
    guess = a + b if rng.random() < skill else a + b + rng.choice([-2, -1, 1, 2])
    truncated = rng.random() < 0.1
    text = f"{a} plus {b} is" + (" ..." * 8 if truncated else f"\nAnswer: {guess}")
    return text, (16 if truncated else rng.randint(4, 10)), truncated


def run_demo() -> None:
    console = Console()
    cfg = load_params()
    console.rule("DAPO core walk-through on the synthetic task (embedded default)")
    rng = random.Random(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    G = cfg.rollout.group_size
    problems = iter([(rng.randint(0, 19), rng.randint(0, 19)) for _ in range(10_000)])

    table = Table(title="One training step per Table 1 variant")
    for col in ("variant", "gen batches", "kept groups", "loss", "clip_frac_high", "acc"):
        table.add_column(col)
    for variant in ABLATION_LADDER:
        vcfg = apply_variant(cfg, variant)

        def generate(n: int):
            groups, accs = [], []
            for _ in range(n):
                a, b = next(problems)
                samples = [_noisy_policy(a, b, 0.4, rng) for _ in range(G)]
                scores = [score(t, str(a + b)) for t, _, _ in samples]
                groups.append((samples, scores))
                accs.append([s.acc for s in scores])
            return groups, torch.tensor(accs)

        batch, stats = fill_batch(
            generate,
            GroupAccumulator(),
            step=0,
            prompt_batch=vcfg.train.prompt_batch,
            gen_batch=vcfg.train.gen_batch,
            max_gen_batches=vcfg.algo.max_gen_batches,
            on_gen_cap=vcfg.algo.on_gen_cap,
            dynamic_sampling=vcfg.algo.dynamic_sampling,
        )
        acc = torch.tensor([[s.acc for s in scores] for _, scores in batch])  # (P, G)
        lengths = torch.tensor([[n for _, n, _ in samples] for samples, _ in batch])
        truncated = torch.tensor([[t for _, _, t in samples] for samples, _ in batch])
        a = vcfg.algo
        rewards = shaped_rewards(
            acc.flatten(),
            lengths.flatten(),
            overlong_shaping=a.overlong_shaping,
            max_len=vcfg.rollout.max_response_len,
            cache_len=a.cache_len,
            factor=a.overlong_penalty_factor,
        ).view_as(acc)
        adv = group_advantages(rewards).flatten()  # (P*G,)
        T = vcfg.rollout.max_response_len
        mask = (torch.arange(T)[None, :] < lengths.flatten()[:, None]).float()
        mask = overlong_filter_mask(
            mask, truncated.flatten(), overlong_filtering=a.overlong_filtering
        )
        old_logp = -torch.rand(len(adv), T) * 3
        logp = old_logp + torch.randn_like(old_logp) * 0.3  # as after a few updates
        loss, m = policy_loss(logp, old_logp, adv, mask, a.loss_config())
        table.add_row(
            variant,
            str(stats.num_gen_batches),
            f"{stats.groups_kept}/{stats.groups_generated}",
            f"{loss.item():+.4f}",
            f"{m['clip_frac_high'].item():.3f}",
            f"{acc.float().mean():.2f}",
        )
    console.print(table)

    correct = np.array([[s.acc for s in scores] for _, scores in batch])
    low, high = bootstrap_ci(correct.mean(axis=1), seed=0)
    console.print(
        f"eval metrics of the last batch: avg@{G} {avg_at_k(correct):.3f} "
        f"(95% CI {low:.3f}-{high:.3f}), pass@4 {mean_pass_at_k(correct, 4):.3f}"
    )
    console.print("Next: `dapo variants` lists the ladder; `make test` runs the suite.")
