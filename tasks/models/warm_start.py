"""Supervised warm start of the embedded tiny model on the training split.

RL from a 0%-accurate policy gets all-wrong groups and no signal (DAPO, arXiv 2503.14476, section
3.2: such groups have zero advantage), so the tiny model first learns the answer format and some
arithmetic with a short cross-entropy run on the reference responses (loss on response tokens
only). It is kept deliberately short: the policy should land well below its ceiling so RL has room
to climb. It sees the training split of ``tasks.data.splits`` only: a validation or test problem
learned here would inflate every later score on it.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from rich.progress import Progress

from dapo_core.config import Config
from dapo_core.problem import Problem
from dapo_core.synthetic import solution
from tasks.models.loading import chat_prompt


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


def warm_start(cfg: Config, model_dir: Path, train: list[Problem]) -> list[float]:
    """Train ``model_dir`` in place for ``tiny.warm_start_steps`` steps on batches drawn from
    ``train`` (the training split); returns the losses."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.tiny.warm_start_lr, weight_decay=0.0)
    rng = random.Random(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    losses = []
    with Progress(transient=True) as progress:
        bar = progress.add_task("warm start (supervised)", total=cfg.tiny.warm_start_steps)
        for _ in range(cfg.tiny.warm_start_steps):
            batch = sft_batch(tokenizer, rng.sample(train, cfg.tiny.warm_start_batch))
            loss = model(**batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            progress.update(bar, advance=1, description=f"warm start loss {loss.item():.3f}")
    model.save_pretrained(model_dir)
    return losses
