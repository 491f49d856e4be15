"""Pure helpers for curating DAPO-Math-17K into integer-answer form (DAPO section 3.5).

DAPO (arXiv 2503.14476, section 3.5 "Dataset Transformation") makes every answer an integer so
that a rule-based verifier can grade it exactly: an answer such as (a+sqrt(b))/c is turned into
"write the answer in that form and report a+b+c" by an LLM rewriting the problem. Here the common
cases are done deterministically: a small LaTeX parser builds an exact sympy value (never
``nsimplify``), and the value is matched structurally against a few canonical forms.

Public API (no I/O; callers own the files):

- ``integerize(answer)`` -> ``Integerized(value, form, instruction)`` or ``None``;
- ``TEMPLATE_PREFIX``, ``TEMPLATE_SUFFIX``, ``apply_template``, ``strip_template``;
- ``canonical_integer(answer)`` -> canonical integer string or ``None``;
- ``dedupe_key(problem)`` -> whitespace-free key for exact-duplicate collapsing;
- ``Decontaminator`` -> word n-gram near-duplicate detector against evaluation problems.

Conventions decided here (the spec left them open):

- Finite decimals that are not integers (``0.5``, ``3.21``, ``\\$18.90``) give ``None`` by
  default: MATH asks for many decimals "rounded to the nearest hundredth", so reading them as
  exact fractions could state a false exact value. ``decimals_as_fractions=True`` opts in.
- ``x=5`` (one letter, ``=``, then the value) is read as its right-hand side, so it gives 5.
- ``10\\%`` gives 10, ``\\$5`` gives 5 and ``5^\\circ`` gives 5 (the unit is the problem's);
  anything with ``\\text``/``\\mbox`` (``\\text{ degrees}``, ``\\mbox{ cm}^2``) gives ``None``.
- An integer followed by ``\\frac{int}{int}`` is a mixed number (``1\\frac{4}{5}`` = 9/5), as in
  MATH; everywhere else juxtaposition multiplies (``2\\sqrt{3}``, ``\\frac{3}{4}\\pi``).
- An unbraced multi-digit exponent (``2^10``) is ``None``: LaTeX would read it as ``2^1 0``.
- A lone radical or pi has coefficient 1: ``\\sqrt{2}`` is k=1, m=2 (value 3) and ``\\pi`` is
  k=1 (value 1). The sign of a negative answer is part of the stated form (``-m/n``,
  ``k-m\\sqrt{n}``) and every reported parameter is positive.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import sympy

__all__ = [
    "TEMPLATE_PREFIX",
    "TEMPLATE_SUFFIX",
    "Decontaminator",
    "Integerized",
    "MAX_ANSWER_CHARS",
    "apply_template",
    "canonical_integer",
    "dedupe_key",
    "integerize",
    "normalize_for_overlap",
    "strip_template",
]

# ---------------------------------------------------------------------------------------------
# integerize: result type and the canonical forms
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Integerized:
    """An answer in integer form: the value to report, the stated form and the instruction."""

    value: int
    form: str
    instruction: str


MAX_ANSWER_CHARS = 200  # longer answers are tuples/expressions in practice; bounds parse time
_MAX_BITS = 20_000  # largest numerator/denominator kept while computing ("9^{9^{9}}" is refused)
_MAX_TERMS = 32  # most monomials an intermediate value may have (a canonical form has two)
_MAX_ROOT_ATOMS = 4  # most distinct roots an intermediate value may hold (a canonical form: one)
_MAX_RADICAND = 10**15  # square-freeness is checked by factoring, so keep the radicand small

_SQUARE_FREE = "is not divisible by the square of any prime"

# form -> (LaTeX shown to the solver, conditions on the parameters, what to report)
_FORMS: dict[str, tuple[str, str, str]] = {
    "m/n": (r"\frac{m}{n}", "$m$ and $n$ are relatively prime positive integers", "m+n"),
    "-m/n": (r"-\frac{m}{n}", "$m$ and $n$ are relatively prime positive integers", "m+n"),
    "k\\sqrt{m}": (
        r"k\sqrt{m}",
        f"$k$ and $m$ are positive integers and $m$ {_SQUARE_FREE}",
        "k+m",
    ),
    "-k\\sqrt{m}": (
        r"-k\sqrt{m}",
        f"$k$ and $m$ are positive integers and $m$ {_SQUARE_FREE}",
        "k+m",
    ),
    "\\frac{m\\sqrt{n}}{p}": (
        r"\frac{m\sqrt{n}}{p}",
        f"$m$, $n$, and $p$ are positive integers, $m$ and $p$ are relatively prime, and $n$ "
        f"{_SQUARE_FREE}",
        "m+n+p",
    ),
    "-\\frac{m\\sqrt{n}}{p}": (
        r"-\frac{m\sqrt{n}}{p}",
        f"$m$, $n$, and $p$ are positive integers, $m$ and $p$ are relatively prime, and $n$ "
        f"{_SQUARE_FREE}",
        "m+n+p",
    ),
    "k\\pi": (r"k\pi", "$k$ is a positive integer", "k"),
    "-k\\pi": (r"-k\pi", "$k$ is a positive integer", "k"),
    "\\frac{m\\pi}{n}": (
        r"\frac{m\pi}{n}",
        "$m$ and $n$ are relatively prime positive integers",
        "m+n",
    ),
    "-\\frac{m\\pi}{n}": (
        r"-\frac{m\pi}{n}",
        "$m$ and $n$ are relatively prime positive integers",
        "m+n",
    ),
}
_KMN = f"$k$, $m$, and $n$ are positive integers and $n$ {_SQUARE_FREE}"
_KMNP = (
    f"$k$, $m$, $n$, and $p$ are positive integers, $\\gcd(k, m, p) = 1$, and $n$ {_SQUARE_FREE}"
)
for _latex in (r"k+m\sqrt{n}", r"k-m\sqrt{n}", r"m\sqrt{n}-k", r"-k-m\sqrt{n}"):
    _FORMS[_latex] = (_latex, _KMN, "k+m+n")
for _latex in (
    r"\frac{k+m\sqrt{n}}{p}",
    r"\frac{k-m\sqrt{n}}{p}",
    r"\frac{m\sqrt{n}-k}{p}",
    r"-\frac{k+m\sqrt{n}}{p}",
):
    _FORMS[_latex] = (_latex, _KMNP, "k+m+n+p")


def _instruction(form: str) -> str:
    latex, conditions, report = _FORMS[form]
    return f"The answer can be written in the form ${latex}$, where {conditions}. Find ${report}$."


def _result(form: str, value: int) -> Integerized:
    return Integerized(value=value, form=form, instruction=_instruction(form))


# ---------------------------------------------------------------------------------------------
# A small LaTeX -> sympy parser for answer strings
# ---------------------------------------------------------------------------------------------


class _ParseError(Exception):
    """The answer is not a single exact real number this parser understands."""


# Removed before tokenising: spacing and sizing that never change the value.
_NOISE = re.compile(r"\\left|\\right|\\displaystyle|\\[,;:! ]|~")
_DEGREES = re.compile(r"\s*(\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°)\s*$")
_PERCENT = re.compile(r"\s*\\?%\s*$")
_DOLLAR = re.compile(r"^\\?\$\s*")  # money: "\$5" or "$5"
_VARIABLE_EQ = re.compile(r"^[A-Za-z]\s*=\s*")
# "10,\!080" and "11,\! 111" are thousands separators in MATH answers; "1,-2" is a list.
_THOUSANDS_MARKED = re.compile(r"(?<=\d),\\!\s*(?=\d{3}(?!\d))")
_THOUSANDS_PLAIN = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_TOKEN = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|[A-Za-z]|[-+*/^(){}\[\]])")

_PRIMARY_START = {"\\frac", "\\sqrt", "\\pi", "(", "{"}


def _preprocess(text: str) -> str:
    """Strip delimiters, units and spacing that do not change the value."""
    s = text.strip()
    if s.startswith("$") and s.endswith("$") and len(s) >= 2 and not s.startswith("\\$"):
        s = s.strip("$").strip()
    boxed = re.fullmatch(r"\\boxed\s*\{(.*)\}", s)
    if boxed:
        s = boxed.group(1).strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("π", "\\pi")
    s = _THOUSANDS_MARKED.sub("", s)
    s = _NOISE.sub(" ", s).strip()
    s = _DEGREES.sub("", s)
    s = _PERCENT.sub("", s)
    s = _DOLLAR.sub("", s)
    s = _VARIABLE_EQ.sub("", s)
    return _THOUSANDS_PLAIN.sub(lambda m: m.group(0).replace(",", ""), s).strip()


def _tokenize(s: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None:
            if s[pos:].strip() == "":
                break
            raise _ParseError(f"unexpected character {s[pos]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    return tokens


def _is_number(tok: str | None) -> bool:
    return tok is not None and (tok[0].isdigit() or tok[0] == ".")


def _number(tok: str) -> sympy.Rational:
    whole, _, frac = tok.partition(".")
    return sympy.Rational(int((whole + frac) or "0"), 10 ** len(frac))


# Exact arithmetic with bounded cost. Every intermediate value is kept expanded and checked, so
# no single step can blow up: a product multiplies at most _MAX_TERMS**2 monomials, a power is
# done by repeated squaring, and only small square-root denominators are rationalised.


def _root_atoms(value: sympy.Expr) -> list[sympy.Pow]:
    return [p for p in value.atoms(sympy.Pow) if not p.exp.is_Integer]


def _norm(value: sympy.Expr) -> sympy.Expr:
    """Expand ``value`` and refuse it when it is too large to keep computing with."""
    value = sympy.expand(value)
    if len(sympy.Add.make_args(value)) > _MAX_TERMS:
        raise _ParseError("too many terms")
    if len(_root_atoms(value)) > _MAX_ROOT_ATOMS:
        raise _ParseError("too many distinct roots")
    for r in value.atoms(sympy.Rational):
        if max(abs(r.p).bit_length(), r.q.bit_length()) > _MAX_BITS:
            raise _ParseError("number too large")
    return value


def _add(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    return _norm(a + b)


def _mul(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    return _norm(a * b)


def _div(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    if b == 0:
        raise _ParseError("division by zero")
    if not isinstance(b, sympy.Add):
        return _norm(a / b)  # a monomial: sympy cancels it (4pi/pi) or keeps it as a factor
    # Rationalise a denominator of a few square roots (1/(1+sqrt 2) = sqrt 2 - 1). radsimp is
    # exact but can be very slow with pi or higher roots, which no canonical form has anyway.
    roots = _root_atoms(b)
    if b.has(sympy.pi) or len(b.args) > 4 or any(p.exp.q != 2 for p in roots):
        raise _ParseError("denominator cannot be rationalised cheaply")
    return _mul(a, sympy.radsimp(1 / b))


def _pow(base: sympy.Expr, exp: sympy.Expr) -> sympy.Expr:
    """base**exp for a rational exponent, refusing results too large to compute."""
    if not exp.is_Rational:
        raise _ParseError("non-numeric exponent")
    if exp.q > 64 or (abs(exp.p) > 64 and not base.is_Rational):
        raise _ParseError("exponent too large")
    if base.is_Rational:
        bits = max(abs(base.p).bit_length(), base.q.bit_length(), 1)
        if bits * abs(exp.p) > _MAX_BITS:
            raise _ParseError("power too large")  # "9^{9^{9}}" is refused, not computed
        return _norm(sympy.Pow(base, exp))
    if exp.q != 1 and isinstance(base, sympy.Add):
        # A nested radical (sqrt(7 + sqrt 5)): no canonical form has one, and sympy's sign
        # queries on them go through minimal polynomials, which can take minutes.
        raise _ParseError("nested radical")
    root = base if exp.q == 1 else _norm(sympy.Pow(base, sympy.Rational(1, exp.q)))
    result, square, e = sympy.Integer(1), root, abs(int(exp.p))
    while e:  # repeated squaring keeps every step bounded by _norm
        if e & 1:
            result = _mul(result, square)
        e >>= 1
        if e:
            square = _mul(square, square)
    return _div(sympy.Integer(1), result) if exp.p < 0 else result


class _Parser:
    """Recursive descent over: expr := [+-] term ([+-] term)*; term := power (op? power)*."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.saw_decimal = False  # a non-integer decimal literal was read

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise _ParseError(f"expected {expected!r}, got {tok!r}")
        self.pos += 1
        return tok

    def parse(self) -> sympy.Expr:
        value = self.expr()
        if self.peek() is not None:
            raise _ParseError(f"trailing token {self.peek()!r}")
        return value

    def expr(self) -> sympy.Expr:
        sign = 1
        while self.peek() in ("+", "-"):
            sign = -sign if self.take() == "-" else sign
        value = sign * self.term()
        while self.peek() in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            value = _add(value, sign * self.term())
        return value

    def term(self) -> sympy.Expr:
        start, first_tok = self.pos, self.peek()
        value = self.power()
        # A term that so far is one integer literal may continue as a mixed number.
        plain_int = _is_number(first_tok) and "." not in first_tok and self.pos == start + 1
        while True:
            tok = self.peek()
            if tok in ("*", "\\cdot", "\\times"):
                self.take()
                value = _mul(value, self.power())
            elif tok in ("/", "\\div"):
                self.take()
                value = _div(value, self.power())
            elif tok in _PRIMARY_START or (tok is not None and tok.isalpha()):
                rhs = self.power()
                if plain_int and tok == "\\frac" and rhs.is_Rational and 0 < rhs < 1:
                    value = _add(value, rhs)  # "1\frac{4}{5}" is 1 + 4/5
                else:
                    value = _mul(value, rhs)
            else:
                return value
            plain_int = False

    def power(self) -> sympy.Expr:
        base = self.primary()
        if self.peek() == "^":
            self.take()
            if self.peek() in ("-", "+"):  # "2^-1": sign then a single-token exponent
                sign = -1 if self.take() == "-" else 1
                return _pow(base, sign * self.argument(single_digit=False))
            return _pow(base, self.argument(single_digit=False))
        return base

    def argument(self, single_digit: bool = True) -> sympy.Expr:
        """A macro argument: a braced group or one token (one digit for \\frac43)."""
        tok = self.peek()
        if tok == "{":
            return self.group()
        if _is_number(tok):
            if len(tok) == 1:
                self.take()
                return _number(tok)
            if not single_digit:
                raise _ParseError("unbraced multi-character exponent")
            # LaTeX reads "\frac43" as \frac{4}{3}: split the digit run.
            self.tokens[self.pos] = tok[1:]
            return _number(tok[0])
        if tok == "\\pi":
            self.take()
            return sympy.pi
        raise _ParseError(f"bad macro argument {tok!r}")

    def group(self) -> sympy.Expr:
        self.take("{")
        value = self.expr()
        self.take("}")
        return value

    def primary(self) -> sympy.Expr:
        tok = self.peek()
        if tok is None:
            raise _ParseError("unexpected end")
        if _is_number(tok):
            self.take()
            value = _number(tok)
            if not value.is_Integer:
                self.saw_decimal = True
            return value
        if tok == "(":
            self.take()
            value = self.expr()
            self.take(")")
            return value
        if tok == "{":
            return self.group()
        if tok == "\\pi":
            self.take()
            return sympy.pi
        if tok == "\\frac":
            self.take()
            num = self.argument()
            return _div(num, self.argument())
        if tok == "\\sqrt":
            self.take()
            index = sympy.Integer(2)
            if self.peek() == "[":
                self.take()
                index = self.expr()
                self.take("]")
                if not (index.is_Integer and 2 <= index <= 64):
                    raise _ParseError("bad root index")
            return _pow(self.argument(), 1 / index)
        raise _ParseError(f"unsupported token {tok!r}")  # letters, \infty, \text, brackets...


def _parse_latex(text: str) -> tuple[sympy.Expr, bool]:
    """LaTeX answer -> (exact value, whether a non-integer decimal literal was used)."""
    tokens = _tokenize(_preprocess(text))
    if not tokens:
        raise _ParseError("empty answer")
    parser = _Parser(tokens)
    return parser.parse(), parser.saw_decimal


# ---------------------------------------------------------------------------------------------
# Matching an exact value against the canonical forms
# ---------------------------------------------------------------------------------------------


def _is_square_free(n: int) -> bool:
    return n > 1 and all(e == 1 for e in sympy.factorint(n).values())


def _fraction_form(q: sympy.Rational) -> Integerized:
    m, n = abs(int(q.p)), int(q.q)  # sympy keeps p/q reduced with q > 0
    return _result("m/n" if q > 0 else "-m/n", m + n)


def _pi_form(c: sympy.Rational) -> Integerized:
    m, n = abs(int(c.p)), int(c.q)
    if n == 1:
        return _result("k\\pi" if c > 0 else "-k\\pi", m)
    return _result("\\frac{m\\pi}{n}" if c > 0 else "-\\frac{m\\pi}{n}", m + n)


def _radical_parts(value: sympy.Expr) -> tuple[Fraction, Fraction, int] | None:
    """value == a + b*sqrt(n) with rational a, b != 0 and integer n > 1, else None."""
    terms = value.as_coefficients_dict()
    a, b, n = Fraction(0), None, None
    for key, coeff in terms.items():
        if not coeff.is_Rational:
            return None
        if key == 1:
            a = Fraction(int(coeff.p), int(coeff.q))
        elif key.is_Pow and key.exp == sympy.S.Half and key.base.is_Integer and key.base > 1:
            if n is not None:
                return None  # two different radicals, e.g. sqrt(2) + sqrt(3)
            b, n = Fraction(int(coeff.p), int(coeff.q)), int(key.base)
        else:
            return None
    if b is None or n is None or n > _MAX_RADICAND or not _is_square_free(n):
        return None
    return a, b, n


def _radical_form(a: Fraction, b: Fraction, n: int) -> Integerized:
    p = math.lcm(a.denominator, b.denominator)  # smallest p, so gcd(k, m, p) == 1
    k, m = abs(a.numerator) * (p // a.denominator), abs(b.numerator) * (p // b.denominator)
    if a == 0:
        if p == 1:
            return _result("k\\sqrt{m}" if b > 0 else "-k\\sqrt{m}", m + n)
        return _result("\\frac{m\\sqrt{n}}{p}" if b > 0 else "-\\frac{m\\sqrt{n}}{p}", m + n + p)
    if a > 0:
        body = r"k+m\sqrt{n}" if b > 0 else r"k-m\sqrt{n}"
    else:
        body = r"m\sqrt{n}-k" if b > 0 else r"-k-m\sqrt{n}"
    if p == 1:
        return _result(body, k + m + n)
    framed = {
        r"k+m\sqrt{n}": r"\frac{k+m\sqrt{n}}{p}",
        r"k-m\sqrt{n}": r"\frac{k-m\sqrt{n}}{p}",
        r"m\sqrt{n}-k": r"\frac{m\sqrt{n}-k}{p}",
        r"-k-m\sqrt{n}": r"-\frac{k+m\sqrt{n}}{p}",
    }[body]
    return _result(framed, k + m + n + p)


def _classify(value: sympy.Expr) -> Integerized | None:
    """Match an expanded exact value against the canonical forms, most specific first."""
    if value.is_Integer:
        return Integerized(value=int(value), form="integer", instruction="")
    if value.is_Rational:
        return _fraction_form(value)
    coeff, rest = value.as_coeff_Mul()
    if rest is sympy.pi and coeff.is_Rational and coeff != 0:
        return _pi_form(coeff)
    parts = _radical_parts(value)
    return _radical_form(*parts) if parts is not None else None


def integerize(answer: str, *, decimals_as_fractions: bool = False) -> Integerized | None:
    """Rewrite a LaTeX answer into integer form, or None when no canonical form applies.

    Never raises: anything unparseable, non-real, symbolic or longer than MAX_ANSWER_CHARS gives
    None. See the module docstring for the conventions on decimals, units and signs.
    """
    if not isinstance(answer, str) or len(answer) > MAX_ANSWER_CHARS:
        return None
    try:
        value, saw_decimal = _parse_latex(answer)
        if saw_decimal and not decimals_as_fractions and not value.is_Integer:
            return None  # possibly a rounded decimal: an exact form could be false
        return _classify(value)
    except Exception:  # noqa: BLE001 - the contract is "None on any failure"
        return None


# ---------------------------------------------------------------------------------------------
# Prompt template, canonical integers and duplicate keys
# ---------------------------------------------------------------------------------------------

TEMPLATE_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
TEMPLATE_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def _loose(text: str) -> str:
    """Regex matching ``text`` with any run of whitespace standing for any other."""
    return r"\s+".join(re.escape(word) for word in text.split())


_PREFIX_RE = re.compile(r"^\s*" + _loose(TEMPLATE_PREFIX) + r"\s*")
_SUFFIX_RE = re.compile(r"\s*" + _loose(TEMPLATE_SUFFIX) + r"\s*$")


def apply_template(problem: str) -> str:
    """Wrap a bare problem in the DAPO prompt template (inverse of ``strip_template``)."""
    return TEMPLATE_PREFIX + problem + TEMPLATE_SUFFIX


def strip_template(prompt: str) -> str:
    """Remove the DAPO template (tolerating whitespace changes) and return the stripped problem."""
    return _SUFFIX_RE.sub("", _PREFIX_RE.sub("", prompt, count=1), count=1).strip()


_INTEGER_RE = re.compile(r"([+\-\u2212]?)(\d+|\d{1,3}(?:,\d{3})+)(?:\.0*)?")


def canonical_integer(answer: str) -> str | None:
    """'023' -> '23', '+5' -> '5', '1,000' -> '1000', '-0' -> '0', '12.0' -> '12'; else None.

    Works on the digit string, so arbitrarily long integers stay exact (no float, no int limit).
    """
    m = _INTEGER_RE.fullmatch(answer.strip()) if isinstance(answer, str) else None
    if m is None:
        return None
    digits = m.group(2).replace(",", "").lstrip("0") or "0"
    negative = m.group(1) in ("-", "\u2212") and digits != "0"
    return "-" + digits if negative else digits


def dedupe_key(problem: str) -> str:
    """Key equal for problems that differ only in whitespace (case is kept: it matters in math)."""
    return "".join(problem.split())


# ---------------------------------------------------------------------------------------------
# Decontamination by word n-gram overlap
# ---------------------------------------------------------------------------------------------

_LATEX_SPACING = re.compile(r"\\(?:left|right|displaystyle|quad|qquad|[,;:! ])|~|\\[dt](?=frac\b)")
_NON_WORD = re.compile(r"[\W_]+")


def normalize_for_overlap(text: str) -> list[str]:
    """Lowercased words with LaTeX spacing and punctuation removed: '\\frac{1}{2}' -> frac 1 2."""
    text = _LATEX_SPACING.sub(" ", text.lower())
    return _NON_WORD.sub(" ", text).split()


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    if len(words) < n:  # a short text is one gram, so exact short copies still match
        return {tuple(words)} if words else set()
    # The shifted copies have different lengths on purpose: zip stops at the last full n-gram.
    return set(zip(*(words[i:] for i in range(n)), strict=False))


class Decontaminator:
    """Flags training problems that near-duplicate an evaluation problem.

    Each eval problem is cut into word n-grams of its normalised text, indexed n-gram -> eval ids.
    Boilerplate n-grams (present in more than ``max_df`` distinct problems of the optional
    training ``corpus``, e.g. "where m and n are relatively prime positive integers find m n") are
    dropped from the index, so sharing them proves nothing. A problem matches eval problem i when
    the shared n-grams cover at least ``threshold`` of eval problem i's remaining n-grams; text
    added around a copy (a rewritten answer instruction, a preamble) therefore does not hide it.

    The default n is 8, not the 13 used for long web documents: a 60-word problem with two words
    changed keeps about 70% of its 8-grams but under half of its 13-grams, and a 20-word one far
    fewer. ~18,000 training problems against 60 eval problems take about a second on one core.
    """

    def __init__(
        self,
        eval_problems: Sequence[str],
        ids: Sequence[str] | None = None,
        *,
        n: int = 8,
        threshold: float = 0.5,
        corpus: Iterable[str] | None = None,
        max_df: int = 10,
    ) -> None:
        if n < 1 or not 0 < threshold <= 1:
            raise ValueError(f"need n >= 1 and 0 < threshold <= 1, got {n}, {threshold}")
        if ids is not None and len(ids) != len(eval_problems):
            raise ValueError("ids and eval_problems differ in length")
        self.n, self.threshold = n, threshold
        self.ids = list(ids) if ids is not None else list(eval_problems)
        grams = [_ngrams(normalize_for_overlap(p), n) for p in eval_problems]
        self.boilerplate = self._boilerplate(set().union(*grams), corpus, max_df)
        self.index: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.sizes: list[int] = []
        for i, gram_set in enumerate(grams):
            kept = gram_set - self.boilerplate
            self.sizes.append(len(kept))
            for gram in kept:
                self.index[gram].append(i)

    def _boilerplate(
        self, eval_grams: set[tuple[str, ...]], corpus: Iterable[str] | None, max_df: int
    ) -> set[tuple[str, ...]]:
        """Eval n-grams found in more than max_df distinct corpus problems."""
        if corpus is None:
            return set()
        df: dict[tuple[str, ...], int] = defaultdict(int)
        seen: set[str] = set()
        for text in corpus:
            key = dedupe_key(text)
            if key in seen:  # exact repeats would inflate df and hide a contaminated problem
                continue
            seen.add(key)
            for gram in _ngrams(normalize_for_overlap(text), self.n) & eval_grams:
                df[gram] += 1
        return {gram for gram, count in df.items() if count > max_df}

    def best(self, problem: str) -> tuple[str, float] | None:
        """(id, score) of the eval problem with the largest share of its n-grams in ``problem``."""
        grams = _ngrams(normalize_for_overlap(problem), self.n)
        if not grams:
            return None
        shared: dict[int, int] = defaultdict(int)
        for gram in grams:
            for i in self.index.get(gram, ()):
                shared[i] += 1
        if not shared:
            return None
        # Containment of the eval problem, not of the candidate: a short training problem made of
        # one common phrase ("the number of ordered triples of positive integers (a, b, c) such
        # that") would otherwise be mostly "contained" in an unrelated eval problem.
        scores = {i: c / self.sizes[i] for i, c in shared.items()}
        i = max(scores, key=scores.__getitem__)
        return self.ids[i], scores[i]

    def match(self, problem: str) -> str | None:
        """The id (or text, when no ids were given) of the eval problem matched, else None."""
        found = self.best(problem)
        return found[0] if found is not None and found[1] >= self.threshold else None
