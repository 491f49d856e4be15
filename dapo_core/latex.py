"""The one reader of answer arithmetic: LaTeX, or calculator notation (DAPO Eq. 7, section 3.5).

The reward of arXiv 2503.14476 (Eq. 7) accepts ``\\frac{1080}{2}`` for the ground truth 540, and
the integer transformation of section 3.5 needs the value of ``\\frac{1+\\sqrt{5}}{2}``. Both read
the text here: ``evaluate(text, reading)`` tokenizes it (the LaTeX normalisation both share is a
set of lookup tables: operator spellings, spacing commands, unicode), and a recursive-descent
parser computes the value while it reads, with the exact, bounded operations of
``dapo_core.exact``. The two users differ only in a ``Reading``: ``REWARD`` for model output,
``MATH`` for the dataset answers that section 3.5 rewrites.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from dapo_core.exact import (
    MAX_CHARS,
    MAX_DEPTH,
    NotExact,
    Value,
    add,
    div,
    floordiv,
    literal,
    mul,
    pi,
    power,
)

__all__ = ["MATH", "REWARD", "SPACING", "SPACING_RE", "UNICODE", "Reading", "evaluate"]


@dataclass(frozen=True)
class Reading:
    """The conventions on which the reward and the integer transformation differ."""

    # Also read calculator notation, as models type it: ``^`` and ``**`` bind as Python's ``**``
    # ("2^10" = 1024, "2^3^2" = 512, "2^-1"), "//", "sqrt(8)", "root(8, 3)", "[1+2]", signs
    # after operators ("2*-3") and "(2)3". Otherwise ``^`` takes one LaTeX argument, so "2^10"
    # (which LaTeX typesets as 2^1 0) is refused.
    calculator: bool
    # "1\frac{4}{5}" is 1 + 4/5, as in MATH answers and as Math-Verify reads it; otherwise
    # juxtaposition multiplies.
    mixed_numbers: bool
    # Odd roots of negatives are real ("\sqrt[3]{-8}" = -2) and even ones are refused; otherwise
    # they are sympy's principal roots, which are complex and match no integer form.
    real_roots: bool


# The reward reads mixed numbers too: as a product, "2\frac{1}{2}" was 1, a false positive
# against the ground truth 1 that no grader in the field gives.
REWARD = Reading(calculator=True, mixed_numbers=True, real_roots=True)
MATH = Reading(calculator=False, mixed_numbers=True, real_roots=False)

# --- tokens: the shared LaTeX normalisation, as lookup tables ------------------------------------

# Unicode spellings of operators and of pi.
UNICODE = str.maketrans(
    {"−": "-", "–": "-", "×": "*", "·": "*", "⋅": "*", "÷": "/", "π": "\\pi", "≈": "\\approx "}
)
# Spellings of one operator.
_TIMES = frozenset({"*", "\\cdot", "\\times", "\\ast"})
_OVER = frozenset({"/", "\\div"})
_FRAC = frozenset({"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"})
# Sizing and spacing commands: they never change the value.
SPACING = r"\\(?:left|right|displaystyle|quad|qquad)(?![A-Za-z])|\\[,;:! ]|~"
SPACING_RE = re.compile(SPACING)
_TOKEN_RE = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|[A-Za-z]+|\*\*|//|[-+*/^(){}\[\],]")
# A word that is not a command or a calculator call: prose such as "540 or 541" has no value.
_PROSE_RE = re.compile(r"(?<![\\A-Za-z])(?!(?:sqrt|root)\s*\()[A-Za-z]")
_SIGNS = ("+", "-")
_CLOSING = {"(": ")", "{": "}", "[": "]"}
# Tokens that start a factor multiplied by juxtaposition ("2\sqrt{3}", "\frac{3}{4}\pi").
_JUXTAPOSED = _FRAC | {"\\sqrt", "\\pi", "(", "{"}
_CALCULATOR_JUXTAPOSED = frozenset({"[", "sqrt", "root"})


def _tokenize(text: str) -> list[str]:
    if not text.isascii():
        text = text.translate(UNICODE)
    if "\\" in text or "~" in text:
        text = SPACING_RE.sub(" ", text)
    tokens = _TOKEN_RE.findall(text)
    # findall skips what no token matches: then the tokens do not spell the text.
    if "".join(tokens) != "".join(text.split()):
        raise NotExact("unexpected character")
    return tokens


def evaluate(text: str, reading: Reading) -> tuple[Value, bool] | None:
    """(exact value of ``text``, whether a non-integer decimal was read), or None. Never raises.

    The value is an int or a Fraction when rational, else an expanded sympy expression. None
    when ``text`` is not one finite number in ``reading``, or exceeds a limit of
    ``dapo_core.exact``.
    """
    if not isinstance(text, str) or len(text) > MAX_CHARS or _PROSE_RE.search(text):
        return None
    try:
        parser = _Parser(_tokenize(text), reading)
        return parser.parse(), parser.saw_decimal
    except Exception:  # NotExact, RecursionError, a sympy error: no value
        return None


# --- the parser -----------------------------------------------------------------------------------


class _Parser:
    """Recursive descent that computes while it reads:

    expr := term (+|- term)*        term := factor (*|/ factor | juxtaposed factor)*
    factor := primary [^ exponent]
    primary := number | (expr) | {expr} | \\pi | \\frac arg arg | \\sqrt[expr] arg

    A LaTeX reading allows signs only before the first term and the exponent; a calculator
    reading allows them before any factor, as Python does.
    """

    def __init__(self, tokens: list[str], reading: Reading) -> None:
        self.tokens: list[str | None] = [*tokens, None]  # None ends the input
        self.calculator, self.real_roots = reading.calculator, reading.real_roots
        self.mixed_numbers = reading.mixed_numbers
        self.pos = self.depth = 0
        self.bare_end = -1  # where the last unbraced macro argument ("\\sqrt3") ends
        self.saw_decimal = False  # a non-integer decimal literal was read

    def take(self, expected: str | None = None) -> str:
        tok = self.tokens[self.pos]
        if tok is None or (expected is not None and tok != expected):
            raise NotExact(f"expected {expected!r}, got {tok!r}")
        self.pos += 1
        return tok

    def signs(self) -> bool:
        """Consume a run of + and -; True when it negates."""
        negative = False
        while self.tokens[self.pos] in _SIGNS:
            negative ^= self.take() == "-"
        return negative

    def parse(self) -> Value:
        value = self.expr()
        if self.tokens[self.pos] is not None:
            raise NotExact(f"trailing token {self.tokens[self.pos]!r}")
        return value

    def nested(self) -> Value:
        """An expr inside brackets: the nesting depth bounds the recursion."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise NotExact("nested too deeply")
        value = self.expr()
        self.depth -= 1
        return value

    def expr(self) -> Value:
        negative = not self.calculator and self.signs()
        value = self.term()
        if negative:
            value = -value
        while self.tokens[self.pos] in _SIGNS:
            negative = self.take() == "-"
            rhs = self.term()
            value = add(value, -rhs if negative else rhs)
        return value

    def term(self) -> Value:
        tokens, start = self.tokens, self.pos
        value = self.factor()
        # A term that so far is one integer literal may go on as a mixed number.
        plain_int = self.mixed_numbers and self.pos == start + 1 and tokens[start].isdigit()
        while True:
            tok = tokens[self.pos]
            if tok in _TIMES:
                self.pos += 1
                value = mul(value, self.factor())
            elif tok in _OVER:
                self.pos += 1
                value = div(value, self.factor())
            elif tok == "//" and self.calculator:
                self.pos += 1
                value = floordiv(value, self.factor())
            elif tok in _JUXTAPOSED or (self.calculator and self.juxtaposed(tok)):
                rhs = self.factor()
                if plain_int and tok in _FRAC and type(rhs) is Fraction and 0 < rhs < 1:
                    value = add(value, rhs)  # "1\frac{4}{5}" is 1 + 4/5
                else:
                    value = mul(value, rhs)
            else:
                return value
            plain_int = False

    def juxtaposed(self, tok: str | None) -> bool:
        """Calculator juxtaposition beyond LaTeX's: "2[3]", "2sqrt(3)", "(2)3", "\\sqrt3 2"."""
        closed = self.tokens[self.pos - 1] in (")", "}", "]") or self.bare_end == self.pos
        return tok in _CALCULATOR_JUXTAPOSED or (closed and _is_number(tok))

    def factor(self) -> Value:
        negative = self.calculator and self.tokens[self.pos] in _SIGNS and self.signs()
        value = self.primary()
        tok = self.tokens[self.pos]
        if tok == "^" or (tok == "**" and self.calculator):
            self.pos += 1
            value = power(value, self.exponent(), self.real_roots)
        return -value if negative else value

    def exponent(self) -> Value:
        if self.calculator:
            return self.factor()  # Python's **: right-associative, signed, any operand
        negative = self.tokens[self.pos] in _SIGNS and self.take() == "-"
        value = self.argument(split_digits=False)
        return -value if negative else value

    def argument(self, split_digits: bool = True) -> Value:
        """A macro argument: a braced group or one token (one digit of a run, for \\frac43)."""
        tokens, pos = self.tokens, self.pos
        tok = tokens[pos]
        if tok == "{":
            if pos + 2 < len(tokens) and tokens[pos + 2] == "}" and _is_number(tokens[pos + 1]):
                self.pos += 3  # the usual "{1080}": read without descending through expr
                return self.number(tokens[pos + 1])
            return self.group()
        if tok == "\\pi":
            self.pos = self.bare_end = pos + 1
            return pi()
        if not _is_number(tok):
            raise NotExact(f"bad macro argument {tok!r}")
        if len(tok) > 1:
            if not split_digits:
                raise NotExact("unbraced multi-character exponent")
            tokens[pos : pos + 1] = [tok[0], tok[1:]]  # "\frac43" is \frac{4}{3}
        self.pos = self.bare_end = pos + 1
        return literal(tok[0])

    def group(self) -> Value:
        close = _CLOSING[self.tokens[self.pos]]
        self.pos += 1
        value = self.nested()
        self.take(close)
        return value

    def primary(self) -> Value:
        tok = self.tokens[self.pos]
        if _is_number(tok):
            self.pos += 1
            return self.number(tok)
        if tok == "(" or tok == "{" or (tok == "[" and self.calculator):
            return self.group()
        if tok in _FRAC:
            self.pos += 1
            numerator = self.argument()
            return div(numerator, self.argument())
        if tok == "\\sqrt":
            self.pos += 1
            index = self.group() if self.tokens[self.pos] == "[" else 2
            return self.root(self.argument(), index)
        if tok == "\\pi":
            self.pos += 1
            return pi()
        if (tok == "sqrt" or tok == "root") and self.calculator:
            return self.call()
        raise NotExact(f"unsupported token {tok!r}")  # \infty, \text, a lone operator, the end

    def number(self, tok: str) -> Value:
        value = literal(tok)
        self.saw_decimal |= type(value) is not int
        return value

    def call(self) -> Value:
        """sqrt(x) or root(x, n), as typed in calculator notation."""
        name = self.take()
        self.take("(")
        radicand, index = self.nested(), 2
        if name == "root":
            self.take(",")
            index = self.nested()
        self.take(")")
        return self.root(radicand, index)

    def root(self, radicand: Value, index: Value) -> Value:
        if type(index) is not int or index < 2:
            raise NotExact("bad root index")  # power() refuses the large ones
        return power(radicand, Fraction(1, index), self.real_roots)


def _is_number(tok: str | None) -> bool:
    return tok is not None and (tok[0].isdigit() or tok[0] == ".")
