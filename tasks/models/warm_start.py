"""Supervised warm start of the embedded tiny model on the training split.

RL from a 0%-accurate policy gets all-wrong groups and no signal (DAPO, arXiv 2503.14476, section
3.2: such groups have zero advantage), so the tiny model first learns the answer format and some
arithmetic with a short cross-entropy run on the reference responses (loss on response tokens
only). It is kept deliberately short: the policy should land well below its ceiling so RL has room
to climb. It sees the training split of ``tasks.data.splits`` only: a validation or test problem
learned here would inflate every later score on it.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich import get_console
from rich.progress import Progress

from dapo_core import synthetic
from dapo_core.config import Config
from dapo_core.problem import Problem
from dapo_core.synthetic import solution
from tasks.data.splits import splits
from tasks.data.version import problems_digest
from tasks.models import loading
from tasks.models.build import code_digest, ensure_built, library_versions
from tasks.models.loading import (
    chat_prompt,
    explained_load_errors,
    load_tokenizer,
    readable_weights,
    save_model_dir,
    transformers_quietly,
    without_deepspeed_probe,
)
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


@dataclass(frozen=True)
class StopRule:
    """End the warm start once ``score(model, tokenizer)`` (a validation accuracy) lands in
    [``target``, ``target + window``], checked every ``every`` steps and after the last one.

    The upper edge is for a steep, noisy curve: near the target the score can jump by 0.1
    between two checks, and a seed stopped on such a jump starts well above the seeds that
    stopped just past the target; it trains on to a later check inside the window instead.
    ``window`` 0 has no upper edge."""

    target: float
    every: int
    score: Callable[[Any, Any], float]
    window: float = 0.0

    def lands(self, score: float) -> bool:
        return score >= self.target and (self.window <= 0 or score <= self.target + self.window)


@dataclass(frozen=True)
class WarmStartResult:
    losses: list[float]
    checks: list[tuple[int, float]] = field(default_factory=list)  # (step, validation score)

    @property
    def steps(self) -> int:
        return len(self.losses)

    def landed(self, rule: StopRule) -> bool:
        """Whether the last check stopped the warm start (not its step budget)."""
        return bool(self.checks) and rule.lands(self.checks[-1][1])

    def record(self) -> dict[str, Any]:
        """What a build record keeps of the warm start."""
        out: dict[str, Any] = {"steps": self.steps}
        if self.losses:  # none with warm_start_steps=0
            out["final_loss"] = round(self.losses[-1], 6)
        if self.checks:
            out["validation_checks"] = [[step, round(v, 6)] for step, v in self.checks]
        return out


HEARTBEAT_S = 30.0
"""Where output is not a terminal, a warm start says where it is at most this often."""


class _Heartbeat:
    """A line on stderr every ``every_s`` seconds of a loop of ``total`` steps (None: silent)."""

    def __init__(self, every_s: float | None, total: int) -> None:
        self.every_s, self.total = every_s, total
        self.last = time.monotonic()

    def step(self, step: int, loss: float, validation: float | None) -> None:
        now = time.monotonic()
        if self.every_s is None or now - self.last < self.every_s:
            return
        self.last = now
        val = "" if validation is None else f", validation avg@k {validation:.3f}"
        sys.stderr.write(f"warm start: step {step} of up to {self.total}, loss {loss:.3f}{val}\n")
        sys.stderr.flush()


def warm_start(
    model_dir: Path,
    train: list[Problem],
    steps: int,
    lr: float,
    batch: int,
    seed: int,
    stop: StopRule | None = None,
) -> WarmStartResult:
    """Train ``model_dir`` in place for ``steps`` supervised steps on batches drawn from ``train``
    (the training split, answered in the DAPO format), or fewer when a check of ``stop`` lands
    on its target."""
    transformers = transformers_quietly()
    tokenizer = load_tokenizer(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    losses: list[float] = []
    checks: list[tuple[int, float]] = []
    # a bar that erases itself shows nothing where output is not a terminal but a blank line:
    # there, a line now and then instead (a build runs for minutes)
    terminal = get_console().is_terminal
    said = _Heartbeat(None if terminal else HEARTBEAT_S, steps)
    with Progress(transient=True, disable=not terminal) as progress:
        bar = progress.add_task("warm start (supervised)", total=steps)
        for step in range(1, steps + 1):
            model.train()
            loss = model(**sft_batch(tokenizer, rng.sample(train, min(batch, len(train))))).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            progress.update(bar, advance=1, description=f"warm start loss {loss.item():.3f}")
            if stop and (step % stop.every == 0 or step == steps):
                model.eval()
                checks.append((step, stop.score(model, tokenizer)))
                progress.update(bar, description=f"warm start val {checks[-1][1]:.3f}")
                if stop.lands(checks[-1][1]):
                    break
            said.step(step, losses[-1], checks[-1][1] if checks else None)
    with without_deepspeed_probe():
        model.save_pretrained(model_dir)
    readable_weights(model_dir)
    return WarmStartResult(losses, checks)


def validation_score(cfg: Config, problems: list[Problem]) -> Callable[[Any, Any], float]:
    """The score a warm start's stopping rule reads: avg@k on ``problems`` (the validation split)
    sampled as evaluation samples (``eval.n_samples``, temperature, top_p, seed), so the target
    is on the scale of the avg@k a run reports."""
    from dapo_core.reward import score
    from tasks.rollout.factory import make_generator
    from tasks.rollout.generators import sample_problems

    e = cfg.eval

    hf = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, backend="hf"))

    def avg_at_k(model, tokenizer) -> float:
        generator = make_generator(hf, model, tokenizer, "")  # the model in memory, not a file
        texts, _, _ = sample_problems(
            generator,
            tokenizer,
            problems,
            e.n_samples,
            e.temperature,
            e.top_p,
            e.max_response_len,
            seed=e.seed,
        )
        truths = [p.answer for p in problems for _ in range(e.n_samples)]
        acc = [score(t, a, e.answer_format).acc for t, a in zip(texts, truths, strict=True)]
        return sum(acc) / len(acc)

    return avg_at_k


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
        with explained_load_errors(base):
            model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            tokenizer = load_tokenizer(base)
        save_model_dir(model, tokenizer, into)
        warm_start(into, train, m.warm_start_steps, m.warm_start_lr, m.warm_start_batch, BUILD_SEED)

    return ensure_built(out, spec, build, "format warm start")
