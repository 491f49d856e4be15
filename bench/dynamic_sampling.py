"""Dynamic-sampling waste on the embedded default: samples generated per sample trained on.

DAPO's dynamic sampling (section 3.2) drops groups whose G answers are all right or all wrong and
generates more until the batch is full. If a fraction f of groups is informative, no sampler can
do better than 1/f generated samples per trained sample. Ours keeps the surplus informative groups
of the last generation batch for the next step (capped at one batch), so over a run it should come
close to that bound. A sampler that discards the surplus, as the reference implementation does,
pays for it on top.

The embedded default (warm-started tiny model, synthetic arithmetic) is trained for ``--steps``
steps with dynamic sampling on. The run's totals are printed: groups generated, groups trained on,
the kept fraction f, generated/trained, and their ratio to 1/f ("waste"; 1.00 is the bound, and a
short run from an empty carry pays a little extra for the groups still carried at its end).
Every step generates at least one batch (fresh samples from the current policy), so a fixed batch
larger than prompt_batch / f leaves a surplus each step that the carry cap ends up dropping. Three
runs: fixed batches of the configured ``train.gen_batch``; fixed batches tuned by hand to
prompt_batch / f; batches sized on the fly (``algo.size_gen_batches``, the default).

    python -m bench.dynamic_sampling --steps 8
"""

from __future__ import annotations

import argparse
import math

import torch

import bench
from bench import common
from tasks.data.splits import splits
from tasks.models.loading import load_policy
from tasks.models.resolve import resolve_model_path
from tasks.params import load_params
from tasks.rollout.factory import make_generator
from tasks.training.trainer import DAPOTrainer


def measure(steps: int, overrides: list[str] | None = None) -> dict[str, float]:
    cfg = load_params(overrides=["algo.dynamic_sampling=true", *(overrides or [])])
    path = resolve_model_path(cfg)
    model, tok = load_policy(path, cfg.model.dtype)
    generated = kept = trained = 0
    trainer = DAPOTrainer(cfg, model, tok, make_generator(cfg, model, tok, path), splits(cfg).train)
    for _ in range(steps):
        m = trainer.train_step().metrics
        generated += m["train/groups_generated"]
        kept += m["train/kept_group_frac"] * m["train/groups_generated"]
        trained += m["train/groups_in_batch"]
    f = kept / generated
    return {
        "groups_generated": generated,
        "groups_trained": trained,
        "kept_frac": f,
        "generated_per_trained": generated / trained,
        "bound": 1 / f,
        "waste": generated / trained * f,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=common.positive_int, default=8)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_params()
    print(f"dynamic sampling over {args.steps} steps of the embedded default")
    header = ("generation batches", "generated", "trained", "kept f", "gen/trained", "1/f", "waste")
    widths = (26, 10, 8, 7, 12, 6, 6)
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))

    def row(label: str, overrides: list[str]) -> dict[str, float]:
        r = measure(args.steps, overrides)
        print(
            f"{label:>26} {r['groups_generated']:10.0f} {r['groups_trained']:8.0f} "
            f"{r['kept_frac']:7.2f} {r['generated_per_trained']:12.2f} {r['bound']:6.2f} "
            f"{r['waste']:6.2f}"
        )
        return r

    fixed = cfg.train.gen_batch
    r = row(f"fixed {fixed}", [f"train.gen_batch={fixed}", "algo.size_gen_batches=false"])
    # A fixed batch tuned by hand to prompt_batch / f (knowing f from the run above) ...
    tuned = math.ceil(cfg.train.prompt_batch / r["kept_frac"])
    row(
        f"fixed {tuned} (= prompt_batch/f)",
        [f"train.gen_batch={tuned}", "algo.size_gen_batches=false"],
    )
    # ... against batches sized on the fly from the estimated f (the default), at most `fixed`.
    row(f"sized (at most {fixed})", [f"train.gen_batch={fixed}", "algo.size_gen_batches=true"])


if __name__ == "__main__":
    bench.run(main)
