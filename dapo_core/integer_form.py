"""Integer form of an answer (DAPO section 3.5): m/n -> m+n, k sqrt(m) -> k+m, and so on.

DAPO (arXiv 2503.14476, section 3.5 "Dataset Transformation") makes every answer an integer so
that a rule-based verifier can grade it exactly: an answer such as (a+sqrt(b))/c is turned into
"write the answer in that form and report a+b+c" by an LLM rewriting the problem. Here the common
cases are done deterministically: ``dapo_core.latex`` computes the exact value of the answer
(never ``nsimplify``), and the value is matched structurally against a few canonical forms.

``integerize(answer)`` -> ``Integerized(value, form, instruction)`` or ``None``; no I/O.

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
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from dapo_core.answers import UNIT_MARKS
from dapo_core.exact import MAX_CHARS
from dapo_core.latex import MATH, SPACING_RE, evaluate

if TYPE_CHECKING:  # sympy is imported where an irrational value needs it (~0.7 s)
    import sympy

__all__ = ["MAX_ANSWER_CHARS", "Integerized", "integerize"]

# ---------------------------------------------------------------------------------------------
# The result type and the canonical forms
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Integerized:
    """An answer in integer form: the value to report, the stated form and the instruction."""

    value: int
    form: str
    instruction: str


MAX_ANSWER_CHARS = MAX_CHARS  # longer answers are tuples/expressions in practice
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
# From a MATH answer to an exact value
# ---------------------------------------------------------------------------------------------

_BOXED = re.compile(r"\\boxed\s*\{(.*)\}")
_UNITS = re.compile(rf"(?:\s*(?:{'|'.join(UNIT_MARKS)}))+\s*$")  # degrees, percent
_DOLLAR = re.compile(r"^\\?\$\s*")  # money: "\$5" or "$5"
_VARIABLE_EQ = re.compile(r"^[A-Za-z]\s*=\s*")
# "10,\!080" and "11,\! 111" are thousands separators in MATH answers; "1,-2" is a list.
_THOUSANDS_MARKED = re.compile(r"(?<=\d),\\!\s*(?=\d{3}(?!\d))")
_THOUSANDS_PLAIN = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")


def _preprocess(text: str) -> str:
    """Strip delimiters, units and spacing that do not change the value."""
    s = text.strip()
    if s.startswith("$") and s.endswith("$") and len(s) >= 2 and not s.startswith("\\$"):
        s = s.strip("$").strip()
    boxed = _BOXED.fullmatch(s)
    if boxed:
        s = boxed.group(1).strip()
    s = _THOUSANDS_MARKED.sub("", s)
    s = SPACING_RE.sub(" ", s).strip()
    s = _UNITS.sub("", s)
    s = _DOLLAR.sub("", s)
    s = _VARIABLE_EQ.sub("", s)
    return _THOUSANDS_PLAIN.sub(lambda m: m.group(0).replace(",", ""), s).strip()


# ---------------------------------------------------------------------------------------------
# Matching an exact value against the canonical forms
# ---------------------------------------------------------------------------------------------


def _is_square_free(n: int) -> bool:
    import sympy

    return n > 1 and all(e == 1 for e in sympy.factorint(n).values())


def _fraction_form(q: Fraction) -> Integerized:
    m, n = abs(q.numerator), q.denominator  # Fraction keeps m/n reduced with n > 0
    return _result("m/n" if q > 0 else "-m/n", m + n)


def _pi_form(c: sympy.Rational) -> Integerized:
    m, n = abs(int(c.p)), int(c.q)
    if n == 1:
        return _result("k\\pi" if c > 0 else "-k\\pi", m)
    return _result("\\frac{m\\pi}{n}" if c > 0 else "-\\frac{m\\pi}{n}", m + n)


def _radical_parts(value: sympy.Expr) -> tuple[Fraction, Fraction, int] | None:
    """value == a + b*sqrt(n) with rational a, b != 0 and integer n > 1, else None."""
    import sympy

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


def _classify(value: int | Fraction | sympy.Expr) -> Integerized | None:
    """Match an exact value (an expanded sympy value when irrational) against the canonical
    forms, most specific first."""
    if type(value) is int:
        return Integerized(value=value, form="integer", instruction="")
    if type(value) is Fraction:
        return _fraction_form(value)
    import sympy

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
        found = evaluate(_preprocess(answer), MATH)
        if found is None:
            return None
        value, saw_decimal = found
        if saw_decimal and not decimals_as_fractions and type(value) is not int:
            return None  # possibly a rounded decimal: an exact form could be false
        return _classify(value)
    except Exception:  # noqa: BLE001 - the contract is "None on any failure"
        return None
