"""Rule-based outcome reward for maths answers (DAPO, arXiv 2503.14476, Eq. 7).

DAPO scores a response with a plain correctness rule instead of a learned reward model::

    R(y_hat, y) = +1  if is_equivalent(y_hat, y)
                  -1  otherwise

Rules implemented here:

* Which text is the final answer depends on the prompt (``answer_format``):

  - ``dapo`` (training, and DAPO's own prompt "The last line of your response should be of the
    form Answer: $Answer"): what follows the LAST ``Answer:`` marker, wherever it stands in its
    line (``So we get it. Answer: 540``; ``Answer: 12`` then ``Wait. Answer: 13`` reads 13), up
    to the end of that line. The marker is matched case-insensitively and may carry markdown
    (``**Answer:**``, ``**Answer**:``, ``Final Answer:``). If nothing follows it on its line, the
    next non-blank line is used (models often break the line after the marker); an empty marker
    at the very end counts as truncated. Without a marker, the content of the LAST
    ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces, or LaTeX's unbraced ``\\boxed 4``).
    verl's ``math_dapo`` reward takes the last match of ``(?i)Answer\\s*:\\s*([^\\n]+)`` in the
    response's last 300 characters and has no box fallback. We read the whole response (its
    last ``_SCAN_CHARS`` characters), so an answer followed by a long check still counts, where
    verl scores it wrong; the prompt asks for the answer on the last line, and a policy that
    writes it earlier is not punished for the check it adds.
  - ``boxed`` ("put your final answer within \\boxed{}": Qwen2.5-Math, DeepSeek-R1, lighteval):
    the last box only.
  - ``minerva`` (the Minerva / lm-evaluation-harness prompt, "Final Answer: The final answer is
    $X$. I hope it is correct."): X of the last "final answer is" sentence only.
  - ``auto`` (a prompt of unknown style): whichever of those markers comes last in the
    response, ``Final Answer:`` counting anywhere in a line; with none, the sentence that
    Minerva's "I hope it is correct" closes; else a response that is one short line (or one
    display formula) is itself the answer. An answer written as a sentence of prose (``Final
    Answer: Jane started 3 hours ago.``) is the one number it names, if it names exactly one.

  Under ``dapo`` (and wherever Answer lines are read) a display formula ``\\[ ... \\]`` or
  ``$$ ... $$`` opened after the marker is read whole, across its lines.

  A Minerva sentence on an Answer line (``Final Answer: The final answer is $100$. I hope it
  is correct.``) is read as its value (``$100$``) wherever Answer lines are read.
* Equivalence. A ground truth that is an integer is compared as an exact Python int with the
  integer the answer denotes (``dapo_core.answers.parse_integer``): equivalent spellings count
  (``023``, ``1,000``, ``32,\\! 349``, ``$540$``, ``540 degrees``, ``x = 540``, ``x \\approx
  540``, ``540.0``, ``\\frac{1080}{2}``, ``2^3+1``...); hedges (``540 or 541``, ``\\pm 540``),
  non-integers (``2\\frac{1}{2}`` is the mixed number 5/2), truncated or missing answers are
  wrong. Any other ground truth (``\\frac{1}{3}``, ``0.4``, ``(3, \\frac{\\pi}{2})``) is judged by
  Math-Verify (the checker TRL, open-r1 and lighteval use), so ``1/2`` = ``0.5``, ``\\dfrac{1}{3}``
  = ``\\frac13``, ``.4`` = ``0.4``, ``\\frac{1}{3}\\text{ meters}`` and ``k = \\frac{1}{3}`` =
  ``\\frac{1}{3}``; a ground truth it cannot read is matched verbatim, modulo blanks. A decimal
  comma (``1000,99``) is read as a decimal point against a number written with one (a list such
  as ``-2,1`` stays a list). A ground truth given as a worked solution (MATH's ``solution``
  field) is the answer it marks, read as ``auto`` reads a response.
* Cost is bounded: only the tail of very long responses is scanned; answer texts, integers and
  the exact arithmetic are size-limited; Math-Verify sees only short, shallow answer texts
  without power towers or huge factorials, under a deadline that works in any thread
  (Math-Verify's own timeout is ``signal.alarm``, which only the main thread may use). ``score``
  never raises.

Only the standard library is imported at module load: sympy on the rare integer path that needs
it (surds such as ``\\sqrt{2}\\cdot\\sqrt{8}``), Math-Verify (and sympy) at the first ground truth
that is not an integer.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from dapo_core.answers import MAX_DIGITS, balanced_braces, box_argument, parse_integer
from dapo_core.exact import MAX_CHARS

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

AnswerFormat = Literal["dapo", "boxed", "minerva", "auto"]
ANSWER_FORMATS: tuple[str, ...] = ("dapo", "boxed", "minerva", "auto")

# --- limits (each one bounds the work done on adversarial input) -------------------------------

# Only the last _SCAN_CHARS characters of a response are searched. DAPO's 20k-token responses are
# ~80 KB, so the last Answer line of any realistic response is inside this window.
_SCAN_CHARS = 200_000
# pred strings for answers that are not integers are clipped to this length.
_MAX_PRED_CHARS = 200
# A whole response read as a bare answer (format auto) is one line of at most this many chars.
_MAX_BARE_CHARS = 100


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


def extract_answer(response: str, answer_format: AnswerFormat = "dapo") -> str | None:
    """Return the raw final-answer text of ``response`` in ``answer_format``, or None.

    ``dapo``: the last ``Answer:`` line wins; without one, the content of the last box.
    ``boxed``: the last box. ``minerva``: the last "final answer is X" sentence. ``auto``: the
    latest of the three; else the response itself when it is one short line.
    """
    if not isinstance(response, str):
        return None
    reader = _READERS.get(answer_format)
    if reader is None:
        raise ValueError(f"unknown answer format {answer_format!r}: one of {ANSWER_FORMATS}")
    text = response if len(response) <= _SCAN_CHARS else response[-_SCAN_CHARS:]
    return reader(text)


def _dapo_answer(text: str) -> str | None:
    """DAPO's rule: the last Answer marker, wherever it stands in its line, else the last box."""
    found = _last_answer_line(text, anywhere=True)
    if found is not None:
        # An Answer marker with nothing after it is a truncated answer, not a cue to look
        # elsewhere: the model did commit to the Answer-line format.
        return _sentence_value(found[1]) or None
    found = _last_boxed(text)
    return None if found is None else found[1]


def _boxed_answer(text: str) -> str | None:
    found = _last_boxed(text)
    return None if found is None else found[1]


def _minerva_answer(text: str) -> str | None:
    found = _last_final_answer_sentence(text)
    return None if found is None else found[1]


def _auto_answer(text: str) -> str | None:
    """The marked answer that comes last (Answer line, Minerva sentence, ``Final Answer:``
    anywhere in a line, box), else the sentence closed by "I hope it is correct", else a bare one.

    A tie cannot happen between different markers' starts, except an Answer line starting with
    "Final Answer:", which both read alike. A box inside an Answer line starts after it, so
    ``Answer: $\\boxed{5}$`` reads the box's content. An answer given in a sentence of prose
    (``Final Answer: Jane started 3 hours ago.``) is the one number it names, if it names one.
    """
    candidates = [
        found
        for found in (
            _last_answer_line(text),
            _last_final_answer_sentence(text),
            _last_final_answer_colon(text),
            _last_boxed(text),
        )
        if found is not None
    ]
    if candidates:
        start, value = max(candidates)
        value = _sentence_value(value)
        if not value:
            return None
        return value if text.startswith(("\\boxed", "\\fbox"), start) else _prose_value(value)
    hoped = _hoped_sentence(text)
    if hoped is not None:
        return _prose_value(hoped)
    bare = text.strip()
    if not bare or len(bare) > _MAX_BARE_CHARS:
        return None
    if (m := _BARE_LEAD_RE.match(bare)) is not None:
        bare = bare[m.end() :]
    if "\n" not in bare:
        return bare or None
    # Over several lines only as one display formula: "Answer \\[ \n 9 \n \\]".
    block = _display_block(bare, 0)
    return block[0] if block is not None and block[1] == len(bare) else None


# "Answer $9$", "The answer: 9": a word before a bare answer, which a response of one line may
# carry without a colon.
_BARE_LEAD_RE = re.compile(r"(?:the[ \t]+)?(?:final[ \t]+)?answer\b[ \t]*:?[ \t]*", re.IGNORECASE)

_READERS: dict[str, Callable[[str], str | None]] = {
    "dapo": _dapo_answer,
    "boxed": _boxed_answer,
    "minerva": _minerva_answer,
    "auto": _auto_answer,
}

# Head of an answer line, matched at the start of a line. Allows markdown decoration before and
# around the marker: "**Answer:**", "**Answer**:", "## Final Answer:", "> answer :",
# "\textbf{Answer:}".
_ANSWER_HEAD = (
    r"[ \t]*(?:[>#*_\-][ \t]*)*(?:\\textbf\{[ \t]*)?(?:final[ \t]+)?answer"
    r"[ \t]*(?:\}|[*_]+)?[ \t]*[:：][ \t]*(?:\}|[*_]+)?"
)
_ANSWER_HEAD_RE = re.compile(_ANSWER_HEAD, re.IGNORECASE)
# The marker itself, wherever it stands (format dapo): "Answer:", "answer :", "Answer**:",
# "Answer:**", "\textbf{Answer:}".
_MARKER_RE = re.compile(r"answer[ \t]*(?:\}|[*_]+)?[ \t]*[:：][ \t]*(?:\}|[*_]+)?", re.IGNORECASE)
# What may sit between the word "answer" and its colon; the colon must come within this window.
_COLON_WINDOW = 16
_NEXT_LINE_RE = re.compile(r"\S[^\n]*")


def _last_answer_line(text: str, anywhere: bool = False) -> tuple[int, str] | None:
    """(start, content) of the last answer marker, else None; the content is '' when the
    marker has nothing after it. The marker must start its line (after markdown decoration),
    or, with ``anywhere``, may stand anywhere in it (then ``start`` is the marker's own).

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
        if anywhere:
            m = _MARKER_RE.match(text, at)
            if m is not None:
                return at, _line_content(text, m.end())
            end = hit
            continue
        line_start = rfind("\n", 0, at) + 1
        if at == line_start and text[at] in "aA" and text.startswith(":", hit + 5):
            return line_start, _line_content(text, hit + 6)  # "Answer: ...", regex-free
        m = _ANSWER_HEAD_RE.match(text, line_start)
        if m is not None:
            return line_start, _line_content(text, m.end())
        if line_start == 0:
            return None
        end = line_start  # no other occurrence on this line can start it


def _line_content(text: str, start: int) -> str:
    """The rest of the line from ``start``; if blank, the next non-blank line (or ''). A display
    formula opened there (``\\[``, ``$$``) is read to its end, across lines, as one line."""
    line_end = text.find("\n", start)
    if line_end < 0:
        return text[start:].strip()
    content = text[start:line_end].strip()
    if content:
        if (
            content.startswith(_DISPLAY_OPENERS)
            and _DISPLAY_CLOSERS[content[:2]] not in content[2:]
        ):
            block = _display_block(text, text.index(content[0], start))
            if block is not None:
                return block[0]
        return content
    m = _NEXT_LINE_RE.search(text, line_end)
    if m is None:
        return ""
    if m.group().startswith(_DISPLAY_OPENERS):
        block = _display_block(text, m.start())
        if block is not None:
            return block[0]
    return m.group().strip()


# Display formulas, which may span lines: \[ ... \] and $$ ... $$ (inline $...$ and \(...\) may
# not). Read up to _MAX_PRED_CHARS characters.
_DISPLAY_OPENERS = ("\\[", "$$")
_DISPLAY_CLOSERS = {"\\[": "\\]", "$$": "$$"}


def _display_block(text: str, start: int) -> tuple[str, int] | None:
    """(the display formula opening at ``start`` and the rest of the line it closes on, joined
    into one line; where that line ends in ``text``), else None. What follows the formula stays
    (``\\[ 5 \\] or \\[ 6 \\]`` is a hedge)."""
    opener = text[start : start + 2]
    closer = _DISPLAY_CLOSERS.get(opener)
    if closer is None:
        return None
    close = text.find(closer, start + 2, start + 2 + _MAX_PRED_CHARS)
    if close < 0:
        return None
    end = text.find("\n", close, close + _MAX_PRED_CHARS)  # at most a long answer's worth
    end = min(len(text), close + _MAX_PRED_CHARS) if end < 0 else end
    return " ".join(text[start:end].split()), end


def _last_boxed(text: str) -> tuple[int, str] | None:
    """(start, content) of the last ``\\boxed``/``\\fbox`` when its argument is whole, else None.

    Only the last box counts: a broken one (a truncated response) is no answer, not a cue to
    read an earlier box."""
    boxed = text.rfind("\\boxed")
    fbox = text.rfind("\\fbox", boxed + 1)  # only a later \fbox matters
    if boxed < 0 and fbox < 0:
        return None
    start, end = (boxed, boxed + 6) if boxed > fbox else (fbox, fbox + 5)
    if text.startswith("{", end):  # the usual flat "\boxed{540}", read without brace_group
        close = text.find("}", end)
        if 0 < close - end <= _MAX_PRED_CHARS and "{" not in text[end + 1 : close]:
            content = text[end + 1 : close].strip()
            if text[close - 1] != "\\":
                return (start, content) if content else None
    found = box_argument(text, end)
    if found is None:
        return None
    content = found[0].strip()
    return (start, content) if content else None


# "The final answer is $X$. I hope it is correct." (Minerva; lm-evaluation-harness's minerva_math
# reads X between "The final answer is" and ". I hope it is correct.").
_FINAL_ANSWER_IS_RE = re.compile(r"final[ \t]+answer[ \t]+is\b[ \t]*:?[ \t]*", re.IGNORECASE)
_SENTENCE_HEAD_RE = re.compile(r"(?:the[ \t]+)?final[ \t]+answer[ \t]+is\b[ \t]*:?", re.IGNORECASE)
_HOPE_RE = re.compile(r"I hope it is correct", re.IGNORECASE)


def _last_final_answer_sentence(text: str) -> tuple[int, str] | None:
    """(start, X) of the last "final answer is X" sentence, X up to the end of its line (or on
    the next line when the sentence breaks there), else None."""
    last = None
    for m in _FINAL_ANSWER_IS_RE.finditer(text):
        last = m
    if last is None:
        return None
    # The sentence's own full stop is no part of X ("... is $\frac{1}{2}$.").
    value = _sentence_value(_line_content(text, last.end())).rstrip(" .")
    return (last.start(), value) if value else None


def _sentence_value(content: str) -> str:
    """``content`` without the Minerva sentence around its value: "The final answer is $100$. I
    hope it is correct." -> "$100$"; anything else is returned as it is.

    Substring tests keep the regexes off the hot path: most answer lines are a bare value.
    """
    if "hope" not in content and "inal answer" not in content and "INAL ANSWER" not in content:
        return content
    hope = _HOPE_RE.search(content)
    if hope is not None:  # what follows it is chatter ("<|im_start|>user", a note)
        content = content[: hope.start()]
    head = _SENTENCE_HEAD_RE.match(content)
    if head is not None:
        content = content[head.end() :]
    return content.strip().rstrip(".").strip()


# "Final Answer:" anywhere in a line (a Minerva-style marker that lost its line break), read by
# the auto format only: DAPO's own marker must start a line.
_FINAL_ANSWER_COLON_RE = re.compile(r"final[ \t]+answer[ \t]*[:：]", re.IGNORECASE)


def _last_final_answer_colon(text: str) -> tuple[int, str] | None:
    """(start, content) of the last "Final Answer:" anywhere in a line, else None."""
    last = None
    for m in _FINAL_ANSWER_COLON_RE.finditer(text):
        last = m
    if last is None:
        return None
    content = _line_content(text, last.end())
    return (last.start(), content) if content else None


# Where a sentence ends: a full stop, "!" or "?" before a blank (not "7.78"), or a line break.
_SENTENCE_END_RE = re.compile(r"[.!?](?=\s)|\n")


def _hoped_sentence(text: str) -> str | None:
    """The sentence before the last "I hope it is correct" (Minerva's closing words) when no
    marker names the answer, e.g. "Therefore, there are 12 sequences. I hope it is correct."."""
    last = None
    for m in _HOPE_RE.finditer(text):
        last = m
    if last is None:
        return None
    head = text[max(0, last.start() - _MAX_PRED_CHARS) : last.start()].rstrip().rstrip(".!?")
    ends = [m.end() for m in _SENTENCE_END_RE.finditer(head)]
    sentence = head[ends[-1] if ends else 0 :].strip()
    return sentence or None


# Prose around an answer: words of two letters or more outside math and LaTeX commands.
_MATH_SEGMENT_RE = re.compile(r"\$\$.+?\$\$|\$.+?\$|\\\(.+?\\\)|\\\[.+?\\\]", re.DOTALL)
_PROSE_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_PROSE_NUMBER_RE = re.compile(r"(?<![\w.,])[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?(?![\w])")
_MIN_PROSE_WORDS = 3


def _prose_value(content: str) -> str:
    """The one number a sentence of prose names ("Jane started 3 hours ago" -> "3"; a formula
    with a digit counts as one, "$\\frac{1}{2}$"); ``content`` itself when it is not prose, has
    LaTeX outside math, or names no number or several (a hedge stays a hedge)."""
    if len(content) > _MAX_PRED_CHARS or not any(c.isalpha() for c in content):
        return content
    outside = _MATH_SEGMENT_RE.sub(" ", content)
    if "\\" in outside or len(_PROSE_WORD_RE.findall(outside)) < _MIN_PROSE_WORDS:
        return content  # LaTeX outside math ("2\\frac12 cups"): which number is meant is unclear
    found = [m.group() for m in _MATH_SEGMENT_RE.finditer(content) if _has_digit(m.group())]
    found += _PROSE_NUMBER_RE.findall(outside)
    return found[0] if len(found) == 1 else content


def _has_digit(text: str) -> bool:
    return any(c.isdigit() for c in text)


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


def _last_line_answer(response: str, answer_format: str) -> str | None:
    """The answer when the last line starts with ``Answer:``, else None (then the general path
    decides).

    Most training responses end this way, and nothing after the last line can outrank it, so
    reading it costs a few string operations where the general path walks the text. Under
    ``dapo`` any such line is the answer ('' when it is empty: truncated); under ``auto`` only
    a bare integer is (a box on that line would be a later marker).
    """
    start = response.rfind("\n") + 1
    if not response.startswith("Answer:", start) or len(response) - start > _SCAN_CHARS:
        return None
    content = response[start + 7 :].strip()
    if answer_format == "dapo" and ("nswer" in content or "NSWER" in content):
        return None  # a later marker on the line may take the answer back: the general path
    if content.isdigit():
        return content if answer_format == "dapo" or answer_format == "auto" else None
    return _sentence_value(content) if answer_format == "dapo" else None


def score(response: str, ground_truth: str, answer_format: AnswerFormat = "dapo") -> Score:
    """DAPO Eq. 7: +1 if the final answer is equivalent to the ground truth, else -1.

    ``answer_format`` names how the prompt asked for the answer (see the module docstring).
    Never raises: malformed input of any kind scores -1.
    """
    try:
        raw = _last_line_answer(response, answer_format) if type(response) is str else None
        if raw is None:
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
            acc = equivalent(raw, _gold_answer(ground_truth))
        return _make_score(acc, pred)
    except (Exception, _Overtime):  # defensive: the reward must never take down a step
        return _WRONG_MISSING


# --- equivalence beyond integers: Math-Verify, guarded ---------------------------------------

# Budget of one Math-Verify judgement (parsing both texts and comparing them), in CPU seconds of
# the scoring thread, so that a busy machine does not turn a slow judgement into a wrong one: the
# slowest of MATH-500's answers takes 0.16 s once Math-Verify is warm. Wall-clock time is capped
# too, at _EQUIVALENCE_WALL_SECONDS.
_EQUIVALENCE_SECONDS = 1.0
_EQUIVALENCE_WALL_SECONDS = 10.0
# Texts Math-Verify must not see: sympy would compute these in single C calls (a power tower,
# the factorial or binomial of a huge number), which no deadline can interrupt.
_POWER_TOWER_RE = re.compile(r"\^\s*(?:\{[^{}]*\^|\(?\s*[\d.]+\s*\)?\s*\^|\{?\s*[-+]?\s*\d{6})")
_HUGE_FACTORIAL_RE = re.compile(r"\d{5}\s*\}?\s*\)?\s*!|binom\s*\{?\s*\d{5}|choose\s*\d{5}")
_LATEX_DELIMITERS = ("$", "\\(", "\\[", "\\boxed")
# Brackets nested deeper are refused: answers nest a few levels (\left( 3, \frac{\pi}{2} \right)
# is 3), and each level multiplies the parser's work.
_MAX_NESTING = 12
# Judgements repeat (the n samples of a problem often agree): cache short ones.
_EQUIVALENCE_CACHE: dict[tuple[str, str], bool] = {}
_EQUIVALENCE_CACHE_MAX = 8192
_GOLD_CACHE: dict[str, Any] = {}


def equivalent(answer: str, ground_truth: str) -> bool:
    """Math-Verify's verdict on whether ``answer`` denotes ``ground_truth`` (both answer texts).

    False when the answer is refused (longer than ``exact.MAX_CHARS``, nested too deep, a power
    tower, a huge factorial, unbalanced braces) or the judgement runs past its deadline. A
    ground truth that is refused, or that Math-Verify cannot read, is matched verbatim, modulo
    blanks. Never raises.
    """
    if _refused(answer):
        return False
    if _refused(ground_truth):
        return _verbatim(answer, ground_truth)
    answer, ground_truth = (
        _decimal_comma(answer, ground_truth),
        _decimal_comma(ground_truth, answer),
    )
    key = (answer, ground_truth)
    cached = _EQUIVALENCE_CACHE.get(key)
    if cached is not None:
        return cached
    try:
        verdict = _judge(answer, ground_truth)
    except (Exception, _Overtime):  # a deadline or a parser failure: not shown equivalent
        return False
    if len(_EQUIVALENCE_CACHE) >= _EQUIVALENCE_CACHE_MAX:
        _EQUIVALENCE_CACHE.clear()
    _EQUIVALENCE_CACHE[key] = verdict
    return verdict


# Answer keys repeat (a problem's n samples): cache short ones.
_KEY_CACHE: dict[str, str] = {}


def answer_key(answer: str | None) -> str | None:
    """What majority voting groups answers by: a canonical string of the value ``answer``
    denotes, so that equivalent answers share it (``540``, ``$540$`` and ``\\frac{1080}{2}`` ->
    ``540``; ``0.5``, ``1/2`` and ``\\dfrac{1}{2}`` -> ``1/2``; ``\\sqrt{117}`` and
    ``3\\sqrt{13}`` -> ``3*sqrt(13)``; ``k = \\frac13`` -> ``1/3``). Integers by
    ``parse_integer``; anything else by Math-Verify's parse (under the guards and the deadline of
    :func:`equivalent`), decimals made exact fractions, then sympy's own evaluation; an answer it
    cannot read is its text without blanks. None for None. Never raises.

    Cheaper than judging every pair of answers, and less lenient: two keys differ when sympy's
    evaluation leaves two spellings of one value apart (``\\frac{\\sqrt{2}}{2}`` and
    ``\\frac{1}{\\sqrt{2}}``), which only splits a vote."""
    if answer is None:
        return None
    try:
        if not isinstance(answer, str):
            answer = str(answer)
        if answer.isdigit() and answer.isascii() and len(answer) <= MAX_DIGITS:
            return str(int(answer))
        value = parse_integer(answer)
        if value is not None:
            return str(value)
        key = _KEY_CACHE.get(answer)
        if key is None:
            key = _value_key(answer)
            if len(answer) <= _SCORE_CACHE_MAX_PRED:
                if len(_KEY_CACHE) >= _EQUIVALENCE_CACHE_MAX:
                    _KEY_CACHE.clear()
                _KEY_CACHE[answer] = key
        return key
    except (Exception, _Overtime):  # defensive: a vote is never worth a crash
        return "".join(str(answer).split())


def _value_key(answer: str) -> str:
    text = "".join(answer.split())
    math_verify = None if _refused(answer) else _math_verify()
    if math_verify is None:
        return text
    try:
        with _deadline(_EQUIVALENCE_SECONDS, _EQUIVALENCE_WALL_SECONDS):
            parsed = math_verify.parse(_as_latex(answer), parsing_timeout=None)
            if not parsed:
                return text
            import sympy

            value = parsed[0]
            if isinstance(value, sympy.Eq):  # "k = 1/3": the value it names
                value = value.rhs
            if not isinstance(value, sympy.Basic):
                return text
            floats = value.atoms(sympy.Float)
            if floats:
                value = value.xreplace({f: sympy.Rational(str(f)) for f in floats})
            return str(value.doit())
    except (Exception, _Overtime):  # a deadline or a parser failure: the text itself
        return text


def _judge(answer: str, ground_truth: str) -> bool:
    math_verify = _math_verify()  # imported outside the deadline: an import is never cut short
    if math_verify is None:
        return _verbatim(answer, ground_truth)
    with _deadline(_EQUIVALENCE_SECONDS, _EQUIVALENCE_WALL_SECONDS):
        gold = _GOLD_CACHE.get(ground_truth)
        if gold is None:
            gold = math_verify.parse(_as_latex(ground_truth), parsing_timeout=None)
            if len(_GOLD_CACHE) >= _EQUIVALENCE_CACHE_MAX:
                _GOLD_CACHE.clear()
            _GOLD_CACHE[ground_truth] = gold
        if not gold:
            return _verbatim(answer, ground_truth)
        pred = math_verify.parse(_as_latex(answer), parsing_timeout=None)
        return bool(math_verify.verify(gold, pred, timeout_seconds=None))


def _refused(text: str) -> bool:
    """Texts not given to Math-Verify: too long, too deep, too costly (see the patterns above),
    or cut off (unbalanced braces: Math-Verify would read ``\\boxed{\\frac{1}{2}`` as 1/2)."""
    return (
        len(text) > MAX_CHARS
        or _nesting(text) > _MAX_NESTING
        or _POWER_TOWER_RE.search(text) is not None
        or _HUGE_FACTORIAL_RE.search(text) is not None
        or not balanced_braces(text)
    )


def _nesting(text: str) -> int:
    """The deepest nesting of brackets of any kind in ``text``."""
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def _as_latex(text: str) -> str:
    """``text`` in math delimiters unless it has them (Math-Verify reads LaTeX only there); an
    escaped dollar is a currency sign, not a delimiter: dropped."""
    text = text.replace("\\$", "").strip()
    return text if any(d in text for d in _LATEX_DELIMITERS) else f"${text}$"


# "1000,99", "-2,1": digits, a comma, digits, not grouped by threes (a thousands separator).
_DECIMAL_COMMA_RE = re.compile(r"[-+]?\d+,\d+")
_GROUPED_RE = re.compile(r"[-+]?[1-9]\d{0,2}(?:,\d{3})+")
_DECIMAL_POINT_RE = re.compile(r"[-+]?\d*\.\d+")


def _decimal_comma(text: str, other: str) -> str:
    """``text`` with its comma read as a decimal point when it is a number with a decimal comma
    (``1000,99``) and ``other`` is a number with a decimal point (``1000.99``); else ``text``.

    Only then: MATH writes lists so (``-2,1`` is the two answers -2 and 1), and Math-Verify
    would read plain ``-2,1`` as -2.1."""
    if "," not in text or _DECIMAL_COMMA_RE.fullmatch(text) is None or _GROUPED_RE.fullmatch(text):
        return text
    bare = other.replace("$", "").strip()
    return text.replace(",", ".") if _DECIMAL_POINT_RE.fullmatch(bare) else text


def _verbatim(answer: str, ground_truth: str) -> bool:
    return "".join(answer.split()) == "".join(ground_truth.split())


_MATH_VERIFY: list[Any] = []  # [module or None], filled at first use


def _math_verify() -> Any:
    """The math_verify module (None when it is not installed), imported at first use."""
    if not _MATH_VERIFY:
        try:
            import math_verify
        except ImportError:
            math_verify = None
        else:
            # Its timeouts are off here (our deadline replaces them); it says so once per
            # process, which is noise, not news.
            for name in ("math_verify.parser", "math_verify.grader"):
                logging.getLogger(name).addFilter(_NoTimeoutNotice())
            _warm_up(math_verify)
        _MATH_VERIFY.append(math_verify)
    return _MATH_VERIFY[0]


def _warm_up(math_verify: Any) -> None:
    """One judgement outside any deadline: the first builds the LaTeX parser (~0.5 s of CPU),
    a one-off cost that must not count against the first answer judged."""
    try:
        gold = math_verify.parse("$\\frac{1}{2}$", parsing_timeout=None)
        pred = math_verify.parse("$0.5$", parsing_timeout=None)
        math_verify.verify(gold, pred, timeout_seconds=None)
    except Exception:  # a failed warm-up only means a slower first judgement
        return


class _NoTimeoutNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def equivalence_name() -> str:
    """How equivalence is judged, for reports: "exact integers, else math-verify 0.9.0".

    Read from the installed package's metadata: naming the judge does not import it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"exact integers, else math-verify {version('math-verify')}"
    except PackageNotFoundError:
        return "exact integers, else verbatim text (math-verify is not installed)"


# --- a deadline that works in any thread -----------------------------------------------------


class _Overtime(BaseException):
    """Raised inside a judgement that ran past its deadline.

    A BaseException, like KeyboardInterrupt: Math-Verify and sympy catch ``Exception`` in their
    loops, and would otherwise swallow it and go on working."""


@contextmanager
def _deadline(cpu_seconds: float, wall_seconds: float) -> Iterator[None]:
    """Raise :class:`_Overtime` in this thread once the block has used ``cpu_seconds`` of this
    thread's CPU time, or ``wall_seconds`` have passed.

    A timer thread raises it asynchronously in the calling thread (``PyThreadState_SetAsyncExc``),
    which takes effect between two bytecodes, as a signal handler would; unlike
    ``signal.alarm`` (Math-Verify's own timeout) it works off the main thread and leaves the
    process's alarm alone. It fires once: an exception raised inside a garbage-collector callback
    is swallowed there, and the block then runs to its end. A long single C call finishes
    first: the guards keep those out. Without a per-thread CPU clock (outside Linux and the
    BSDs) the budget is wall-clock time.
    """
    thread_id = threading.get_ident()
    cpu_clock = _thread_cpu_clock(thread_id)
    cpu_start = time.clock_gettime(cpu_clock) if cpu_clock is not None else 0.0
    wall_end = time.monotonic() + wall_seconds
    lock = threading.Lock()
    state: dict[str, Any] = {"open": True, "fired": False, "timer": None}

    def check() -> None:
        """Fire if the budget is spent; otherwise check again when it could be."""
        with lock:
            if not state["open"]:
                return
            left = wall_end - time.monotonic()
            if cpu_clock is not None:
                try:
                    left = min(left, cpu_seconds - (time.clock_gettime(cpu_clock) - cpu_start))
                except OSError:  # the thread is gone: nothing to interrupt
                    return
            if left > 0:
                arm(left)
                return
            state["fired"] = True
            _raise_in_thread(thread_id, _Overtime)

    def arm(delay: float) -> None:
        timer = threading.Timer(delay, check)
        timer.daemon = True
        state["timer"] = timer
        timer.start()

    with lock:
        arm(min(cpu_seconds, wall_seconds))
    try:
        yield
    finally:
        with lock:
            state["open"] = False
            state["timer"].cancel()
            if state["fired"]:
                _raise_in_thread(thread_id, None)  # withdraw it if it has not been raised yet


def _thread_cpu_clock(thread_id: int) -> int | None:
    """The CPU-time clock of thread ``thread_id`` (readable from any thread), if there is one."""
    try:
        return time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError):
        return None


def _raise_in_thread(thread_id: int, exception: type[BaseException] | None) -> None:
    """Schedule ``exception`` in thread ``thread_id`` (None withdraws a scheduled one)."""
    exc = ctypes.py_object(exception) if exception is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc)
