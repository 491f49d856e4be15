"""Offline DPO on preference pairs (issue 27, item 4; Rafailov et al. 2023).

The policy starts from the run's model and a frozen copy of it is the reference. Each pair's
sequence log-probabilities (sums over the response's tokens, under the chat prompt) come from the
trainer's own forward (``tasks.training.forward.PolicyForward``: the prompt run once, only
response positions projected onto the vocabulary), the reference's once, before training.
The loss is ``dapo_core.preferences.dpo_loss``:
-log sigmoid(beta [(log pi(y+) - log pi_ref(y+)) - (log pi(y-) - log pi_ref(y-))]), plus
``nll_weight`` times the chosen response's negative log-likelihood per token (Pang et al. 2024,
"Iterative Reasoning Preference Optimization", Eq. 1): DPO alone can widen the margin by lowering
both responses' probabilities, which on reasoning tasks lowers accuracy; the NLL term keeps the
chosen ones likely (``nll_weight=0``: plain DPO).

Pairs are split by prompt as for the reward model (``reward_model.split_by_prompt``); after each
epoch the held-out loss, implicit-reward accuracy and margin are logged to MLflow (experiment
``dapo-dpo``). The trained policy is written whole or not at all, as an ordinary model directory
that ``dapo evaluate --model DIR`` scores like any other.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from dapo_core.config import Config
from dapo_core.errors import PipelineError
from dapo_core.preferences import dpo_loss, sequence_logp
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
from tasks.training.batches import Sample
from tasks.training.forward import PolicyForward

RECORD = "dpo.json"


@dataclasses.dataclass
class DPOResult:
    out_dir: Path
    heldout_accuracy: float
    heldout_loss: float
    train_pairs: int
    heldout_pairs: int
    steps: int
    run_id: str | None = None


def pair_samples(tokenizer, rows: list[dict], max_response: int) -> list[tuple[Sample, Sample]]:
    """Each pair as two samples sharing the chat prompt's ids: (chosen, rejected), responses cut
    to ``max_response`` tokens (the rollout's limit)."""
    from tasks.models.loading import chat_prompt

    out = []
    for r in rows:
        prompt = tokenizer(chat_prompt(tokenizer, r["prompt"]), add_special_tokens=False)
        p = prompt["input_ids"]

        def sample(text: str, p=p) -> Sample:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_response] or [
                tokenizer.eos_token_id
            ]
            return Sample(p + ids, len(p), 0.0, True)

        out.append((sample(r["chosen"]), sample(r["rejected"])))
    return out


def sequence_logps(forward, samples: list[Sample]) -> torch.Tensor:
    """(n,) log pi(y | x) of each sample under ``forward``'s model."""
    logp, _, mask = forward(samples)
    return sequence_logp(logp, mask)


def train_dpo(
    cfg: Config,
    pairs_path: str,
    out_dir: str | Path,
    beta: float = 0.1,
    nll_weight: float = 1.0,
    epochs: int = 3,
    lr: float = 1e-4,
    batch_size: int = 16,
    heldout: float = 0.2,
    seed: int = 0,
    track: bool = True,
    on_step: Callable[[int, int, dict], None] = lambda step, total, metrics: None,
    extra_tags: dict[str, str] | None = None,
    run_name: str | None = None,
    kind: str = "dpo",
    parent_run_id: str | None = None,
    validate: bool = False,
) -> DPOResult:
    """``dapo dpo train``: see the module docstring. ``extra_tags`` go on the MLflow run
    (named ``run_name``, by default after the output), ``kind`` names its experiment;
    ``parent_run_id`` nests the run under a sweep's (``dapo compare``); ``validate`` samples the
    validation split after each epoch, as RL training does every ``eval.every_n_steps``
    (``val/avg_at_k`` and the rest)."""
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.runtime import configure_torch
    from tasks.tracking.provenance import run_tags
    from tasks.tracking.tracker import Tracker

    out_dir = Path(out_dir)
    check_settings(
        "dpo train",
        out_dir,
        [
            ("--beta", beta, math.isfinite(beta) and beta > 0, "a number > 0"),
            ("--nll-weight", nll_weight, math.isfinite(nll_weight) and nll_weight >= 0, ">= 0"),
            *loop_checks(epochs, lr, batch_size, heldout),
        ],
    )
    table, train_rows, held_rows = read_split(cfg, pairs_path, heldout, seed)
    device = configure_torch(cfg.train.cpu_threads)
    base = resolve_model_path(cfg)
    model, tokenizer = load_policy(base, "float32", device)
    # log pi(y | x) of the model itself (temperature 1), as DPO's objective is defined
    policy = PolicyForward(model, tokenizer.pad_token_id, 1.0, autocast=False)
    train = pair_samples(tokenizer, train_rows, cfg.rollout.max_response_len)
    held = pair_samples(tokenizer, held_rows, cfg.rollout.max_response_len)
    ref_train, ref_held = _reference_logps(policy, [train, held], batch_size)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer, schedule = decaying_adamw(trainable, lr, epochs, len(train), batch_size)
    settings = {"pairs": pairs_path, "pairs_digest": table.digest(), "base": str(base)}
    settings |= {"beta": beta, "nll_weight": nll_weight}
    settings |= {"epochs": epochs, "lr": lr, "batch_size": batch_size, "heldout": heldout}
    settings |= {"seed": seed}
    resume = Resume(out_dir, settings)
    loss = _DPOLoss(policy, train, ref_train, beta, nll_weight)
    sample_validation = _validation(cfg, model, tokenizer, base) if validate else dict

    def learn(idx: list[int]) -> dict:
        optimizer.zero_grad(set_to_none=True)
        metrics = loss.backward(idx)
        return metrics | {"dpo/lr": schedule.get_last_lr()[0]}

    def evaluate() -> dict:
        return _heldout(policy, held, ref_held, beta, batch_size) | sample_validation()

    tracker = Tracker(cfg, kind)
    tags = run_tags(cfg, "dpo", pairs=pairs_path) | (extra_tags or {})
    name = run_name or f"dpo {out_dir.name}"
    if start_tracking(tracker, resume, track, name, tags, parent_run_id):
        tracker.log_params({f"dpo.{k}": v for k, v in settings.items()})
        tracker.log_params({"dpo.train_pairs": len(train), "dpo.heldout_pairs": len(held)})
        tracker.log_dict(table.provenance, "pairs_provenance.json")
        tracker.log_metrics(_heldout(policy, held, ref_held, beta, batch_size), 0)  # log 2
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
            evaluate=evaluate,
            tracker=tracker,
            resume=resume,
            on_step=on_step,
        )
        record = {
            "base_model": str(base),
            "pairs": pairs_path,
            "pairs_provenance": table.provenance,
        }
        record |= {k: settings[k] for k in ("beta", "nll_weight", "epochs", "lr", "seed")}
        record |= {"train_pairs": len(train), "heldout_pairs": len(held)}
        record |= {k: evaluation[f"dpo/{k}"] for k in ("heldout_accuracy", "heldout_loss")}
        with held_signals():  # the model in place and its resume state gone, together
            save_model_dir(model, tokenizer, RECORD, record, out_dir)
            resume.done()
        tracker.set_tags({"dpo.out_dir": str(out_dir)})
    return DPOResult(
        out_dir,
        record["heldout_accuracy"],
        record["heldout_loss"],
        len(train),
        len(held),
        step,
        tracker.run_id,
    )


class _DPOLoss:
    """The training objective on a mini-batch of pairs: the DPO loss, plus ``nll_weight`` times
    the chosen responses' negative log-likelihood per token (the module docstring)."""

    def __init__(self, policy, train, ref_train: torch.Tensor, beta: float, nll_weight: float):
        self.policy, self.train, self.ref_train = policy, train, ref_train
        self.beta, self.nll_weight = beta, nll_weight

    def backward(self, idx: list[int]) -> dict:
        """Back-propagate the loss of pairs ``idx``; its metrics."""
        pairs = [self.train[j] for j in idx]
        pol = sequence_logps(self.policy, [x for pair in pairs for x in pair]).view(-1, 2)
        loss, m = dpo_loss(pol[:, 0], pol[:, 1], *self.ref_train[idx].unbind(-1), self.beta)
        lens = torch.tensor([float(chosen.response_len) for chosen, _ in pairs])
        nll = -(pol[:, 0] / lens).mean()  # the chosen responses', per token
        (loss + self.nll_weight * nll if self.nll_weight else loss).backward()
        params = self.policy.model.parameters()
        grads = [p.grad for p in params if p.grad is not None]
        metrics = {f"dpo/{k}": float(n) / float(d) for k, (n, d) in m.items()}
        metrics |= {"dpo/loss": float(loss.detach()), "dpo/chosen_nll": float(nll.detach())}
        return metrics | {
            "dpo/grad_norm": float(torch.nn.utils.get_total_norm(grads)),
            "dpo/tokens_trained": float(sum(x.response_len for pair in pairs for x in pair)),
        }


def _validation(cfg: Config, model, tokenizer, base) -> Callable[[], dict]:
    """``() -> val/... metrics`` of the policy as it is now, sampled on the validation split as
    RL training's validation does (``tasks.evaluation.evaluate.evaluate_policy``)."""
    from tasks.data.splits import splits
    from tasks.evaluation.evaluate import evaluate_policy
    from tasks.rollout.factory import make_generator

    problems = splits(cfg).val
    generator = make_generator(cfg, model, tokenizer, base)

    def sample() -> dict:
        if hasattr(generator, "sync_weights"):  # a sampling copy or an inference engine
            generator.sync_weights(model)
        return evaluate_policy(generator, tokenizer, problems, cfg, progress=False).as_validation

    return sample


def _reference_logps(
    policy: PolicyForward, splits: list[list[tuple[Sample, Sample]]], batch: int
) -> list[torch.Tensor]:
    """Each split's (n, 2) log pi_ref of (chosen, rejected), once, under a frozen copy of the
    policy as it starts (the reference; let go of once scored)."""
    from tasks.training.reference import frozen_copy

    ref = PolicyForward(frozen_copy(policy.model), policy.pad_id, 1.0, autocast=False)
    return [_logps(ref, pairs, batch) for pairs in splits]


def _logps(forward, pairs: list[tuple[Sample, Sample]], batch: int) -> torch.Tensor:
    """(n, 2) log pi of (chosen, rejected) under ``forward``, without gradients."""
    out = []
    with torch.no_grad():
        for i in range(0, len(pairs), batch):
            part = [x for pair in pairs[i : i + batch] for x in pair]
            out.append(sequence_logps(forward, part).view(-1, 2))
    return torch.cat(out)


def _heldout(policy, held, ref_held: torch.Tensor, beta: float, batch: int) -> dict:
    """Held-out DPO loss, implicit-reward accuracy and margin."""
    with torch.no_grad():
        pol = _logps(policy, held, batch)
        loss, m = dpo_loss(pol[:, 0], pol[:, 1], ref_held[:, 0], ref_held[:, 1], beta)
    return {
        "dpo/heldout_loss": float(loss),
        "dpo/heldout_accuracy": float(m["pair_accuracy"][0] / m["pair_accuracy"][1]),
        "dpo/heldout_margin": float(m["reward_margin"][0] / m["reward_margin"][1]),
    }


def train_iterative_dpo(
    cfg: Config,
    pairs_path: str,
    out_dir: str | Path,
    rounds: int,
    prompts: int = 800,
    per_group: int = 4,
    seed: int = 0,
    track: bool = True,
    on_round: Callable[[int, str], None] = lambda round_, said: None,
    **dpo_args,
) -> DPOResult:
    """Iterative DPO (Xu et al. 2023; Pang et al. 2024's iterative RPO): round 1 trains on
    ``pairs_path``; each later round mines new pairs from the policy the round before wrote (on
    ``prompts`` training problems, ``tasks.preferences.pairs``) and trains it against a frozen
    copy of itself, so the pairs and the reference follow the policy. ``dpo_args`` go to every
    round's ``train_dpo``.

    The rounds' pairs and policies are kept in ``.<out>.rounds/`` beside ``out_dir``: the same
    command after an interruption redoes only the unfinished round (itself resumed from its
    checkpoint); the last round's policy becomes ``out_dir`` (its record says how many rounds
    and from which model) and the rest is then removed."""
    import shutil

    from tasks.preferences.pairs import mine_to_file

    out_dir = Path(out_dir)
    check_settings("dpo train", out_dir, [("--rounds", rounds, rounds >= 1, ">= 1")])
    if rounds == 1:
        return train_dpo(cfg, pairs_path, out_dir, seed=seed, track=track, **dpo_args)
    work = out_dir.with_name(f".{out_dir.name}.rounds")
    _same_rounds(work, cfg, pairs_path, prompts, per_group, seed, dpo_args=dpo_args)
    policy, result = None, None
    for r in range(1, rounds + 1):
        round_cfg = _with_policy(cfg, policy)
        pairs = pairs_path
        if r > 1:
            pairs = str(work / f"pairs{r}.parquet")
            if not Path(pairs).exists():
                table, _, _ = mine_to_file(
                    round_cfg, pairs, prompts, per_group, seed + r, dvc=False
                )
                on_round(r, f"mined {len(table.rows)} pairs from the round {r - 1} policy")
        model_dir = work / f"round{r}"
        if (model_dir / RECORD).exists():  # finished before an interruption
            record = json.loads((model_dir / RECORD).read_text())
            result = DPOResult(
                model_dir, record["heldout_accuracy"], record["heldout_loss"], 0, 0, 0
            )
        else:
            # its MLflow run named and tagged after the directory the rounds end in: the round's
            # own directory is removed once they are over
            traced = {"dpo.rounds_of": str(out_dir), "dpo.round": f"{r} of {rounds}"}
            own = {k: v for k, v in dpo_args.items() if k not in ("extra_tags", "run_name")}
            result = train_dpo(
                round_cfg,
                pairs,
                model_dir,
                seed=seed,
                track=track,
                extra_tags={**(dpo_args.get("extra_tags") or {}), **traced},
                run_name=f"{dpo_args.get('run_name') or f'dpo {out_dir.name}'} round {r} of "
                f"{rounds}",
                **own,
            )
        on_round(r, f"held-out implicit-reward accuracy {result.heldout_accuracy:.3f}")
        policy = str(model_dir)
    record = json.loads((Path(policy) / RECORD).read_text())
    # the last round's base and pairs were the round before's, in the directory removed below
    record |= {"rounds": rounds, "base_model": str(cfg.model.name_or_path), "pairs": pairs_path}
    (Path(policy) / RECORD).write_text(json.dumps(record, indent=2))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists():  # empty: check_settings refused one with files
        out_dir.rmdir()
    shutil.move(policy, out_dir)
    shutil.rmtree(work, ignore_errors=True)
    return dataclasses.replace(result, out_dir=out_dir)


def _same_rounds(work: Path, cfg: Config, pairs: str, *mining, dpo_args: dict) -> None:
    """Record the rounds' settings in ``work``, or refuse when the rounds kept there were
    started under others (a finished round would otherwise be taken as this command's): the
    config sections that pick the task, the model and its sampling, the pairs, the mining and
    the DPO settings. The round count is not among them: finished rounds serve a longer or
    shorter run alike."""
    sections = ("synthetic", "data", "model", "tiny", "rollout")
    settings = {k: v for k, v in cfg.to_dict().items() if k in sections}
    settings |= {"pairs": pairs, "mining": mining}
    settings |= {k: v for k, v in dpo_args.items() if not callable(v)}  # not on_step
    settings = json.loads(json.dumps(settings, default=str))  # as read back from JSON
    file = work / "settings.json"
    if file.exists() and json.loads(file.read_text()) != settings:
        raise PipelineError(
            f"{work} holds the rounds of an interrupted run with other settings: run the same "
            "command as before to continue it, or remove that directory to start over"
        )
    work.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(settings))


def _with_policy(cfg: Config, policy: str | None) -> Config:
    """``cfg`` with ``policy`` (a model directory) as the model, or ``cfg`` itself."""
    if policy is None:
        return cfg
    from dapo_core.config_loader import resolve

    return resolve(cfg.to_dict(), overrides=[f"model.name_or_path={policy}"])
