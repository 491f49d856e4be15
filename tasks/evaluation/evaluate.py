"""Evaluation: n samples per problem, scored by the DAPO reward, summarised as avg@n and friends.

The paper's number is AIME 2024 avg@32: 32 samples per problem at temperature 1.0, top_p 0.7, the
mean accuracy over all 960 samples (DAPO section 4.1). We sample n per prompt directly (verl repeats
each row n times instead). Each response's answer is read in ``eval.answer_format`` (the way the
prompt asked for it) and judged by the reward's equivalence (exact integers, else Math-Verify);
both are named in :attr:`EvalResult.scoring`. Reported (``eval/`` metric names are what flows and
plots rely on):

- ``eval/avg_at_k`` and its bootstrap 95% CI over problems (``eval/avg_at_k_ci_low/high``);
- unbiased ``eval/pass_at_{k}`` for each configured k <= n;
- ``eval/maj_at_k``: whether the most frequent extracted answer is correct (unparseable samples
  abstain; answers vote by their value, ``dapo_core.reward.answer_key``, so ``1/2`` and ``0.5``
  are one answer with two votes);
- ``eval/unparseable_frac``: samples with no extractable answer (scored wrong, never an error);
- a per-problem table (with what was extracted) and a few sample responses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from rich import get_console
from rich.progress import Progress

from dapo_core import metric_names as metric
from dapo_core.config import Config
from dapo_core.metrics import avg_at_k, bootstrap_ci, majority_vote, mean_pass_at_k
from dapo_core.problem import Problem
from dapo_core.reward import answer_key, equivalence_name, score
from tasks.rollout.generators import Generator, sample_problems

if TYPE_CHECKING:  # imported where a table is built: a training run loads it at its first eval
    import pandas as pd


@dataclass
class EvalResult:
    metrics: dict[str, float]
    per_problem: pd.DataFrame
    samples: list[dict[str, object]]
    scoring: dict[str, str]  # eval/answer_format and eval/equivalence: how answers were judged

    @property
    def as_validation(self) -> dict[str, float]:
        """The metrics as a training run logs its validation: ``val/avg_at_k`` and so on."""
        return {"val/" + k.split("/", 1)[-1]: v for k, v in self.metrics.items()}


def evaluate_model(
    cfg: Config, model_path: str | None = None, eval_set: str | None = None, progress: bool = True
) -> tuple[str, EvalResult]:
    """Load a model (default: the configured policy) and evaluate it on an eval set."""
    from tasks.data.splits import eval_problems
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.rollout.factory import make_generator
    from tasks.runtime import configure_torch
    from tasks.tracking.registry import is_model_uri
    from tasks.tracking.registry import model_path as registered_path
    from tasks.tracking.store import tracking_uri

    name, problems = eval_problems(cfg, eval_set)
    device = configure_torch(cfg.train.cpu_threads)
    path = model_path or resolve_model_path(cfg)
    if is_model_uri(path):  # dapo evaluate --model models:/NAME@champion
        path = registered_path(path, tracking_uri(cfg))
    model, tokenizer = load_policy(path, cfg.model.dtype, device)
    generator = make_generator(cfg, model, tokenizer, path)
    return name, evaluate_policy(generator, tokenizer, problems, cfg, progress=progress)


def evaluate_policy(
    generator: Generator,
    tokenizer,
    problems: list[Problem],
    cfg: Config,
    batch_prompts: int = 16,
    progress: bool = True,
    on_batch: Callable[[int], None] | None = None,
) -> EvalResult:
    """Sample ``eval.n_samples`` responses per problem and score them; seeded by ``eval.seed``."""
    if not problems:
        raise ValueError("the evaluation set is empty")
    e = cfg.eval
    n = e.n_samples
    # a bar that erases itself shows nothing where output is not a terminal but a blank line
    with Progress(transient=True, disable=not (progress and get_console().is_terminal)) as bar:
        task = bar.add_task(f"evaluate ({n} samples/problem)", total=len(problems))

        def advance(done: int) -> None:
            bar.update(task, completed=done)
            if on_batch:
                on_batch(done)

        texts, lengths, finished = sample_problems(
            generator,
            tokenizer,
            problems,
            n,
            e.temperature,
            e.top_p,
            e.max_response_len,
            seed=e.seed,  # evaluation must not shift the training RNG stream: forked
            batch_prompts=batch_prompts,
            on_batch=advance,
        )
    return summarize(problems, texts, lengths, finished, cfg)


def summarize(
    problems: list[Problem],
    texts: list[str],
    lengths: list[int],
    finished: list[bool],
    cfg: Config,
) -> EvalResult:
    """Scores, metrics, the per-problem table and samples from flat prompt-major samples."""
    n, answer_format = cfg.eval.n_samples, cfg.eval.answer_format
    truths = np.repeat([p.answer for p in problems], n)
    scores = [score(t, truth, answer_format) for t, truth in zip(texts, truths, strict=True)]
    correct = np.array([s.acc for s in scores], dtype=bool).reshape(len(problems), n)
    preds = [[s.pred for s in scores[i * n : (i + 1) * n]] for i in range(len(problems))]
    per_problem_acc = correct.mean(axis=1)
    # The majority answer by value, judged as its first sample was judged (so a majority 0.5
    # against the ground truth \frac{1}{2} counts, which a comparison of texts would miss).
    majority = [majority_vote(row, answer_key) for row in preds]
    majority_correct = [
        m is not None and bool(c[row.index(m)])
        for m, row, c in zip(majority, preds, correct, strict=True)
    ]
    low, high = bootstrap_ci(per_problem_acc, cfg.eval.bootstrap_samples, seed=cfg.eval.seed)
    metrics = {
        metric.AVG_AT_K: avg_at_k(correct),
        metric.AVG_AT_K_CI_LOW: low,
        metric.AVG_AT_K_CI_HIGH: high,
        metric.MAJ_AT_K: float(np.mean(majority_correct)),
        metric.UNPARSEABLE_FRAC: float(np.mean([s.pred is None for s in scores])),
        metric.EVAL_RESPONSE_LEN_MEAN: float(np.mean(lengths)),
        metric.EVAL_TRUNCATED_FRAC: float(1 - np.mean(finished)),
        metric.NUM_PROBLEMS: float(len(problems)),
        metric.N_SAMPLES: float(n),
    }
    for k in cfg.eval.pass_ks:
        if k <= n:
            metrics[metric.PASS_AT_K.format(k=k)] = mean_pass_at_k(correct, k)
    length_arr = np.array(lengths).reshape(len(problems), n)
    finished_arr = np.array(finished).reshape(len(problems), n)
    import pandas as pd

    per_problem = pd.DataFrame(
        {
            "problem_id": [p.id for p in problems],
            "answer": [p.answer for p in problems],
            "accuracy": per_problem_acc,
            "majority_answer": majority,
            "majority_correct": majority_correct,
            "extracted": [extracted_summary(row) for row in preds],
            "mean_response_len": length_arr.mean(axis=1),
            "truncated_frac": 1 - finished_arr.mean(axis=1),
        }
    )
    samples = [
        {
            "problem_id": p.id,
            "answer": p.answer,
            "response": texts[i * n],
            "extracted": preds[i][0],
            "correct": bool(correct[i, 0]),
        }
        for i, p in enumerate(problems[:8])
    ]
    scoring = {"eval/answer_format": answer_format, "eval/equivalence": equivalence_name()}
    return EvalResult(metrics, per_problem, samples, scoring)


# Answers listed per problem in the per-problem table; the rest are summed up as "others".
_EXTRACTED_SHOWN = 5


def extracted_summary(preds: list[str | None]) -> str:
    """What was extracted from a problem's samples, most frequent first, with counts:
    ``540 (5); 541 (2); no answer (1)`` (at most five answers, then the count of the others)."""
    counts = Counter("no answer" if p is None else p for p in preds).most_common()
    shown = [f"{answer} ({count})" for answer, count in counts[:_EXTRACTED_SHOWN]]
    others = sum(count for _, count in counts[_EXTRACTED_SHOWN:])
    return "; ".join(shown + ([f"others ({others})"] if others else []))
