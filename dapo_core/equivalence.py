"""Whether an answer denotes a ground truth that is not an integer, and what a majority vote
groups answers by (the reward's second half, ``dapo_core.reward``).

Math-Verify (the checker TRL, open-r1 and lighteval use) judges, so ``1/2`` = ``0.5``,
``\\dfrac{1}{3}`` = ``\\frac13``, ``.4`` = ``0.4``, ``\\frac{1}{3}\\text{ meters}`` and ``k =
\\frac{1}{3}`` = ``\\frac{1}{3}``; a ground truth it cannot read is matched verbatim, modulo
blanks. A decimal comma (``1000,99``) is read as a decimal point against a number written with
one (a list such as ``-2,1`` stays a list).

Cost is bounded: Math-Verify sees only short, shallow answer texts without power towers or huge
factorials, under a deadline that works in any thread (``dapo_core.deadline``; Math-Verify's own
timeout is ``signal.alarm``, which only the main thread may use). Math-Verify (and sympy) are
imported at the first judgement.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

from dapo_core.answers import MAX_DIGITS, balanced_braces, parse_integer
from dapo_core.deadline import Overtime, deadline
from dapo_core.exact import MAX_CHARS

__all__ = ["answer_key", "equivalence_name", "equivalent"]

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
# Keys of answers up to this long are cached.
_KEY_CACHE_MAX_CHARS = 32


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
    except Overtime:  # not shown equivalent in time; not cached: a quieter moment may show it
        _say_overtime(answer, ground_truth)
        return False
    except Exception:  # a parser failure: not shown equivalent
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
            if len(answer) <= _KEY_CACHE_MAX_CHARS:
                if len(_KEY_CACHE) >= _EQUIVALENCE_CACHE_MAX:
                    _KEY_CACHE.clear()
                _KEY_CACHE[answer] = key
        return key
    except (Exception, Overtime):  # defensive: a vote is never worth a crash
        return "".join(str(answer).split())


def _value_key(answer: str) -> str:
    text = "".join(answer.split())
    math_verify = None if _refused(answer) else _math_verify()
    if math_verify is None:
        return text
    try:
        with deadline(_EQUIVALENCE_SECONDS, _EQUIVALENCE_WALL_SECONDS):
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
    except (Exception, Overtime):  # a deadline or a parser failure: the text itself
        return text


def _judge(answer: str, ground_truth: str) -> bool:
    math_verify = _math_verify()  # imported outside the deadline: an import is never cut short
    if math_verify is None:
        return _verbatim(answer, ground_truth)
    with deadline(_EQUIVALENCE_SECONDS, _EQUIVALENCE_WALL_SECONDS):
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
    """One judgement outside any deadline: the first builds the LaTeX parser, a one-off
    cost that must not count against the first answer judged."""
    try:
        gold = math_verify.parse("$\\frac{1}{2}$", parsing_timeout=None)
        pred = math_verify.parse("$0.5$", parsing_timeout=None)
        math_verify.verify(gold, pred, timeout_seconds=None)
    except Exception:  # a failed warm-up only means a slower first judgement
        return


_LOG = logging.getLogger(__name__)
_OVERTIMES = [0]  # judgements cut short in this process


def _say_overtime(answer: str, ground_truth: str) -> None:
    """Log a judgement cut short: the first at warning level (a reward of -1 that a faster or
    quieter machine could have made +1 deserves a look), later ones at debug level."""
    _OVERTIMES[0] += 1
    level = logging.WARNING if _OVERTIMES[0] == 1 else logging.DEBUG
    _LOG.log(
        level,
        "Math-Verify's judgement of %r against %r ran past its deadline (%.1f CPU s, %.0f s): "
        "judged not equivalent%s",
        answer[:80],
        ground_truth[:80],
        _EQUIVALENCE_SECONDS,
        _EQUIVALENCE_WALL_SECONDS,
        "; later ones are logged at debug level" if level == logging.WARNING else "",
    )


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
