"""Answer parsing: canonical integers and the integer an answer denotes (DAPO Eq. 7, section 3.5).

DAPO (arXiv 2503.14476) grades a response by comparing its final answer with an integer ground
truth (Eq. 7), and section 3.5 makes every answer of the training set an integer. This module
turns answer texts into integers for both:

* ``canonical_integer(text)``: the digit string of an integer literal (``"023"`` -> ``"23"``,
  ``"1,000"`` -> ``"1000"``), exact at any length; which thousands separators count is a
  parameter (curation accepts ``,`` only; the reward all of ``THOUSANDS_SEPARATORS``).
* ``parse_integer(text)``: the integer an answer denotes under the reward's rules, or None.
  Presentation is peeled off (``$540$``, ``\\boxed{540}``, ``540 degrees``, ``x = 540``, ``The
  final answer is 540.``), then the text is an integer literal or exact arithmetic
  (``\\frac{1080}{2}``, ``2^3+1``), evaluated by ``dapo_core.latex``. Hedges (``540 or 541``,
  ``\\pm 540``), non-integers and prose give None.
* ``brace_group(text, start)``: the balanced ``{...}`` group at ``start``; ``box_argument``:
  the argument of a box, braced or bare (``\\boxed 4``), used to read boxes.

Only the standard library is imported at module load; sympy only when an answer has a surd or pi.
"""

from __future__ import annotations

import re
from functools import cache

from dapo_core.exact import MAX_DEPTH
from dapo_core.latex import REWARD, SPACING, UNICODE, evaluate

__all__ = [
    "MAX_DIGITS",
    "THOUSANDS_SEPARATORS",
    "UNIT_MARKS",
    "balanced_braces",
    "box_argument",
    "brace_group",
    "canonical_integer",
    "parse_integer",
]

# Answer texts longer than this are refused outright (a 1000-digit integer with separators fits).
_MAX_TEXT_CHARS = 1_500
# Integers with more digits are not answers; also keeps int() far below its 4300-digit limit.
MAX_DIGITS = 1_000
# Upper bound on peeling passes (wrappers, units, phrases) over one answer text.
_MAX_PEEL_PASSES = 12

# --- canonical integers ----------------------------------------------------------------------

# Thousands separators seen in answers: 1,000 / 1\,000 / 1{,}000 / 10,\!080 / 32,\! 349 /
# 1\ 000 / 1~000 / 1 000. (", " alone is not one: "540, 541" lists two answers.)
THOUSANDS_SEPARATORS = (",", "\\,", "{,}", ",\\!", ",\\! ", "\\ ", "~", " ")
_NON_DIGIT_RE = re.compile(r"\D")


@cache
def _integer_re(separators: tuple[str, ...]) -> re.Pattern[str]:
    """Sign, digits (grouped by threes with ``separators``), an optional ``.0`` tail.

    A grouped number does not start with 0: "0,111" is a decimal comma (0.111), not 111."""
    separator = "|".join(re.escape(s) for s in separators)
    grouped = rf"[1-9]\d{{0,2}}(?:(?:{separator})\d{{3}})+"
    return re.compile(rf"([+\-\u2212]?)(\d+|{grouped})(?:\.0*)?")


def canonical_integer(text: str, separators: tuple[str, ...] = (",",)) -> str | None:
    """'023' -> '23', '+5' -> '5', '1,000' -> '1000', '-0' -> '0', '12.0' -> '12'; else None.

    Works on the digit string, so arbitrarily long integers stay exact (no float, no int limit).
    """
    m = _integer_re(separators).fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        return None
    digits = _NON_DIGIT_RE.sub("", m[2]).lstrip("0") or "0"
    negative = m[1] in ("-", "\u2212") and digits != "0"
    return "-" + digits if negative else digits


def _to_int(s: str) -> int | None:
    """int() for a signed digit string, refusing more than MAX_DIGITS digits."""
    n_digits = len(s) - (s[0] in "+-")
    return int(s) if n_digits <= MAX_DIGITS else None


# --- the integer an answer denotes (reward rules) ----------------------------------------------

_INT_RE = re.compile(r"[-+]?\d+")
# "$540$", "**540**.", "\boxed{540}", "$540^\circ$", "540\%": an integer in wrappers that _peel
# would remove, read without peeling (most DAPO-style answers are one of these).
_WRAPPED_INT_RE = re.compile(
    r"[\s$*_`]*(?:\\boxed\{\s*([-+]?\d+)\s*\}|([-+]?\d+))"
    r"(?:\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\?%))?[\s$*_`.]*"
)
_FRACTION_RE = re.compile(r"([-+]?)\\[dtc]?frac\{\s*([-+]?\d+)\s*\}\{\s*([-+]?\d+)\s*\}")
# "540 or 541", "3 and 4": two numbers offered as one answer, refused before any peeling.
_NUMBERS_HEDGE_RE = re.compile(r"\d\s+(?:or|and)\s+[-+$\\\d]")
# Several candidate answers in one: never accepted ("+-540" would otherwise parse as -540).
_HEDGE_RE = re.compile(r"\\pm|\\mp|±|∓|\+\s*/?\s*-")
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)")
_TEXT_MACROS = "textbf textrm textit textnormal text mathrm mathbf mathit mbox operatorname"
_TEXT_MACRO_RE = re.compile(rf"\\(?:{'|'.join(_TEXT_MACROS.split())})(?![A-Za-z])")
_MATH_DELIMS_RE = re.compile(r"\\[()\[\]]|\\displaystyle|\$")
_TRAILING_PUNCT = ".,;:?"  # not "!": "5!" is a factorial, not an exclamation
_SPACING_TAILS = ("\\,", "\\;", "\\:")
# "The final answer is 540", "there are 540 ways": digit-free words ending in is/are/equals.
# Qualifiers stay in the text and make it fail: "is not 540", "at least 540", "about 540".
_LEAD_PHRASE_RE = re.compile(r"(?:[A-Za-z][A-Za-z ,'-]{0,80}\s)?(?:is|are|equals)\b\s*:?\s*", re.I)
# "x = 540", "m+n = 41", "\theta = 540", "f(3) = 540", "x \approx 11": a symbolic left side and
# one relation, "=" or "\approx" (the value it names is the answer; Math-Verify reads the last
# side too). A numeric left side stays: "540 \approx 541" is not an answer.
_ASSIGN_RE = re.compile(
    r"\\?[A-Za-z][A-Za-z0-9_{}\\^+\-*() ]{0,40}?(?:=|\\approx(?![A-Za-z]))\s*"
    r"(?=[^=]*$)(?!.*\\approx)"
)
# LaTeX's thousands separator {,} written with blanks around or inside it (single blanks: _peel
# has joined the whitespace).
_BRACED_COMMA_RE = re.compile(r" ?\{ ?, ?\} ?")
# Unit marks that follow a value without changing it: degrees and percent.
UNIT_MARKS = (r"\^\s*\{?\s*\\circ\s*\}?", r"\\circ", r"\\degree", "°", r"\\?%")
_UNIT_TAIL_RE = re.compile(
    rf"(?:\s*(?:{'|'.join(UNIT_MARKS)})"
    rf"|\s*(?:{SPACING})"
    r"|\s+(?P<word>[A-Za-z]+)\.?(?:\s*\^\s*\{?\d\}?)?"
    r"|(?<=\d)(?P<glued>[A-Za-z]{2,})\.?(?:\s*\^\s*\{?\d\}?)?)$"
)
# Trailing words that change the value or signal a hedge: never stripped as if they were units.
_NOT_UNITS = frozenset(
    {"or", "and", "plus", "minus", "times", "over", "divided", "squared", "cubed", "pi", "e", "i"}
    | {"hundred", "thousand", "million", "billion", "trillion", "dozen"}
    | {"thousands", "millions", "billions"}
)


def parse_integer(text: str) -> int | None:
    """The integer ``text`` denotes under the reward's rules (DAPO Eq. 7), else None.

    Accepts ``023``, ``1,000``, ``1\\,000``, ``540.0``, ``$540$``, ``540 degrees``, ``x = 540``,
    ``\\frac{1080}{2}``, ``2^3+1``; refuses hedges, non-integers, prose and integers of more
    than 1000 digits. Never raises.
    """
    try:
        return _parse_integer(text)
    except Exception:  # defensive: a malformed answer is a wrong answer, never a crash
        return None


def _parse_integer(text: str) -> int | None:
    if not isinstance(text, str) or len(text) > _MAX_TEXT_CHARS:
        return None
    s = text.strip()
    if _INT_RE.fullmatch(s):  # fast path: a bare integer, no further parsing
        return _to_int(s)
    m = _WRAPPED_INT_RE.fullmatch(s)  # fast path: "$540$", "**540**.", "\boxed{540}"
    if m:
        return _to_int(m[1] or m[2])
    if ("or" in s or "and" in s) and _NUMBERS_HEDGE_RE.search(s):
        return None  # fast path: "540 or 541"
    m = _FRACTION_RE.fullmatch(s)
    if m:  # fast path, "\frac{1080}{2}": the commonest spelling that needs arithmetic
        return _whole_fraction(m)
    s = _peel(s)
    if not s:
        return None
    digits = canonical_integer(s, THOUSANDS_SEPARATORS)
    if digits is not None:
        return _to_int(digits)
    m = _FRACTION_RE.fullmatch(s)
    if m:  # "$\frac{1080}{2}$", once peeled
        return _whole_fraction(m)
    found = evaluate(s, REWARD)
    if found is None or type(found[0]) is not int:
        return None
    value = found[0]
    # bit_length first: str() of a huge int is slow and fails past 4300 digits.
    if value.bit_length() > MAX_DIGITS * 4:
        return None
    return value if len(str(abs(value))) <= MAX_DIGITS else None


def _whole_fraction(m: re.Match[str]) -> int | None:
    """The integer a ``_FRACTION_RE`` match denotes; None when it is not a whole number."""
    num, den = _to_int(m[2]), _to_int(m[3])
    if num is None or den is None or den == 0 or num % den:
        return None
    return -(num // den) if m[1] == "-" else num // den


def _peel(s: str) -> str | None:
    """Strip presentation around the value: boxes, math delimiters, markdown, units, phrases."""
    # Single spaces only: the "$"-anchored unit regex would be quadratic on long blank runs.
    s = " ".join(s.split())
    # Cheap membership tests gate the regexes: most answers contain no LaTeX at all.
    if not s.isascii():
        s = s.translate(UNICODE)
    if ("\\" in s or "+" in s or not s.isascii()) and _HEDGE_RE.search(s):
        return None
    if "\\" in s:
        if "\\boxed" in s or "\\fbox" in s:
            s = _unwrap_boxed(s)
            if s is None:
                return None
        if _TEXT_MACRO_RE.search(s):
            s = _unwrap_text_macros(s)
            if s is None:
                return None
        s = _MATH_DELIMS_RE.sub("", s.replace("\\$", ""))
    if "$" in s:
        s = s.replace("$", "")
    if "{" in s and "," in s:
        s = _BRACED_COMMA_RE.sub("{,}", s)  # "14 {, }916": the separator {,} with blanks
    for _ in range(_MAX_PEEL_PASSES):
        before = s
        s = s.strip().strip('*_`"').strip()
        if not s.endswith(_SPACING_TAILS):  # "540\," ends in a space, not in a comma
            s = s.rstrip(_TRAILING_PUNCT)
        m = _LEAD_PHRASE_RE.match(s)
        if m:
            s = s[m.end() :]
        m = _ASSIGN_RE.match(s)
        if m:
            s = s[m.end() :]
        m = _UNIT_TAIL_RE.search(s)
        if m:
            word = m.group("word") or m.group("glued")
            if word is not None and word.lower() in _NOT_UNITS:
                return None
            s = s[: m.start()]
        if s == before:
            break
    return s.strip()


def _unwrap_boxed(s: str) -> str | None:
    """The single boxed value in ``s``; None if a box is broken or boxes disagree (a hedge).
    Boxes inside a box are unwrapped too (``\\boxed{\\boxed{5}}`` is 5)."""
    for _ in range(MAX_DEPTH):
        contents, outer_end = set(), -1
        for m in _BOXED_RE.finditer(s):
            if m.start() < outer_end:
                continue  # inside the previous box: unwrapped with it
            box = box_argument(s, m.end())
            if box is None:
                return None
            contents.add(box[0].strip())
            outer_end = box[1]
        if len(contents) != 1:
            return None
        s = contents.pop()
        if not _BOXED_RE.search(s):
            return s
    return None


def _unwrap_text_macros(s: str) -> str | None:
    """Replace ``\\text{X}`` (and friends) by `` X ``: units and words are peeled later."""
    for _ in range(len(s)):  # each pass removes one macro, so this terminates early
        m = _TEXT_MACRO_RE.search(s)
        if m is None:
            return s
        content = brace_group(s, m.end())
        if content is None:
            return None
        close = s.index("{", m.end()) + len(content) + 2
        s = f"{s[: m.start()]} {content} {s[close:]}"
    return s


# --- brace groups and box arguments --------------------------------------------------------------

# LaTeX's unbraced argument, "\boxed 4": read to the next blank, brace or dollar (a model writing
# "\boxed 42" means 42, though LaTeX would box the 4 alone).
_BARE_ARGUMENT_RE = re.compile(r"[ \t]+([^\s{}$\\]+)")


def box_argument(text: str, start: int) -> tuple[str, int] | None:
    """(content, end) of the argument of a ``\\boxed``/``\\fbox`` ending at ``start``, else None.

    The argument is a balanced ``{...}`` group (:func:`brace_group`) or an unbraced token after a
    blank (``\\boxed 4``); ``end`` is where the argument ends in ``text``.
    """
    content = brace_group(text, start)
    if content is not None:
        return content, text.index("{", start) + len(content) + 2
    m = _BARE_ARGUMENT_RE.match(text, start)
    return None if m is None else (m[1], m.end())


_OPEN_BRACE_RE = re.compile(r"[ \t]*\{")
# Escaped braces (\{ \}) are literal characters, not grouping.
_BRACE_TOKEN_RE = re.compile(r"\\[{}]|[{}]")


def balanced_braces(text: str) -> bool:
    """Whether every ``{`` of ``text`` is closed, in order (escaped ``\\{ \\}`` are characters).

    An answer that fails this was cut off (``\\boxed{\\frac{1}{2}``): a lenient parser would
    still read a value into it.
    """
    depth = 0
    for tok in _BRACE_TOKEN_RE.finditer(text):
        t = tok.group()
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def brace_group(text: str, start: int) -> str | None:
    """Content of the brace group opening at ``start`` (after optional blanks), else None.

    None when there is no group, the group is unbalanced (a truncated response), longer than an
    answer may be, or nested deeper than MAX_DEPTH.
    """
    m = _OPEN_BRACE_RE.match(text, start)
    if m is None:
        return None
    close = text.find("}", m.end(), m.end() + _MAX_TEXT_CHARS)
    if close >= 0 and "{" not in text[m.end() : close] and text[close - 1] != "\\":
        return text[m.end() : close]  # the usual flat group, e.g. \boxed{540}
    depth = 0
    for tok in _BRACE_TOKEN_RE.finditer(text, m.end() - 1, m.end() + _MAX_TEXT_CHARS):
        t = tok.group()
        if t == "{":
            depth += 1
            if depth > MAX_DEPTH:
                return None
        elif t == "}":
            depth -= 1
            if depth == 0:
                return text[m.end() : tok.start()]
    return None
