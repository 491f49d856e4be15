"""A/B of the training loop across two checkouts: the same N steps, every ``train/*`` metric and
the final weights compared (issue 24: "DAPO unchanged" after the trainer moved to the registries).

Run a step log with each checkout on PYTHONPATH, then compare (the model is built once, into
``--model``, by whichever runs first; the build code is the same on both sides):

    git archive <old commit> | tar -x -C /tmp/ab-old
    (cd /tmp/ab-old && PYTHONPATH=. python /path/to/bench/ab_trainer.py run old.pt grpo)
    PYTHONPATH=. python -m bench.ab_trainer run new.pt grpo
    python -m bench.ab_trainer compare old.pt new.pt

``run OUT VARIANT [-S overrides...]``: the tests' tiny config, no dynamic sampling, lr at full
value from step 1, rewards by response-length parity (mixed groups before the model can answer).
Measured at the registries' commit, 4-6 steps, default and ``grpo``, token budgets 64 and 24, TIS
cap 1.2: weights bitwise equal; metrics equal but for ``clip_frac_*`` and ``clip_high_old_prob``,
within 7e-9 (before, a micro-batch's share was rounded to float32 before it was re-weighted).
"""

from __future__ import annotations

import os
import sys

import torch

import bench


def run(out: str, variant: str, *extra: str) -> None:
    from dapo_core.ablation import apply_variant
    from tasks.data.splits import splits
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.params import load_params
    from tasks.rollout.generators import HFGenerator
    from tasks.training.trainer import DAPOTrainer
    from tests.conftest import TINY_OVERRIDES

    torch.set_num_threads(1)
    model_dir = os.environ.get("AB_MODEL", "/tmp/ab/model")
    sets = [*TINY_OVERRIDES, f"tiny.path={model_dir}", "train.warmup_steps=1"]
    cfg = load_params(overrides=[*sets, "algo.dynamic_sampling=false", *extra])
    cfg = cfg if variant == "default" else apply_variant(cfg, variant)
    model, tok = load_policy(resolve_model_path(cfg), "float32")
    gen = HFGenerator(model, tok, cfg.rollout.max_prompt_len)
    parity = lambda response, _: len(response) % 2 == 0  # noqa: E731
    t = DAPOTrainer(cfg, model, tok, gen, splits(cfg).train, reward_fn=parity)
    metrics = [t.train_step().metrics for _ in range(int(os.environ.get("AB_STEPS", 4)))]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"metrics": metrics, "state": state}, out)


def compare(old_path: str, new_path: str) -> None:
    old, new = torch.load(old_path), torch.load(new_path)
    worst = 0.0
    for step, (a, b) in enumerate(zip(old["metrics"], new["metrics"], strict=True)):
        for k in sorted(k for k in a if k.startswith("train/")):
            if k not in b:
                print(f"step {step}: {k} missing in the new log")
                continue
            worst = max(worst, abs(a[k] - b[k]))
    equal = all(torch.equal(old["state"][k], new["state"][k]) for k in old["state"])
    print(f"max |metric diff| {worst:.3g}; final weights bitwise equal: {equal}")


if __name__ == "__main__":
    bench.run(lambda: {"run": run, "compare": compare}[sys.argv[1]](*sys.argv[2:]))
