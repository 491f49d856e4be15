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
import sys
from pathlib import Path

import torch
from rich.progress import Progress

from dapo_core import synthetic
from dapo_core.config import Config
from dapo_core.problem import Problem
from dapo_core.synthetic import solution
from tasks.data.splits import splits
from tasks.data.version import problems_digest
from tasks.models import loading
from tasks.models.build import code_digest, ensure_built, library_versions
from tasks.models.loading import chat_prompt, save_model_dir, transformers_quietly
from tasks.params import repo_path

# The seed of a format warm start, not the RL run's: the seeds of a run share one starting
# model, whichever run happens to build it.
BUILD_SEED = 0


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


def ensure_warm_started(cfg: Config, base: str, root: Path | None = None) -> Path:
    """``base`` (any model) after ``model.warm_start_steps`` supervised steps on the training
    split: a format warm start, so that RL starts from answers it can score. Built once into
    ``data/models/<base>-warm`` (``tasks.models.build``: one builder, published whole) and
    rebuilt when what it was built from changes."""
    m = cfg.model
    train = splits(cfg).train
    spec = {
        "base": base,
        "steps": m.warm_start_steps,
        "lr": m.warm_start_lr,
        "batch": m.warm_start_batch,
        "train_digest": problems_digest(train),
        "seed": BUILD_SEED,
        "code": code_digest(sys.modules[__name__], loading, synthetic),
        "libraries": library_versions(),
    }
    out = (root or repo_path("data/models")) / f"{Path(base.rstrip('/')).name}-warm"

    def build(into: Path) -> None:
        transformers = transformers_quietly()
        model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        save_model_dir(model, transformers.AutoTokenizer.from_pretrained(base), into)
        warm_start(into, train, m.warm_start_steps, m.warm_start_lr, m.warm_start_batch, BUILD_SEED)

    return ensure_built(out, spec, build, "format warm start")
