"""Rule-based outcome reward for maths answers (DAPO, arXiv 2503.14476, Eq. 7).

DAPO scores a response with a plain correctness rule instead of a learned reward model::

    R(y_hat, y) = +1  if is_equivalent(y_hat, y)
                  -1  otherwise

In three steps, each in a module of its own:

* The final answer ``y_hat`` is read from the response as its prompt asked for it
  (``answer_format``: ``dapo``'s last ``Answer:`` line, ``boxed``, ``minerva``, ``auto``):
  ``dapo_core.extraction``.
* A ground truth that is an integer is compared as an exact Python int with the integer the
  answer denotes (``dapo_core.answers.parse_integer``): equivalent spellings count (``023``,
  ``1,000``, ``32,\\! 349``, ``$540$``, ``540 degrees``, ``x = 540``, ``x \\approx 540``,
  ``540.0``, ``\\frac{1080}{2}``, ``2^3+1``...); hedges (``540 or 541``, ``\\pm 540``),
  non-integers (``2\\frac{1}{2}`` is the mixed number 5/2), truncated or missing answers are
  wrong.
* Any other ground truth (``\\frac{1}{3}``, ``0.4``, ``(3, \\frac{\\pi}{2})``) is judged by
  Math-Verify under guards and a deadline: ``dapo_core.equivalence``. A ground truth given as a
  worked solution (MATH's ``solution`` field) is the answer it marks, read as ``auto`` reads a
  response.

``score`` never raises. Only the standard library is imported at module load: sympy on the rare
integer path that needs it (surds such as ``\\sqrt{2}\\cdot\\sqrt{8}``), Math-Verify (and sympy)
at the first ground truth that is not an integer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dapo_core.answers import MAX_DIGITS, parse_integer
from dapo_core.deadline import Overtime
from dapo_core.equivalence import answer_key, equivalence_name, equivalent
from dapo_core.extraction import (
    ANSWER_FORMATS,
    MAX_PRED_CHARS,
    AnswerFormat,
    extract_answer,
)

# The reward's public face: what its callers import (the answer reading and the equivalence too).
__all__ = [
    "ANSWER_FORMATS",
    "AnswerFormat",
    "Score",
    "answer_key",
    "equivalence_name",
    "equivalent",
    "extract_answer",
    "score",
]


@dataclass(frozen=True)
class Score:
    """Outcome of scoring one response (DAPO Eq. 7)."""

    score: float  # +1.0 if correct else -1.0
    acc: bool  # correctness
    pred: str | None  # extracted answer, normalised ("540") when it is an integer; None if none


_WRONG_MISSING = Score(-1.0, False, None)
_UNCACHED = object()

# Scores are immutable, so identical ones are shared: building a frozen dataclass costs about as
# much as extracting a plain answer, and a batch of G samples per prompt repeats the same preds.
_SCORE_CACHE: dict[tuple[bool, str], Score] = {}
_SCORE_CACHE_MAX = 8192
_SCORE_CACHE_MAX_PRED = 32


def _make_score(acc: bool, pred: str) -> Score:
    if len(pred) > _SCORE_CACHE_MAX_PRED:
        return Score(1.0 if acc else -1.0, acc, pred)
    key = (acc, pred)
    cached = _SCORE_CACHE.get(key)
    if cached is None:
        if len(_SCORE_CACHE) >= _SCORE_CACHE_MAX:
            _SCORE_CACHE.clear()  # bounded memory; the hot entries come back quickly
        cached = _SCORE_CACHE[key] = Score(1.0 if acc else -1.0, acc, pred)
    return cached


# --- ground truth and reward ----------------------------------------------------------------------

_INT_RE = re.compile(r"[-+]?\d+")
# Ground truths repeat across the G samples of a prompt and across epochs: cache short ones.
_TRUTH_CACHE: dict[str, int | None] = {}
_TRUTH_CACHE_MAX = 65_536
_TRUTH_CACHE_MAX_CHARS = 64


def _ground_truth_int(ground_truth: str) -> int | None:
    value = parse_integer(ground_truth)
    if value is None and ground_truth != (gold := _gold_answer(ground_truth)):
        value = parse_integer(gold)  # a worked solution whose marked answer is an integer
    if len(ground_truth) <= _TRUTH_CACHE_MAX_CHARS:
        if len(_TRUTH_CACHE) >= _TRUTH_CACHE_MAX:
            _TRUTH_CACHE.clear()
        _TRUTH_CACHE[ground_truth] = value
    return value


# A ground truth given as a worked solution (MATH's ``solution`` field) marks its answer so.
_GOLD_MARKERS_RE = re.compile(r"\\boxed|\\fbox|answer", re.IGNORECASE)


def _gold_answer(ground_truth: str) -> str:
    """The answer a ground truth marks when it is a worked solution (a box, an Answer line, a
    Minerva sentence: read as format ``auto`` reads a response), else the ground truth itself."""
    if _GOLD_MARKERS_RE.search(ground_truth) is None:
        return ground_truth
    return extract_answer(ground_truth, "auto") or ground_truth


def score(response: str, ground_truth: str, answer_format: AnswerFormat = "dapo") -> Score:
    """DAPO Eq. 7: +1 if the final answer is equivalent to the ground truth, else -1.

    ``answer_format`` names how the prompt asked for the answer (see the module docstring).
    Never raises: malformed input of any kind scores -1.
    """
    try:
        raw = extract_answer(response, answer_format)
        if not raw:
            return _WRONG_MISSING
        # Inline fast path for the usual bare integer (raw is already stripped); isascii keeps
        # out digits such as "²" that isdigit accepts but int() does not.
        if raw.isdigit() and raw.isascii() and len(raw) <= MAX_DIGITS:
            value = int(raw)
            pred = raw if raw[0] != "0" or len(raw) == 1 else str(value)
        else:
            value = parse_integer(raw)
            pred = str(value) if value is not None else raw[:MAX_PRED_CHARS]
        if not isinstance(ground_truth, str):
            ground_truth = str(ground_truth)
        truth = _TRUTH_CACHE.get(ground_truth, _UNCACHED)
        if truth is _UNCACHED:
            truth = _ground_truth_int(ground_truth)
        if truth is not None:
            acc = value is not None and value == truth
        elif _INT_RE.fullmatch(ground_truth.strip()):
            acc = False  # an integer past the length cap: wrong by rule, like such an answer
        else:
            acc = equivalent(raw, _gold_answer(ground_truth))
        return _make_score(acc, pred)
    except (Exception, Overtime):  # defensive: the reward must never take down a step
        return _WRONG_MISSING
