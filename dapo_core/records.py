"""Reading one input record of a math dataset into a problem and its raw answer (DAPO section 3.5).

DAPO (arXiv 2503.14476, section 3.5) trains on DAPO-Math-17K, whose rows wrap each problem in a
prompt template; evaluation sets come as the same DAPO/verl schema or as plain records. This module
turns any such record into a :class:`Row` (the bare problem, template stripped, and the raw answer)
or a :class:`Malformed` (why it cannot be read). It never raises on a bad record and does no file
I/O: the readers in ``tasks/data`` hand it records, the curation pass in
``dapo_core.curation_pass`` takes its rows.

Accepted schemas:

- DAPO/verl: ``prompt`` = chat messages whose last user turn carries the DAPO template (or that
  list serialised as JSON text, or a plain string), ``reward_model.ground_truth``, ``extra_info``
  with ``index`` and, in the AIME files, ``raw_problem``;
- plain: ``problem``/``question``, ``answer`` (or ``label``/``ground_truth``), optional ``id``;
- a ``dapo_core.problem.Problem`` (the synthetic task), kept with its own id and prompt.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dapo_core.curation import strip_template
from dapo_core.problem import Problem

# Why a record is malformed (each is a reject reason of the report).
MALFORMED = (
    "invalid_json",
    "not_a_record",
    "missing_problem",
    "empty_problem",
    "problem_wrong_type",
    "bad_prompt_structure",
    "missing_answer",
    "empty_answer",
    "answer_wrong_type",
)


@dataclass(frozen=True)
class Malformed:
    """A record that cannot be read: one of :data:`MALFORMED` and a human-readable detail."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Row:
    """A well-formed input row: the bare problem and its raw answer."""

    problem: str
    answer: str
    source_id: str | None = None
    prompt: str | None = None  # set by the synthetic task (its own prompt); else the template
    fixed_id: str | None = None  # the synthetic task's own id


@functools.lru_cache(maxsize=1 << 16)
def _strip(content: str) -> str:
    # Cached: the released DAPO file repeats each of its prompts 100 times.
    return strip_template(content)


def _type_and_repr(value: Any) -> str:
    """A short description of an unexpected value for a Malformed detail: ``list [1, 2]``."""
    if value is None:
        return "null"
    return f"{type(value).__name__} {repr(value)[:60]}"


def _first_present(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _problem_from_prompt(prompt: Any) -> str | Malformed:
    """The bare problem of a chat ``prompt`` (the last user turn), or why it cannot be read."""
    if isinstance(prompt, str):
        if not prompt.strip().startswith("["):
            return _strip(prompt)
        try:  # a messages list serialised as JSON text
            prompt = json.loads(prompt)
        except ValueError:
            return _strip(prompt)
    if not isinstance(prompt, (list, tuple)) or not prompt:
        detail = f"prompt is {_type_and_repr(prompt)}, not messages"
        return Malformed("bad_prompt_structure", detail)
    users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        return Malformed("bad_prompt_structure", "prompt has no message with role 'user'")
    content = users[-1].get("content")
    if not isinstance(content, str):
        return Malformed("bad_prompt_structure", f"user content is {_type_and_repr(content)}")
    return _strip(content)


def _problem_of(rec: Mapping[str, Any], extra: Mapping[str, Any]) -> str | Malformed:
    """The bare problem: plain schema first, then the AIME files' raw_problem, then the prompt."""
    problem = _first_present(rec.get("problem"), rec.get("question"))
    if problem is None and isinstance(extra.get("raw_problem"), str) and extra["raw_problem"]:
        problem = extra["raw_problem"]
    if problem is None and "prompt" in rec:
        if rec["prompt"] is None:
            return Malformed("missing_problem", "prompt is null")
        problem = _problem_from_prompt(rec["prompt"])
        if isinstance(problem, Malformed):
            return problem
    if problem is None:
        return Malformed("missing_problem", "no problem, question or prompt field")
    if not isinstance(problem, str):
        return Malformed("problem_wrong_type", f"problem is {_type_and_repr(problem)}")
    problem = _strip(problem)
    if not problem:
        return Malformed("empty_problem", "problem is empty after stripping the template")
    return problem


def _answer_of(rec: Mapping[str, Any]) -> str | Malformed:
    """The raw answer: plain schema, then the DAPO/verl reward_model.ground_truth, then a label."""
    reward = rec.get("reward_model")
    if reward is not None and not isinstance(reward, Mapping) and rec.get("answer") is None:
        return Malformed("answer_wrong_type", f"reward_model is {_type_and_repr(reward)}")
    truth = reward.get("ground_truth") if isinstance(reward, Mapping) else None
    answer = _first_present(rec.get("answer"), truth, rec.get("label"), rec.get("ground_truth"))
    if answer is None:
        return Malformed("missing_answer", "no answer, reward_model.ground_truth or label")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        return Malformed("answer_wrong_type", f"answer is {_type_and_repr(answer)}")
    if isinstance(answer, float):
        # 12.0 is an integer stored as a float; 12.5 is not an answer this pipeline can grade.
        if not answer.is_integer():
            return Malformed("answer_wrong_type", f"answer is a float {answer!r}, not a string")
        answer = int(answer)
    answer = str(answer).strip()
    if not answer:
        return Malformed("empty_answer", "answer is empty")
    return answer


def parse_record(rec: Any) -> Row | Malformed:
    """One input record -> a Row, or the reason it is malformed (never raises)."""
    if isinstance(rec, Malformed):
        return rec
    if isinstance(rec, Problem):
        return Row(rec.problem, rec.answer, rec.id, prompt=rec.prompt, fixed_id=rec.id)
    if not isinstance(rec, Mapping):
        return Malformed("not_a_record", f"row is {_type_and_repr(rec)}")
    extra = rec.get("extra_info")
    extra = extra if isinstance(extra, Mapping) else {}
    problem = _problem_of(rec, extra)
    if isinstance(problem, Malformed):
        return problem
    answer = _answer_of(rec)
    if isinstance(answer, Malformed):
        return answer
    source_id = _first_present(extra.get("index"), rec.get("id"), rec.get("unique_id"))
    return Row(problem, answer, None if source_id is None else str(source_id))
