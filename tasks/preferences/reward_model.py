"""A reward model trained on preference pairs with the Bradley-Terry loss (issue 27, item 2).

The model is the policy's architecture with a scalar head: transformers'
``AutoModelForSequenceClassification`` with one label, loaded from the run's starting model (its
transformer; the head starts fresh). r(x, y) is the head's output at the last token of the chat
prompt followed by the response, so the saved directory is an ordinary reward model that TRL or
OpenRLHF load the same way. Training minimises -log sigmoid(r(x, y+) - r(x, y-))
(``dapo_core.preferences.bradley_terry_loss``) with AdamW over shuffled mini-batches of pairs.

Pairs are split by prompt into training and held-out sets (a prompt's pairs never straddle), and
pairs whose prompt is a validation or test problem are set aside on reading. After each epoch the
held-out pair accuracy, loss and calibration (``dapo_core.preferences.calibration_curve``) are
logged to MLflow, with the calibration curve as a figure. The directory is written whole or not
at all: a staging directory renamed into place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from dapo_core.config import Config
from dapo_core.preferences import CalibrationBin, bradley_terry_loss, calibration_curve
from tasks.models.learned_reward import RECORD, load_reward_model, reward_input, rewards
from tasks.preferences.common import (
    Resume,
    check_settings,
    continued_by_the_same_command,
    decaying_adamw,
    fit,
    loop_checks,
    read_split,
    save_model_dir,
    start_tracking,
)
from tasks.signals import held_signals


@dataclasses.dataclass
class RewardModelResult:
    out_dir: Path
    heldout_accuracy: float
    heldout_loss: float
    ece: float
    calibration: list[CalibrationBin]
    train_pairs: int
    heldout_pairs: int
    steps: int
    run_id: str | None = None


def encode(tokenizer, rows: list[dict], max_len: int) -> list[tuple[list[int], list[int]]]:
    """Each pair as (chosen ids, rejected ids), as the reward model reads them in RL too."""
    return [
        tuple(
            reward_input(tokenizer, r["prompt"], r[side], max_len)
            for side in ("chosen", "rejected")
        )
        for r in rows
    ]


def margins(model, pairs: list[tuple[list[int], list[int]]], pad: int, batch: int) -> torch.Tensor:
    """(n,) r(y+) - r(y-) of every pair, without gradients."""
    out = []
    with torch.no_grad():
        for i in range(0, len(pairs), batch):
            part = pairs[i : i + batch]
            r = rewards(model, [c for c, _ in part] + [rj for _, rj in part], pad)
            out.append(r[: len(part)] - r[len(part) :])
    return torch.cat(out) if out else torch.zeros(0)


def train_reward_model(
    cfg: Config,
    pairs_path: str,
    out_dir: str | Path,
    epochs: int = 6,
    lr: float = 2e-4,
    batch_size: int = 32,
    heldout: float = 0.2,
    seed: int = 0,
    track: bool = True,
    on_step: Callable[[int, int, dict], None] = lambda step, total, metrics: None,
    extra_tags: dict[str, str] | None = None,
    run_name: str | None = None,
    kind: str = "reward_model",
    parent_run_id: str | None = None,
) -> RewardModelResult:
    """``dapo reward-model train``: see the module docstring. ``extra_tags`` go on the
    MLflow run (named ``run_name``, by default after the output), ``kind`` names its
    experiment; ``parent_run_id`` nests the run under a sweep's (``dapo compare``)."""
    from tasks.models.resolve import resolve_model_path
    from tasks.runtime import configure_torch
    from tasks.tracking.provenance import run_tags
    from tasks.tracking.tracker import Tracker

    out_dir = Path(out_dir)
    check_settings(
        "reward-model train",
        out_dir,
        loop_checks(epochs, lr, batch_size, heldout),
    )
    table, train_rows, held_rows = read_split(cfg, pairs_path, heldout, seed)
    device = configure_torch(cfg.train.cpu_threads)
    base = resolve_model_path(cfg)
    torch.manual_seed(seed)  # the head's initialisation
    model, tokenizer = load_reward_model(base, device)
    max_len = cfg.rollout.max_prompt_len + cfg.rollout.max_response_len
    train = encode(tokenizer, train_rows, max_len)
    held = encode(tokenizer, held_rows, max_len)
    pad = tokenizer.pad_token_id
    optimizer, schedule = decaying_adamw(model.parameters(), lr, epochs, len(train), batch_size)
    settings = {"pairs": pairs_path, "pairs_digest": table.digest(), "base": str(base)}
    settings |= {"epochs": epochs, "lr": lr}
    settings |= {"batch_size": batch_size, "heldout": heldout, "seed": seed}
    resume = Resume(out_dir, settings)

    def learn(idx: list[int]) -> dict:
        part = [train[j] for j in idx]
        r = rewards(model, [c for c, _ in part] + [rj for _, rj in part], pad)
        loss, m = bradley_terry_loss(r[: len(part)], r[len(part) :])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return {"rm/loss": float(loss.detach()), "rm/pair_accuracy": _ratio(m["pair_accuracy"])}

    tracker = Tracker(cfg, kind)
    tags = run_tags(cfg, "reward_model", pairs=pairs_path, base_model=str(base)) | (
        extra_tags or {}
    )
    name = run_name or f"reward model {out_dir.name}"
    if start_tracking(tracker, resume, track, name, tags, parent_run_id):
        tracker.log_params({f"rm.{k}": v for k, v in settings.items()})
        tracker.log_params({"rm.train_pairs": len(train), "rm.heldout_pairs": len(held)})
        tracker.log_dict(table.provenance, "pairs_provenance.json")
    with continued_by_the_same_command(resume), tracker:
        step, evaluation = fit(
            model=model,
            optimizer=optimizer,
            schedule=schedule,
            n_train=len(train),
            batch_size=batch_size,
            epochs=epochs,
            seed=seed,
            learn=learn,
            evaluate=lambda: _heldout(model, held, pad, batch_size),
            tracker=tracker,
            resume=resume,
            on_step=on_step,
        )
        bins, ece = evaluation["bins"], evaluation["rm/heldout_ece"]
        record = {
            "base_model": str(base),
            "pairs": pairs_path,
            "pairs_provenance": table.provenance,
        }
        record |= {"train_pairs": len(train), "heldout_pairs": len(held)}
        record |= {k: evaluation[f"rm/{k}"] for k in ("heldout_accuracy", "heldout_loss")}
        record |= {"heldout_ece": ece, "epochs": epochs, "lr": lr, "seed": seed}
        with held_signals():  # the model in place and its resume state gone, together
            save_model_dir(model, tokenizer, RECORD, record, out_dir)
            resume.done()
        tracker.log_figure(_calibration_figure(bins, ece), "calibration.png")
        tracker.log_table([dataclasses.asdict(b) for b in bins], "calibration.json")
        tracker.set_tags({"rm.out_dir": str(out_dir)})
    return RewardModelResult(
        out_dir,
        record["heldout_accuracy"],
        record["heldout_loss"],
        ece,
        bins,
        len(train),
        len(held),
        step,
        tracker.run_id,
    )


def _ratio(pair: tuple[torch.Tensor, torch.Tensor]) -> float:
    num, den = pair
    return float(num) / max(float(den), 1.0)


def _heldout(model, held, pad: int, batch: int) -> dict:
    m = margins(model, held, pad, batch)
    bins, ece = calibration_curve(m)
    return {
        "rm/heldout_accuracy": float((m > 0).float().mean()),
        "rm/heldout_loss": float(-torch.nn.functional.logsigmoid(m).mean()),
        "rm/heldout_ece": ece,
        "bins": bins,
    }


def _calibration_figure(bins: list[CalibrationBin], ece: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    ax.plot(
        [b.predicted for b in bins], [b.observed for b in bins], marker="o", label="reward model"
    )
    ax.set_xlabel("predicted P(first response preferred)")
    ax.set_ylabel("observed share preferred")
    ax.set_title(f"held-out calibration (ECE {ece:.3f})")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig
