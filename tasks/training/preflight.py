"""The preflight: before a run spends its budget, is there anything for DAPO to learn from?

It samples G responses from the starting policy for a few dozen training prompts (as a training
step would) and reports the pass-rate distribution over groups, the share of groups dynamic
sampling would keep (mixed correctness, Eq. 11), the share of responses with a parseable answer,
the truncation rate and a few responses. When too few groups are mixed it says why (all wrong:
format or difficulty; all right: too easy) and what to do (``dapo_core.signal``).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch

from dapo_core import metric_names as metric
from dapo_core.config import Config
from dapo_core.errors import PipelineError
from dapo_core.problem import Problem
from dapo_core.reward import extract_answer, score
from dapo_core.signal import GroupSignal, diagnose, group_signal
from tasks.data.splits import splits
from tasks.models.loading import HandedPolicy, load_policy
from tasks.models.resolve import resolve_model_path
from tasks.orchestration import run_logger, stage_task
from tasks.rollout.factory import make_generator
from tasks.rollout.generators import sample_problems
from tasks.runtime import configure_torch

SAMPLE_ROWS = 8  # responses shown in the report


class NothingToLearn(PipelineError):
    """The preflight found too few groups of mixed correctness (and was asked to be strict)."""


@dataclasses.dataclass
class PreflightResult:
    signal: GroupSignal
    problems: int
    group_size: int
    problem: str | None  # why there is too little to learn from, with what to do; None if fine
    samples: list[dict[str, Any]]
    # the policy it sampled, for the training that follows (one load, not two)
    policy: HandedPolicy | None = dataclasses.field(default=None, repr=False, compare=False)

    def metrics(self) -> dict[str, float]:
        """``preflight/*`` metrics for MLflow (logged at step 0 of the run)."""
        s = self.signal
        out = {f"preflight/{k}": getattr(s, k) for k in metric.PREFLIGHT_SHARES}
        hist = {metric.PREFLIGHT_GROUPS.format(k=k): n for k, n in enumerate(s.pass_rate_hist)}
        return {**out, **hist}


def preflight_problems(cfg: Config, n: int) -> list[Problem]:
    """``n`` training problems, a fixed draw (``train.seed``) so reruns compare like with like."""
    train = list(splits(cfg).train)
    random.Random(cfg.train.seed).shuffle(train)
    return train[:n]


def run_preflight(
    cfg: Config, n_prompts: int | None = None, model_path: str | None = None
) -> PreflightResult:
    """Sample the starting policy (default ``model.name_or_path``) on ``n_prompts`` (default
    ``train.preflight_prompts``) training problems, G responses each, at the rollout settings."""
    n = n_prompts or cfg.train.preflight_prompts
    G, r = cfg.rollout.group_size, cfg.rollout
    device = configure_torch(cfg.train.cpu_threads)
    path = model_path or resolve_model_path(cfg)
    model, tokenizer = load_policy(path, cfg.model.dtype, device)
    policy = HandedPolicy(str(path), cfg.model.dtype, str(torch.device(device)), (model, tokenizer))
    generator = make_generator(cfg, model, tokenizer, path)
    problems = preflight_problems(cfg, n)
    texts, _, finished = sample_problems(
        generator,
        tokenizer,
        problems,
        G,
        r.temperature,
        r.top_p,
        r.max_response_len,
        cfg.train.seed,
    )
    answers = [p.answer for p in problems for _ in range(G)]
    acc = [score(t, a).acc for t, a in zip(texts, answers, strict=True)]
    parsed = [extract_answer(t) is not None for t in texts]
    signal = group_signal(*(torch.tensor(x).view(-1, G) for x in (acc, parsed, finished)))
    samples = [
        {"problem_id": p.id, "answer": p.answer, "response": texts[i * G], "correct": acc[i * G]}
        for i, p in enumerate(problems[:SAMPLE_ROWS])
    ]
    why = diagnose(signal, cfg.train.preflight_min_mixed)
    return PreflightResult(signal, len(problems), G, why, samples, policy)


def describe(result: PreflightResult) -> str:
    """The preflight in one line (the warning, if any, goes on its own)."""
    s = result.signal
    hist = " ".join(f"{k}:{n}" for k, n in enumerate(s.pass_rate_hist))
    return (
        f"preflight on {result.problems} prompts x {result.group_size}: mixed groups "
        f"{s.mixed_group_frac:.0%} (all wrong {s.all_wrong_frac:.0%}, all right "
        f"{s.all_right_frac:.0%}); parseable answers {s.parsed_frac:.0%}; truncated "
        f"{s.truncated_frac:.0%}; groups by #correct {hist}"
    )


@stage_task("preflight", retries=0, retry_delay_seconds=0)
def preflight_task(
    cfg: Config, strict: bool = False, prompts: int | None = None, said: bool = True
) -> PreflightResult:
    """Run the preflight and, if ``said``, log its report; with ``strict`` too little to learn
    from is an error."""
    log = run_logger()
    result = run_preflight(cfg, prompts)
    if said:
        log.info(describe(result))
        for row in result.samples[:3]:
            log.info("preflight sample (answer %s): %r", row["answer"], row["response"][-200:])
    if result.problem:
        if strict:
            raise NothingToLearn(f"preflight: {result.problem}")
        if said:
            log.warning("preflight: %s", result.problem)
    return result
