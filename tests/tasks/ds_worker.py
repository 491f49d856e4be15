"""One DAPO update on a fixed global batch; run as 1 process or under torchrun/deepspeed, for each
(params, out) pair of the command line in turn.

Used by test_distributed.py: the parameters after the update must not depend on the world size.
"""

import dataclasses
import sys

import torch

from dapo_core.config_loader import resolve
from tasks.data.splits import splits
from tasks.models.loading import load_policy
from tasks.rollout.generators import HFGenerator
from tasks.training.batches import Group
from tasks.training.distributed import shutdown_distributed
from tasks.training.records import RolloutLog
from tasks.training.trainer import DAPOTrainer


def fixed_groups(n_prompts: int, group_size: int, vocab: int) -> list[Group]:
    """Deterministic groups with varied lengths and mixed correctness (no sampling involved)."""
    g = torch.Generator().manual_seed(0)
    groups = []
    for i in range(n_prompts):
        prompt = torch.randint(3, vocab, (3 + i % 4,), generator=g).tolist()
        responses = [
            torch.randint(3, vocab, (1 + (i + j) % 5,), generator=g).tolist()
            for j in range(group_size)
        ]
        acc = [(i + j) % 3 == 0 for j in range(group_size)]
        # Sampler log-probs far above the model's (~ -log vocab): TIS weights far below 1.
        logprobs = [-1.0 - 0.5 * (torch.arange(len(r)) % 3).float() for r in responses]
        blank = [""] * group_size
        groups.append(
            Group(f"p{i}", "0", prompt, responses, [True] * group_size, acc, blank, logprobs)
        )
    return groups


def main(params_json: str, out: str) -> None:
    import json
    from pathlib import Path

    cfg = resolve(json.loads(Path(params_json).read_text()))
    torch.manual_seed(0)
    model, tok = load_policy(cfg.tiny.path, "float32")
    gen = HFGenerator(model, tok, cfg.rollout.max_prompt_len)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    critic_opt = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    t = DAPOTrainer(
        cfg, model, tok, gen, splits(cfg).train, optimizer=opt, critic_optimizer=critic_opt
    )
    before = t.engine.full_state_dict()
    groups = fixed_groups(6, cfg.rollout.group_size, len(tok))
    samples, _ = t.loss_samples(groups)
    if t.reference is not None:  # KL on: a reference the policy differs from, so the term counts
        g = torch.Generator().manual_seed(1)  # the same on every rank
        for p in t.reference.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    ref = t.updater.ref_logprobs([samples]) if t.reference is not None else None
    micro_batches = len(t.updater.micro_batches(samples))  # this rank's (a collective: all call it)
    stats = t.updater.update(samples, ref=ref)
    state = t.engine.full_state_dict()  # a collective under ZeRO-3: every rank takes part
    critic = {}
    if t.critic is not None:  # PPO: the critic's update, then a second round from its values
        first, _ = t.updater.critic_update(samples, t.lr_at(t.step))
        # V != 0 now: gae reads it, the value loss's gradient reaches the transformer
        samples, batch_stats = t.loss_samples(groups)
        second, _ = t.updater.critic_update(samples, t.lr_at(t.step))
        critic = {
            "stats": [first, second],
            "values": [s.old_values for s in samples],
            "returns": [s.returns for s in samples],
            "advantages": [s.token_advantages for s in samples],
            "explained_variance": batch_stats["train/explained_variance"],
            "state": t.critic.full_state_dict(),  # a collective under ZeRO-3
        }
    # An update where no sample carries loss (every advantage 0): no rank has a micro-batch,
    # and nothing moves (unless a KL term pulls toward the reference)
    idle = [dataclasses.replace(s, advantage=0.0, token_advantages=None) for s in samples]
    ref = t.updater.ref_logprobs([idle]) if t.reference is not None else None
    update = t.updater.update(idle, ref=ref)
    after = t.engine.full_state_dict()
    idle = {
        "grad_norm": update.grad_norm,
        "applied": update.applied,
        "moved": any(not torch.equal(after[k], state[k]) for k in state),
    }
    # Sharded rollouts: each rank generates its slice; every rank ends with all groups, in order.
    log = RolloutLog()
    local = []
    generate = t.rollouts.generator.generate
    t.rollouts.generator.generate = lambda prompts, *a: (
        local.append(len(prompts)) or generate(prompts, *a)
    )
    groups, acc = t.rollouts.generate(5, log)
    rollout = {"ids": [g.problem_id for g in groups], "acc_shape": tuple(acc.shape)}
    rollout["local_prompts"] = sum(local)
    if t.rank == 0:
        torch.save(
            {
                "before": before,
                "state": state,
                "stats": dataclasses.asdict(stats),
                "world": t.world,
                "rollout": rollout,
                "micro_batches": micro_batches,
                "critic": critic,
                "idle": idle,
            },
            out,
        )


if __name__ == "__main__":
    pairs = sys.argv[1:]
    for i in range(0, len(pairs), 2):
        main(pairs[i], pairs[i + 1])
    shutdown_distributed()
