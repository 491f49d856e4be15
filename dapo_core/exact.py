"""Exact, bounded arithmetic on answer values (DAPO Eq. 7 and section 3.5).

The reward of arXiv 2503.14476 (Eq. 7) compares an answer with an integer ground truth exactly,
and the integer transformation of section 3.5 states the exact form of an answer such as
``(1+sqrt 5)/2``. Both compute here, through ``dapo_core.latex``:

* rationals are Python ints and Fractions: exact, fast, no sympy;
* a surd or pi promotes a value to sympy (imported lazily, so plain answers never load it). A
  symbolic value is kept expanded and refused when it grows past fixed bounds, and a rational
  result goes back to an int or a Fraction, so a rational value is never a sympy object.

One set of limits bounds the work on adversarial input without a timer: ``MAX_CHARS`` and
``MAX_DEPTH`` for the text (read by the parser), ``MAX_BITS`` for every number computed, and a
few bounds on symbolic values. Every refusal raises ``NotExact``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from types import ModuleType
from typing import Any

__all__ = [
    "MAX_BITS",
    "MAX_CHARS",
    "MAX_DEPTH",
    "NotExact",
    "Value",
    "add",
    "div",
    "floordiv",
    "literal",
    "mul",
    "pi",
    "power",
]

MAX_CHARS = 200  # longer answers are tuples or prose in practice; bounds parse time
MAX_DEPTH = 100  # brackets nested deeper are refused: bounds the recursion on any text
MAX_BITS = 20_000  # largest numerator/denominator kept while computing ("9^{9^{9}}" is refused)
_MAX_ROOT_INDEX = 64
# A symbolic value is refused past these: a canonical form has two terms and one root.
_MAX_TERMS = 32
_MAX_ROOT_ATOMS = 4
_MAX_EXPONENT = 64  # integer power of a symbolic value, done by repeated squaring

Value = Any  # int | Fraction | sympy.Expr (sympy is imported lazily)


class NotExact(Exception):
    """Not one finite, exact number within the limits."""


# --- the operations the parser calls --------------------------------------------------------------


def literal(digits: str) -> int | Fraction:
    """The exact value of a decimal literal such as ``12``, ``0.25``, ``.5`` or ``3.``."""
    if digits.isdigit():
        return int(digits)
    whole, _, frac = digits.partition(".")
    return _checked(Fraction(int((whole + frac) or "0"), 10 ** len(frac)))


def pi() -> Value:
    return _sympy().pi


def add(a: Value, b: Value) -> Value:
    if _is_rational(a) and _is_rational(b):
        return _checked(a + b)
    return _norm(_symbolic(a) + _symbolic(b))


def mul(a: Value, b: Value) -> Value:
    if _is_rational(a) and _is_rational(b):
        return _checked(a * b)
    return _norm(_symbolic(a) * _symbolic(b))


def div(a: Value, b: Value) -> Value:
    if not _is_rational(b):
        return _symbolic_div(a, b)
    if b == 0:
        raise NotExact("division by zero")
    if type(a) is int and type(b) is int and a % b == 0:
        return a // b
    if _is_rational(a):
        return _checked(Fraction(a) / b)
    return _norm(a / _symbolic(b))


def floordiv(a: Value, b: Value) -> Value:
    """Python's ``//``, which calculator notation may use: rationals only."""
    if not (_is_rational(a) and _is_rational(b)) or b == 0:
        raise NotExact("floor division of an irrational number or by zero")
    return _checked(a // b)


def power(base: Value, exponent: Value, real_roots: bool) -> Value:
    """base ** exponent for a rational exponent, refusing results too large to compute."""
    if not _is_rational(exponent):
        raise NotExact("exponent is not a rational number")
    p, q = (exponent, 1) if type(exponent) is int else (exponent.numerator, exponent.denominator)
    if q > _MAX_ROOT_INDEX:
        raise NotExact("root index too large")
    if _is_rational(base):
        if q > 1:
            root = _rational_root(base, q, real_roots)
            if root is None:
                return _surd(base, p, q, real_roots)
            base = root
        return _rational_pow(base, p)
    if q > 1:
        if isinstance(base, _sympy().Add):
            # A nested radical (sqrt(7 + sqrt 5)): no canonical form has one, and sympy's sign
            # queries on them go through minimal polynomials, which can take minutes.
            raise NotExact("nested radical")
        base = _norm(base ** _sympy().Rational(1, q))
    return _symbolic_pow(base, p)


# --- rationals: ints and Fractions, checked -------------------------------------------------------


def _is_rational(x: Value) -> bool:
    return type(x) is int or type(x) is Fraction


def _bits(x: int | Fraction) -> int:
    if type(x) is int:
        return x.bit_length()
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _checked(x: int | Fraction) -> int | Fraction:
    """Refuse oversized rationals and turn whole Fractions into ints."""
    if _bits(x) > MAX_BITS:
        raise NotExact("number too large")
    if type(x) is Fraction and x.denominator == 1:
        return x.numerator
    return x


def _rational_pow(base: int | Fraction, p: int) -> int | Fraction:
    if base == 0 and p < 0:
        raise NotExact("division by zero")
    if base in (0, 1):
        return base if p else 1
    if base == -1:
        return -1 if p % 2 else 1
    # Bound the result size before computing it, so 9^{9^{9}} is refused instantly.
    if abs(p) > MAX_BITS or _bits(base) * abs(p) > MAX_BITS:
        raise NotExact("power too large")
    if p < 0:
        return _checked(1 / Fraction(base) ** -p)
    return _checked(base**p)


def _rational_root(x: int | Fraction, n: int, real_roots: bool) -> int | Fraction | None:
    """The n-th root of x when it is rational (real roots only on request), else None."""
    if x < 0:
        if not real_roots:
            return None  # the principal root is complex: sympy keeps it
        if n % 2 == 0:
            raise NotExact("even root of a negative number")
        root = _rational_root(-x, n, real_roots)
        return None if root is None else -root
    num, den = (x, 1) if type(x) is int else (x.numerator, x.denominator)
    r_num, r_den = _iroot(num, n), _iroot(den, n)
    if r_num**n != num or r_den**n != den:
        return None
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


# --- symbolic values: sympy, expanded and bounded at every step -----------------------------------


def _sympy() -> ModuleType:
    import sympy  # lazy: slow to import, and only surds and pi need it

    return sympy


def _symbolic(x: Value) -> Any:
    if type(x) is int:
        return _sympy().Integer(x)
    if type(x) is Fraction:
        return _sympy().Rational(x.numerator, x.denominator)
    return x


def _root_atoms(value: Any) -> list[Any]:
    return [p for p in value.atoms(_sympy().Pow) if not p.exp.is_Integer]


def _norm(value: Any) -> Value:
    """Expand a symbolic value: back to int/Fraction when rational, refused when too large."""
    sympy = _sympy()
    value = sympy.expand(value)
    if value.is_Rational:
        return _checked(Fraction(int(value.p), int(value.q)))
    if len(sympy.Add.make_args(value)) > _MAX_TERMS:
        raise NotExact("too many terms")
    if len(_root_atoms(value)) > _MAX_ROOT_ATOMS:
        raise NotExact("too many distinct roots")
    for r in value.atoms(sympy.Rational):
        if max(abs(r.p).bit_length(), r.q.bit_length()) > MAX_BITS:
            raise NotExact("number too large")
    return value


def _symbolic_div(a: Value, b: Any) -> Value:
    sympy = _sympy()
    if not isinstance(b, sympy.Add):
        return _norm(_symbolic(a) / b)  # a monomial: sympy cancels it (4pi/pi) or keeps it
    # Rationalise a denominator of a few square roots (1/(1+sqrt 2) = sqrt 2 - 1). radsimp is
    # exact but can be very slow with pi or higher roots, which no canonical form has anyway.
    roots = _root_atoms(b)
    if b.has(sympy.pi) or len(b.args) > 4 or any(p.exp.q != 2 for p in roots):
        raise NotExact("denominator cannot be rationalised cheaply")
    return mul(a, sympy.radsimp(1 / b))


def _symbolic_pow(base: Any, p: int) -> Value:
    if abs(p) > _MAX_EXPONENT:
        raise NotExact("exponent too large")
    result, square, e = 1, base, abs(p)
    while e:  # repeated squaring keeps every step bounded by _norm
        if e & 1:
            result = mul(result, square)
        e >>= 1
        if e:
            square = mul(square, square)
    return div(1, result) if p < 0 else result


def _surd(base: int | Fraction, p: int, q: int, real_roots: bool) -> Value:
    """base ** (p/q) when it is irrational (or, without real roots, complex)."""
    if _bits(base) * abs(p) > MAX_BITS:
        raise NotExact("power too large")
    sympy = _sympy()
    exponent = sympy.Rational(p, q)
    if base < 0 and real_roots:  # q is odd here: the real root of -|base|
        value = sympy.Pow(_symbolic(-base), exponent)
        return _norm(-value if p % 2 else value)
    return _norm(sympy.Pow(_symbolic(base), exponent))
