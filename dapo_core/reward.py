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
  ``\\pm 540``), non-integers, truncated or missing answers are wrong.
* Cost is bounded by construction: only the tail of very long responses is scanned, answer
  texts and integers are length-capped, arithmetic runs on a whitelisted AST with size limits,
  and sympy is a last fallback on short, shallow inputs with small exponents.  ``score`` never
  raises.

Only the standard library is imported at module load; sympy is imported lazily on the rare
path that needs it (surds such as ``\\sqrt{2}\\cdot\\sqrt{8}``).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from types import ModuleType
from typing import Any

__all__ = ["Score", "extract_answer", "normalize_integer", "score"]

# --- limits (each one bounds the work done on adversarial input) -------------------------------

# Only the last _SCAN_CHARS characters of a response are searched. DAPO's 20k-token responses are
# ~80 KB, so the last Answer line of any realistic response is inside this window.
_SCAN_CHARS = 200_000
# Answer texts longer than this are rejected outright (a 1000-digit integer with separators fits).
_MAX_ANSWER_CHARS = 1_500
# Integers with more digits are treated as wrong; also keeps int() far below its 4300-digit limit.
_MAX_DIGITS = 1_000
# Arithmetic expressions longer than this are not evaluated.
_MAX_EXPR_CHARS = 200
# Maximum bracket nesting accepted in an expression or a \boxed{} group.
_MAX_DEPTH = 20
# Intermediate results of the exact evaluator are capped at this many bits (~6000 digits).
_MAX_BITS = 20_000
# The sympy fallback only sees short expressions with small exponents and literals.
_SYMPY_MAX_CHARS = 100
_SYMPY_MAX_EXPONENT = 6
_SYMPY_MAX_LITERAL_DIGITS = 12
_SYMPY_MAX_NODES = 40
_SYMPY_MAX_RADICALS = 4
_SYMPY_MAX_ROOT_INDEX = 3
# pred strings for answers that are not integers are clipped to this length.
_MAX_PRED_CHARS = 200
# Upper bound on peeling passes (wrappers, units, phrases) over one answer text.
_MAX_PEEL_PASSES = 12


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
_OPEN_BRACE_RE = re.compile(r"[ \t]*\{")
# Escaped braces (\{ \}) are literal characters, not grouping.
_BRACE_TOKEN_RE = re.compile(r"\\[{}]|[{}]")


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
    content = _group_at(text, start)
    if content is None:
        return None
    return content.strip() or None


def _group_at(text: str, start: int) -> str | None:
    """Content of the brace group opening at ``start`` (after optional blanks), else None.

    None when there is no group, the group is unbalanced (truncated response), too long, or
    nested deeper than _MAX_DEPTH.
    """
    m = _OPEN_BRACE_RE.match(text, start)
    if m is None:
        return None
    close = text.find("}", m.end(), m.end() + _MAX_ANSWER_CHARS)
    if close >= 0 and "{" not in text[m.end() : close] and text[close - 1] != "\\":
        return text[m.end() : close]  # the usual flat group, e.g. \boxed{540}
    depth = 0
    for tok in _BRACE_TOKEN_RE.finditer(text, m.end() - 1, m.end() + _MAX_ANSWER_CHARS):
        t = tok.group()
        if t == "{":
            depth += 1
            if depth > _MAX_DEPTH:
                return None
        elif t == "}":
            depth -= 1
            if depth == 0:
                return text[m.end() : tok.start()]
    return None


# --- normalisation of an answer text to an int -------------------------------------------------

_INT_RE = re.compile(r"[-+]?\d+")
_WRAPPED_INT_RE = re.compile(r"[\s$*_`]*(?:\\boxed\{\s*([-+]?\d+)\s*\}|([-+]?\d+))[\s$*_`.]*")
# 1,000 / 1\,000 / 1{,}000 / 1 000 / 1~000, optionally followed by .0 / .00.
_GROUPED_INT_RE = re.compile(r"[-+]?\d{1,3}(?:(?:,|\\,|\{,\}|\\ |~| )\d{3})+(?:\.0+)?")
_ZERO_DECIMAL_RE = re.compile(r"[-+]?\d+\.0+")
_SEPARATOR_RE = re.compile(r"\\,|\{,\}|\\ |[,~ ]")
# Several candidate answers in one: never accepted ("+-540" would otherwise parse as -540).
_HEDGE_RE = re.compile(r"\\pm|\\mp|±|∓|\+\s*/?\s*-")
_UNICODE_OPS = str.maketrans({"−": "-", "–": "-", "×": "*", "·": "*", "⋅": "*", "÷": "/"})
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)")
_TEXT_MACRO_RE = re.compile(
    r"\\(?:textbf|textrm|textit|textnormal|text|mathrm|mathbf|mathit|mbox|operatorname)"
    r"(?![A-Za-z])"
)
_MATH_DELIMS_RE = re.compile(r"\\[()\[\]]|\\displaystyle|\$")
_TRAILING_PUNCT = ".,;:?"  # not "!": "5!" is a factorial, not an exclamation
# "The final answer is 540", "there are 540 ways": digit-free words ending in is/are/equals.
# Qualifiers stay in the text and make it fail: "is not 540", "at least 540", "about 540".
_LEAD_PHRASE_RE = re.compile(r"(?:[A-Za-z][A-Za-z ,'-]{0,80}\s)?(?:is|are|equals)\b\s*:?\s*", re.I)
# "x = 540", "m+n = 41", "\theta = 540", "f(3) = 540": a symbolic left side and a single "=".
_ASSIGN_RE = re.compile(r"\\?[A-Za-z][A-Za-z0-9_{}\\^+\-*() ]{0,40}?=\s*(?=[^=]*$)")
_UNIT_TAIL_RE = re.compile(
    r"(?:\s*\^\s*\{?\s*\\circ\s*\}?|\s*\\circ|\s*°|\s*\\?%"
    r"|\s*\\(?:,|;|:|!|quad|qquad|\ )"
    r"|\s+(?P<word>[A-Za-z]+)\.?(?:\s*\^\s*\{?\d\}?)?"
    r"|(?<=\d)(?P<glued>[A-Za-z]{2,})\.?(?:\s*\^\s*\{?\d\}?)?)$"
)
# Trailing words that change the value or signal a hedge: never stripped as if they were units.
_NOT_UNITS = frozenset(
    {"or", "and", "plus", "minus", "times", "over", "divided", "squared", "cubed", "pi", "e", "i"}
    | {"hundred", "thousand", "million", "billion", "trillion", "dozen"}
    | {"thousands", "millions", "billions"}
)


def normalize_integer(text: str) -> int | None:
    """Turn an answer string into an exact int, or None if it does not denote one integer."""
    try:
        return _normalize(text)
    except Exception:  # defensive: a malformed answer is a wrong answer, never a crash
        return None


# Ground truths repeat across the G samples of a prompt and across epochs: cache short ones.
_TRUTH_CACHE: dict[str, int | None] = {}
_TRUTH_CACHE_MAX = 65_536
_TRUTH_CACHE_MAX_CHARS = 64


def _ground_truth_int(ground_truth: str) -> int | None:
    value = normalize_integer(ground_truth)
    if len(ground_truth) <= _TRUTH_CACHE_MAX_CHARS:
        if len(_TRUTH_CACHE) >= _TRUTH_CACHE_MAX:
            _TRUTH_CACHE.clear()
        _TRUTH_CACHE[ground_truth] = value
    return value


def _normalize(text: str) -> int | None:
    if not isinstance(text, str) or len(text) > _MAX_ANSWER_CHARS:
        return None
    s = text.strip()
    if _INT_RE.fullmatch(s):  # fast path: a bare integer, no further parsing
        return _to_int(s)
    m = _WRAPPED_INT_RE.fullmatch(s)  # fast path: "$540$", "**540**.", "\boxed{540}"
    if m:
        return _to_int(m[1] or m[2])
    s = _peel(s)
    if not s:
        return None
    if _INT_RE.fullmatch(s):
        return _to_int(s)
    if _ZERO_DECIMAL_RE.fullmatch(s):  # 540.0, 540.00
        return _to_int(s[: s.index(".")])
    if _GROUPED_INT_RE.fullmatch(s):  # thousands separators
        digits = _SEPARATOR_RE.sub("", s)
        return _to_int(digits.split(".", 1)[0])
    return _evaluate(s)


def _to_int(s: str) -> int | None:
    """int() for a signed digit string, refusing more than _MAX_DIGITS digits."""
    n_digits = len(s) - (s[0] in "+-")
    if n_digits > _MAX_DIGITS:
        return None
    return int(s)


def _peel(s: str) -> str | None:
    """Strip presentation around the value: boxes, math delimiters, markdown, units, phrases."""
    # Single spaces only: the "$"-anchored unit regex would be quadratic on long blank runs.
    s = " ".join(s.split())
    # Cheap membership tests gate the regexes: most answers contain no LaTeX at all.
    if not s.isascii():
        s = s.translate(_UNICODE_OPS)
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
    for _ in range(_MAX_PEEL_PASSES):
        before = s
        s = s.strip().strip('*_`"').strip().rstrip(_TRAILING_PUNCT)
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
    """The single boxed value in ``s``; None if a box is broken or boxes disagree (a hedge)."""
    contents = set()
    for m in _BOXED_RE.finditer(s):
        content = _group_at(s, m.end())
        if content is None:
            return None
        contents.add(content.strip())
    return contents.pop() if len(contents) == 1 else None


def _unwrap_text_macros(s: str) -> str | None:
    """Replace ``\\text{X}`` (and friends) by `` X ``: units and words are peeled later."""
    for _ in range(len(s)):  # each pass removes one macro, so this terminates early
        m = _TEXT_MACRO_RE.search(s)
        if m is None:
            return s
        content = _group_at(s, m.end())
        if content is None:
            return None
        close = s.index("{", m.end()) + len(content) + 2
        s = f"{s[: m.start()]} {content} {s[close:]}"
    return s


# --- exact arithmetic ------------------------------------------------------------------------

# LaTeX to Python expression; rules are applied to innermost groups first, so repeating them
# until nothing changes converts nested \frac / \sqrt / ^{} without a recursive parser.
_LATEX_SPACING_RE = re.compile(r"\\(?:,|;|:|!|\ |quad|qquad)|~")
_LATEX_OPS = (
    ("\\left", ""),
    ("\\right", ""),
    ("\\cdot", "*"),
    ("\\times", "*"),
    ("\\ast", "*"),
    ("\\div", "/"),
)
_BRACE_SPACE_RE = re.compile(r"\s*([{}\[\]^])\s*")
_FRAC_SHORT_RE = re.compile(r"\\[dtc]?frac(\d)(\d)")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\d)")
_NROOT_RE = re.compile(r"\\sqrt\[([^\[\]{}]*)\]")
_GROUP_RULES = (
    (re.compile(r"\\[dtc]?frac\{([^{}]*)\}\{([^{}]*)\}"), r"((\1)/(\2))"),
    (re.compile(r"\\nroot\{([^{}]*)\}\{([^{}]*)\}"), r"root((\2),(\1))"),
    (re.compile(r"\\sqrt\{([^{}]*)\}"), r"sqrt(\1)"),
    (re.compile(r"\^\{([^{}]*)\}"), r"**(\1)"),
    # A bare group that is not the argument of a macro, \frac's second slot or an exponent.
    (re.compile(r"(?<![}\]^A-Za-z])\{([^{}]*)\}"), r"(\1)"),
)
# A word that is not a LaTeX command and not sqrt(: prose such as "540 or 541".
_STRAY_WORD_RE = re.compile(r"(?<![\\A-Za-z])(?!sqrt\(|root\()[A-Za-z]")
_SIMPLE_FRAC_RE = re.compile(r"([-+]?)\\[dtc]?frac\{\s*([-+]?\d+)\s*\}\{\s*([-+]?\d+)\s*\}")
_DECIMAL_RE = re.compile(r"(\d+)\.(\d+)")
_IMPLICIT_MUL_RE = re.compile(r"(?<=[\d)])\s*(?=\(|sqrt\(|root\()|(?<=\))\s*(?=\d)")
_EXPR_CHARS_RE = re.compile(r"(?:[\d+\-*/(), ]|sqrt|root)*")


class _Irrational(Exception):
    """An exact root that is not rational: the value may still be an integer (sympy decides)."""


class _Invalid(Exception):
    """Not a finite, bounded rational expression."""


def _evaluate(s: str) -> int | None:
    """Exact value of an arithmetic/LaTeX expression if it is an integer, else None."""
    if len(s) > _MAX_EXPR_CHARS or _STRAY_WORD_RE.search(s) or _max_depth(s) > _MAX_DEPTH:
        return None
    m = _SIMPLE_FRAC_RE.fullmatch(s)
    if m:  # fast path for the common \frac{a}{b}
        num, den = _to_int(m[2]), _to_int(m[3])
        if num is None or den is None or den == 0 or num % den:
            return None
        return -(num // den) if m[1] == "-" else num // den
    expr = _latex_to_python(s)
    if expr is None or not _EXPR_CHARS_RE.fullmatch(expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    try:
        value = _eval_node(tree.body)
    except _Irrational:
        return _sympy_integer(tree.body, len(expr))
    except (_Invalid, ZeroDivisionError, OverflowError, ValueError):
        return None
    # bit_length first: str() of a huge int is slow and fails past 4300 digits.
    if not isinstance(value, int) or value.bit_length() > _MAX_DIGITS * 4:
        return None
    return value if len(str(abs(value))) <= _MAX_DIGITS else None


def _max_depth(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


def _latex_to_python(s: str) -> str | None:
    # Membership tests skip the substitutions that cannot apply (each re.sub costs ~1 us).
    if "\\" in s or "~" in s:
        s = _LATEX_SPACING_RE.sub(" ", s)
        for macro, repl in _LATEX_OPS:
            if macro in s:
                s = s.replace(macro, repl)
        if "frac" in s:
            s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
        if "\\sqrt" in s:
            s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
            s = _NROOT_RE.sub(r"\\nroot{\1}", s)
    if "{" in s:
        if " " in s:
            s = _BRACE_SPACE_RE.sub(r"\1", s)
        while "{" in s:
            before = s
            for pattern, repl in _GROUP_RULES:
                s = pattern.sub(repl, s)
            if s == before:  # stuck: an unsupported macro or unbalanced braces
                return None
    if "\\" in s or "}" in s:
        return None
    s = s.replace("[", "(").replace("]", ")").replace("^", "**")
    if "." in s:
        s = _DECIMAL_RE.sub(lambda m: f"({m[1]}{m[2]}/1{'0' * len(m[2])})", s)
    if "(" in s:
        s = _IMPLICIT_MUL_RE.sub("*", s)
    return s


_Number = int | Fraction  # ints while exact division allows: int arithmetic is ~10x faster


def _bits(x: _Number) -> int:
    if isinstance(x, int):
        return x.bit_length()
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _checked(x: _Number) -> _Number:
    """Refuse oversized intermediates and turn whole Fractions back into ints."""
    if _bits(x) > _MAX_BITS:
        raise _Invalid
    if isinstance(x, Fraction) and x.denominator == 1:
        return x.numerator
    return x


def _eval_node(node: ast.AST) -> _Number:
    """Evaluate a whitelisted AST exactly; anything else raises _Invalid."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval_node(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval_node(node.left), _eval_node(node.right)
        op = node.op
        if isinstance(op, ast.Add):
            return _checked(a + b)
        if isinstance(op, ast.Sub):
            return _checked(a - b)
        if isinstance(op, ast.Mult):
            return _checked(a * b)
        if isinstance(op, ast.Div):
            if isinstance(a, int) and isinstance(b, int) and b and a % b == 0:
                return a // b
            return _checked(Fraction(a) / b)
        if isinstance(op, ast.FloorDiv):
            return _checked(a // b)
        if isinstance(op, ast.Pow):
            return _pow(a, b)
        raise _Invalid
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        args = [_eval_node(arg) for arg in node.args]
        if node.func.id == "sqrt" and len(args) == 1:
            return _root(args[0], 2)
        if node.func.id == "root" and len(args) == 2 and isinstance(args[1], int):
            return _root(args[0], args[1])
    raise _Invalid


def _pow(base: _Number, exponent: _Number) -> _Number:
    if isinstance(exponent, Fraction):  # 8^(1/3): an exact root, then an integer power
        base = _root(base, exponent.denominator)
        exponent = exponent.numerator
    if base == 0 and exponent < 0:
        raise _Invalid
    if base in (0, 1):
        return base if exponent else 1
    if base == -1:
        return -1 if exponent % 2 else 1
    # Bound the result size before computing it, so 9**9**9 is refused instantly.
    if abs(exponent) > _MAX_BITS or _bits(base) * abs(exponent) > _MAX_BITS:
        raise _Invalid
    if exponent < 0:
        return _checked(1 / Fraction(base) ** -exponent)
    return base**exponent


def _root(x: _Number, n: int) -> _Number:
    """Exact n-th root of a rational; raises _Irrational when it is not rational."""
    if not 2 <= n <= 64:
        raise _Invalid
    if x < 0:
        if n % 2 == 0:
            raise _Invalid
        return -_root(-x, n)
    num, den = (x, 1) if isinstance(x, int) else (x.numerator, x.denominator)
    r_num, r_den = _iroot(num, n), _iroot(den, n)
    if r_num**n != num or r_den**n != den:
        raise _Irrational
    return r_num if r_den == 1 else Fraction(r_num, r_den)


def _iroot(x: int, n: int) -> int:
    """floor(x ** (1/n)) for x >= 0, exactly (Newton's method on ints)."""
    if x < 2:
        return x
    if n == 2:
        return math.isqrt(x)
    r = 1 << -(-x.bit_length() // n)  # an upper bound on the root
    while True:
        y = ((n - 1) * r + x // r ** (n - 1)) // n
        if y >= r:
            return r
        r = y


def _sympy_integer(node: ast.AST, n_chars: int) -> int | None:
    """Last resort for surds (``\\sqrt{2}\\cdot\\sqrt{8}``): exact symbolic simplification.

    Only small trees reach sympy: short text, few nodes, small literals and exponents, so the
    work is bounded without needing a timer (signals do not work off the main thread).
    """
    if n_chars > _SYMPY_MAX_CHARS or sum(1 for _ in ast.walk(node)) > _SYMPY_MAX_NODES:
        return None
    radicals = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    # Simplification cost grows exponentially with the number of radicals: keep it tiny.
    if len(radicals) > _SYMPY_MAX_RADICALS:
        return None
    # Rationalising denominators is only cheap for square roots (cube roots take ~100x longer).
    square_only = all(isinstance(n.func, ast.Name) and n.func.id == "sqrt" for n in radicals)
    try:
        import sympy  # lazy: the import is slow and almost never needed

        expr = _to_sympy(node, sympy)
        steps = [lambda e: e, sympy.expand]
        if square_only:
            steps.append(lambda e: sympy.expand(sympy.radsimp(e)))
        for simplify in steps:
            value = simplify(expr)
            if value.is_Integer:
                return int(value)
        return None
    except Exception:  # defensive: any sympy failure means "not an integer"
        return None


def _to_sympy(node: ast.AST, sympy: ModuleType) -> Any:  # sympy is passed in: imported lazily
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if len(str(node.value)) > _SYMPY_MAX_LITERAL_DIGITS:
            raise _Invalid
        return sympy.Integer(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _to_sympy(node.operand, sympy)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _to_sympy(node.left, sympy), _to_sympy(node.right, sympy)
        op = node.op
        if isinstance(op, ast.Add):
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, ast.Div) and b != 0:
            return a / b
        # Only integer powers: a fractional power is a radical not counted by the caller.
        if isinstance(op, ast.Pow) and b.is_Integer and abs(b) <= _SYMPY_MAX_EXPONENT:
            return a**b
        raise _Invalid
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = [_to_sympy(arg, sympy) for arg in node.args]
        if node.func.id == "sqrt" and len(args) == 1:
            return sympy.sqrt(args[0])
        # is_Integer is tested first ("and" short-circuits): "<=" on a symbolic index is no bool.
        index = args[1] if len(args) == 2 else None
        if (
            node.func.id == "root"
            and index is not None
            and index.is_Integer
            and 2 <= index <= _SYMPY_MAX_ROOT_INDEX
        ):
            return sympy.root(args[0], index)
    raise _Invalid


# --- reward --------------------------------------------------------------------------------------


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
        if raw.isdigit() and raw.isascii() and len(raw) <= _MAX_DIGITS:
            value = int(raw)
        else:
            value = normalize_integer(raw)
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
