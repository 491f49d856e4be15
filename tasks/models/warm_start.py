"""Supervised warm start of the embedded tiny model on the training split.

RL from a 0%-accurate policy gets all-wrong groups and no signal (DAPO, arXiv 2503.14476, section
3.2: such groups have zero advantage), so the tiny model first learns the answer format and some
arithmetic with a short cross-entropy run on the reference responses (loss on response tokens
only). It is kept deliberately short: the policy should land well below its ceiling so RL has room
to climb. It sees the training split of ``tasks.data.splits`` only: a validation or test problem
learned here would inflate every later score on it.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
from rich.progress import Progress

from dapo_core.config import Config
from dapo_core.problem import Problem
from dapo_core.synthetic import solution
from tasks.data.splits import splits
from tasks.data.version import problems_digest
from tasks.models.loading import chat_prompt, transformers_quietly
from tasks.params import repo_path

BUILD_RECORD = "dapo_build.json"  # in a model directory the project built: what from


def sft_batch(tokenizer, problems: list[Problem]) -> dict[str, torch.Tensor]:
    """Right-padded input ids with labels = -100 outside the response (prompt and padding)."""
    rows, labels = [], []
    for p in problems:
        prompt = tokenizer(chat_prompt(tokenizer, p.prompt), add_special_tokens=False)["input_ids"]
        response = tokenizer(solution(p), add_special_tokens=False)["input_ids"]
        response = response + [tokenizer.eos_token_id]
        rows.append(prompt + response)
        labels.append([-100] * len(prompt) + response)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": attn, "labels": lab}


def warm_start(
    model_dir: Path, train: list[Problem], steps: int, lr: float, batch: int, seed: int
) -> list[float]:
    """Train ``model_dir`` in place for ``steps`` supervised steps on batches drawn from ``train``
    (the training split, answered in the DAPO format); returns the losses."""
    transformers = transformers_quietly()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    losses = []
    with Progress(transient=True) as progress:
        bar = progress.add_task("warm start (supervised)", total=steps)
        for _ in range(steps):
            loss = model(**sft_batch(tokenizer, rng.sample(train, min(batch, len(train))))).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            progress.update(bar, advance=1, description=f"warm start loss {loss.item():.3f}")
    model.save_pretrained(model_dir)
    return losses


def is_built(path: Path, spec: dict) -> bool:
    """Whether ``path`` holds a model built from exactly ``spec`` (its ``BUILD_RECORD``)."""
    record = path / BUILD_RECORD
    return record.exists() and json.loads(record.read_text()) == spec


def record_build(path: Path, spec: dict) -> None:
    """Written last: a build cut short has no record and is redone."""
    (path / BUILD_RECORD).write_text(json.dumps(spec, indent=2))


def ensure_warm_started(cfg: Config, base: str, root: Path | None = None) -> Path:
    """``base`` (any model) after ``model.warm_start_steps`` supervised steps on the training
    split: a format warm start, so that RL starts from answers it can score. Built once into
    ``data/models/<base>-warm`` and rebuilt when what it was built from changes."""
    m = cfg.model
    train = splits(cfg).train
    spec = {
        "base": base,
        "steps": m.warm_start_steps,
        "lr": m.warm_start_lr,
        "batch": m.warm_start_batch,
        "train_digest": problems_digest(train),
    }  # not train.seed: RL seeds share one warm start (the first run's seed builds it)
    out = (root or repo_path("data/models")) / f"{Path(base.rstrip('/')).name}-warm"
    if is_built(out, spec):
        return out
    transformers = transformers_quietly()
    staged = out.with_name(out.name + ".tmp")
    shutil.rmtree(staged, ignore_errors=True)
    transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).save_pretrained(
        staged
    )
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(staged)
    warm_start(
        staged, train, m.warm_start_steps, m.warm_start_lr, m.warm_start_batch, cfg.train.seed
    )
    record_build(staged, spec)
    shutil.rmtree(out, ignore_errors=True)
    staged.rename(out)
    return out
