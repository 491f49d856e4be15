"""Rule-based outcome reward for integer-answer maths problems (DAPO, arXiv 2503.14476, Eq. 7).

DAPO scores a response with a plain correctness rule instead of a learned reward model::

    R(y_hat, y) = +1  if is_equivalent(y_hat, y)
                  -1  otherwise

Rules implemented here:

* The final answer is the content of the LAST line that starts with ``Answer:`` (the DAPO prompt
  asks for "The last line of your response should be of the form Answer: $Answer").  The
  marker is matched case-insensitively and may carry markdown (``**Answer:**``, ``## Answer:``,
  ``Final Answer:``).  If that line is empty, the next non-blank line is used (models often
  break the line after the marker); an empty marker at the very end counts as truncated.
* Without an Answer line, the content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` is used
  (balanced braces).  Otherwise there is no answer and the reward is -1.
* Ground truths are integers, compared as exact Python ints.  Equivalent spellings of the
  integer count (``023``, ``1,000``, ``1\\,000``, ``**540**``, ``$540$``, ``540 degrees``,
  ``x = 540``, ``540.0``, ``\\frac{1080}{2}``, ``2^3+1``...); hedges (``540 or 541``,
  ``\\pm 540``), non-integers, truncated or missing answers are wrong.  Reading an answer text
  as an integer is ``dapo_core.answers.parse_integer``.
* Cost is bounded by construction: only the tail of very long responses is scanned, and answer
  texts, integers and the exact arithmetic are size-limited.  ``score`` never raises.

Only the standard library is imported at module load; sympy is imported lazily on the rare
path that needs it (surds such as ``\\sqrt{2}\\cdot\\sqrt{8}``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dapo_core.answers import MAX_DIGITS, brace_group, parse_integer

__all__ = ["Score", "extract_answer", "score"]

# --- limits (each one bounds the work done on adversarial input) -------------------------------

# Only the last _SCAN_CHARS characters of a response are searched. DAPO's 20k-token responses are
# ~80 KB, so the last Answer line of any realistic response is inside this window.
_SCAN_CHARS = 200_000
# pred strings for answers that are not integers are clipped to this length.
_MAX_PRED_CHARS = 200


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


# --- answer extraction -------------------------------------------------------------------------

# Head of an answer line, matched at the start of a line. Allows markdown decoration before and
# around the marker: "**Answer:**", "**Answer**:", "## Final Answer:", "> answer :",
# "\textbf{Answer:}".
_ANSWER_HEAD = (
    r"[ \t]*(?:[>#*_\-][ \t]*)*(?:\\textbf\{[ \t]*)?(?:final[ \t]+)?answer"
    r"[ \t]*(?:\}|[*_]+)?[ \t]*[:：][ \t]*(?:\}|[*_]+)?"
)
_ANSWER_HEAD_RE = re.compile(_ANSWER_HEAD, re.IGNORECASE)
# What may sit between the word "answer" and its colon; the colon must come within this window.
_COLON_WINDOW = 16
_NEXT_LINE_RE = re.compile(r"\S[^\n]*")


def extract_answer(response: str) -> str | None:
    """Return the raw final-answer text of ``response``, or None when there is none.

    The last ``Answer:`` line wins; without one, the content of the last ``\\boxed{}``.
    """
    if not isinstance(response, str):
        return None
    text = response if len(response) <= _SCAN_CHARS else response[-_SCAN_CHARS:]
    content = _last_answer_line(text)
    if content is not None:
        # An Answer marker with nothing after it is a truncated answer, not a cue to look
        # elsewhere: the model did commit to the Answer-line format.
        return content or None
    return _last_boxed(text)


def _last_answer_line(text: str) -> str | None:
    """Content of the last line starting with an answer marker; '' if empty; None if no line.

    Walks occurrences of "answer" backwards with str.rfind (a fast C scan) instead of running a
    multiline regex over the whole text: the last occurrence is nearly always the Answer line
    itself, so a normal response costs one iteration. Matching "nswer"/"NSWER" covers Answer,
    answer and ANSWER without lowercasing the text. Each occurrence is looked at once and each
    line is matched at most once, so the walk is linear even on adversarial text.
    """
    rfind, find = text.rfind, text.find  # bound once: this loop is the hot path
    is_ascii = text.isascii()  # O(1); a full-width colon can only occur in non-ASCII text
    end = len(text)
    while True:
        hit = rfind("nswer", 0, end)
        upper = rfind("NSWER", hit + 1, end)  # only a later one matters
        if upper > hit:
            hit = upper
        if hit < 1:
            return None
        window = hit + 5 + _COLON_WINDOW
        if find(":", hit + 5, window) < 0 and (is_ascii or find("：", hit + 5, window) < 0):
            end = hit  # prose such as "the answer is": no colon follows
            continue
        at = hit - 1  # where "answer" starts
        line_start = rfind("\n", 0, at) + 1
        if at == line_start and text[at] in "aA" and text.startswith(":", hit + 5):
            return _line_content(text, hit + 6)  # the common "Answer: ..." line, regex-free
        m = _ANSWER_HEAD_RE.match(text, line_start)
        if m is not None:
            return _line_content(text, m.end())
        if line_start == 0:
            return None
        end = line_start  # no other occurrence on this line can start it


def _line_content(text: str, start: int) -> str:
    """The rest of the line from ``start``; if blank, the next non-blank line (or '')."""
    line_end = text.find("\n", start)
    if line_end < 0:
        return text[start:].strip()
    content = text[start:line_end].strip()
    if content:
        return content
    m = _NEXT_LINE_RE.search(text, line_end)
    return "" if m is None else m.group().strip()


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{}``/``\\fbox{}`` with balanced braces, else None."""
    boxed = text.rfind("\\boxed")
    fbox = text.rfind("\\fbox", boxed + 1)  # only a later \fbox matters
    if boxed < 0 and fbox < 0:
        return None
    start = boxed + 6 if boxed > fbox else fbox + 5
    content = brace_group(text, start)
    if content is None:
        return None
    return content.strip() or None


# --- ground truth and reward ----------------------------------------------------------------------

_INT_RE = re.compile(r"[-+]?\d+")
# Ground truths repeat across the G samples of a prompt and across epochs: cache short ones.
_TRUTH_CACHE: dict[str, int | None] = {}
_TRUTH_CACHE_MAX = 65_536
_TRUTH_CACHE_MAX_CHARS = 64


def _ground_truth_int(ground_truth: str) -> int | None:
    value = parse_integer(ground_truth)
    if len(ground_truth) <= _TRUTH_CACHE_MAX_CHARS:
        if len(_TRUTH_CACHE) >= _TRUTH_CACHE_MAX:
            _TRUTH_CACHE.clear()
        _TRUTH_CACHE[ground_truth] = value
    return value


def score(response: str, ground_truth: str) -> Score:
    """DAPO Eq. 7: +1 if the final answer equals the integer ground truth, else -1.

    Never raises: malformed input of any kind scores -1.
    """
    try:
        raw = extract_answer(response)
        if raw is None:
            return _WRONG_MISSING
        # Inline fast path for the usual bare integer (raw is already stripped); isascii keeps
        # out digits such as "²" that isdigit accepts but int() does not.
        if raw.isdigit() and raw.isascii() and len(raw) <= MAX_DIGITS:
            value = int(raw)
        else:
            value = parse_integer(raw)
        pred = str(value) if value is not None else raw[:_MAX_PRED_CHARS]
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
            # A non-integer ground truth (bad data) is only matched verbatim, modulo spaces.
            acc = "".join(raw.split()) == "".join(ground_truth.split())
        return _make_score(acc, pred)
    except Exception:  # defensive: the reward must never take down a training step
        return _WRONG_MISSING
