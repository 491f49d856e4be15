"""Tests for dapo_core.curation: hand-computed integer forms, templates, keys, decontamination."""

import json
import math
import random
import re
import time
from collections import Counter
from pathlib import Path

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.answers import canonical_integer
from dapo_core.curation import (
    TEMPLATE_PREFIX,
    TEMPLATE_SUFFIX,
    Decontaminator,
    apply_template,
    dedupe_key,
    normalize_for_overlap,
    strip_template,
)
from dapo_core.integer_form import Integerized, integerize

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"  # ../shared/data

# ---------------------------------------------------------------------------------------------
# integerize: (answer, expected form, expected value), every value computed by hand
# ---------------------------------------------------------------------------------------------

FRACTIONS = [
    (r"\frac{3}{4}", "m/n", 7),
    (r"\dfrac{3}{4}", "m/n", 7),
    (r"\tfrac{3}{4}", "m/n", 7),
    ("3/4", "m/n", 7),
    (r"\frac{6}{8}", "m/n", 7),  # reduced to 3/4 first
    (r"\frac43", "m/n", 7),  # unbraced LaTeX arguments
    (r"\frac 59", "m/n", 14),
    (r"\frac9{19}", "m/n", 28),
    (r"\frac{270}7", "m/n", 277),
    (r"-\frac{1}{2}", "-m/n", 3),
    ("-3/4", "-m/n", 7),
    (r"\frac{-3}{4}", "-m/n", 7),
    (r"\left( -\frac{35}{9} \right)", "-m/n", 44),
    (r"1\frac{4}{5}", "m/n", 14),  # mixed number 9/5
    (r"137 \frac{1}{2}", "m/n", 277),  # 275/2
    (r"\frac{1}{2}\cdot\frac{2}{3}", "m/n", 4),  # 1/3
    (r"\frac{1}{2}+\frac{1}{3}", "m/n", 11),  # 5/6
    (r"2^{-3}", "m/n", 9),  # 1/8
]

RADICALS = [
    (r"\sqrt{2}", "k\\sqrt{m}", 3),  # k = 1
    (r"\sqrt2", "k\\sqrt{m}", 3),
    (r"2\sqrt{3}", "k\\sqrt{m}", 5),
    (r"\sqrt{12}", "k\\sqrt{m}", 5),  # 2 sqrt 3
    (r"3\sqrt{8}", "k\\sqrt{m}", 8),  # 6 sqrt 2
    (r"70 \sqrt{2}", "k\\sqrt{m}", 72),
    (r"-\sqrt{3}", "-k\\sqrt{m}", 4),
    (r"-2\sqrt{50}", "-k\\sqrt{m}", 12),  # -10 sqrt 2
    (r"\frac{\sqrt{3}}{2}", "\\frac{m\\sqrt{n}}{p}", 6),
    (r"\frac{3\sqrt{3}}{4}", "\\frac{m\\sqrt{n}}{p}", 10),
    (r"\frac{1}{\sqrt{2}}", "\\frac{m\\sqrt{n}}{p}", 5),  # sqrt 2 / 2
    (r"\frac{2\sqrt{3}}{6}", "\\frac{m\\sqrt{n}}{p}", 7),  # sqrt 3 / 3
    (r"\frac{\sqrt{8}}{3}", "\\frac{m\\sqrt{n}}{p}", 7),  # 2 sqrt 2 / 3
    (r"-\frac{\sqrt{5}}{5}", "-\\frac{m\\sqrt{n}}{p}", 11),
    (r"11-2\sqrt{6}", "k-m\\sqrt{n}", 19),
    (r"1+2\sqrt{3}", "k+m\\sqrt{n}", 6),
    (r"11 \sqrt{5} + 11", "k+m\\sqrt{n}", 27),
    (r"4+\sqrt{12}", "k+m\\sqrt{n}", 9),  # 4 + 2 sqrt 3
    (r"\sqrt{5}-1", "m\\sqrt{n}-k", 7),
    (r"-1-\sqrt{2}", "-k-m\\sqrt{n}", 4),
    (r"\frac{1}{1+\sqrt{2}}", "m\\sqrt{n}-k", 4),  # rationalised: sqrt 2 - 1
    (r"\frac{1+\sqrt{5}}{2}", "\\frac{k+m\\sqrt{n}}{p}", 9),
    (r"\frac{2+2\sqrt{5}}{4}", "\\frac{k+m\\sqrt{n}}{p}", 9),  # gcd reduction to (1+sqrt5)/2
    (r"\frac{2+4\sqrt{3}}{6}", "\\frac{k+m\\sqrt{n}}{p}", 9),  # (1 + 2 sqrt 3) / 3
    (r"\frac{1}{2}+\frac{\sqrt{3}}{3}", "\\frac{k+m\\sqrt{n}}{p}", 14),  # (3 + 2 sqrt 3) / 6
    (r"\frac{3-\sqrt{5}}{2}", "\\frac{k-m\\sqrt{n}}{p}", 11),
    (r"\frac{\sqrt{5}-1}{4}", "\\frac{m\\sqrt{n}-k}{p}", 11),
    (r"-\frac{1+\sqrt{3}}{2}", "-\\frac{k+m\\sqrt{n}}{p}", 7),
    (r"\frac{4+\sqrt{12}}{2}", "k+m\\sqrt{n}", 6),  # 2 + sqrt 3: p = 1 drops the fraction
    (r"(1+\sqrt{2})^{2}", "k+m\\sqrt{n}", 7),  # 3 + 2 sqrt 2
    (r"\frac{2}{\sqrt{3}-1}", "k+m\\sqrt{n}", 5),  # 1 + sqrt 3
]

PI_FORMS = [
    (r"4\pi", "k\\pi", 4),
    (r"288 \pi", "k\\pi", 288),
    (r"\pi", "k\\pi", 1),
    (r"-2\pi", "-k\\pi", 2),
    (r"\frac{3\pi}{4}", "\\frac{m\\pi}{n}", 7),
    (r"\frac{6\pi}{8}", "\\frac{m\\pi}{n}", 7),  # reduced
    (r"\frac{3}{4}\pi", "\\frac{m\\pi}{n}", 7),
    (r"\pi/2", "\\frac{m\\pi}{n}", 3),
    (r"\frac{\pi}{2}", "\\frac{m\\pi}{n}", 3),
    (r"-\frac{\pi}{6}", "-\\frac{m\\pi}{n}", 7),
]

INTEGERS_IN_DISGUISE = [
    ("10/2", 5),
    (r"\frac{10}{2}", 5),
    (r"\sqrt{16}", 4),
    (r"\sqrt[3]{27}", 3),
    ("4.0", 4),
    ("2^3", 8),
    ("2^{10}", 1024),
    ("007", 7),
    ("-3", -3),
    ("-0", 0),
    ("+5", 5),
    (r"\frac{4\pi}{\pi}", 4),
    (r"(\sqrt{2})^2", 2),
    (r"(1+\sqrt{2})(\sqrt{2}-1)", 1),  # only seen after multiplying out
    ("0.5*4", 2),
    (r"5^\circ", 5),
    (r"90^{\circ}", 90),
    (r"10\%", 10),
    (r"\$5", 5),
    ("$5", 5),
    (r"\$32,\!348", 32348),
    (r"10,\!080", 10080),
    (r"11,\! 111,\! 111,\! 100", 11111111100),
    ("58,500", 58500),
    ("x=5", 5),  # decided: "<letter> = value" is read as the value
    (r"\boxed{12}", 12),
    ("$12$", 12),
    (r"\left( 7 \right)", 7),
    ("123456789012345678901234567890", 123456789012345678901234567890),
]

NONE_CASES = [
    r"\left( 3, \frac{\pi}{2} \right)",  # tuple
    "1,-2",  # list
    "3, 5, 7",
    "(3,4]",  # interval
    "[1,2]",
    r"(2,\infty)",
    r"\infty",
    r"\text{(C)}",
    r"\text{Evelyn}",
    r"\frac{270}7\text{ degrees}",  # degrees with text
    r"864 \mbox{ inches}^2",
    "6 - 5i",  # complex
    "x+1",  # symbols
    "y = 2x + 3",
    "2k",
    "0.5",  # decided: non-integer decimals need decimals_as_fractions=True
    "3.21",
    r"\$18.90",
    "52_8",  # base
    r"\sqrt{2}+\sqrt{3}",  # two radicals: no canonical form
    r"18+2\pi",
    r"\frac{20000}{\pi}",
    r"\pi^2",
    r"\sqrt{\pi}",
    r"\sqrt[3]{2}",
    r"1 \pm \sqrt{19}",
    r"\sqrt{-4}",
    r"\frac{1}{0}",
    r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
    "2^10",  # decided: LaTeX reads it as 2^1 0
    "9^{9^{9}}",  # too large to compute: refused, not hung
    "",
    "   ",
    "((((",
    r"\frac{1}{2",
    "1" * 201,  # over the length bound
]


@pytest.mark.parametrize(("answer", "form", "value"), FRACTIONS + RADICALS + PI_FORMS)
def test_integerize_forms(answer, form, value):
    result = integerize(answer)
    assert result is not None, answer
    assert (result.form, result.value) == (form, value)
    assert result.instruction.startswith("The answer can be written in the form $")
    assert result.instruction.endswith("$.")


@pytest.mark.parametrize(("answer", "value"), INTEGERS_IN_DISGUISE)
def test_integerize_integers_in_disguise(answer, value):
    assert integerize(answer) == Integerized(value=value, form="integer", instruction="")


@pytest.mark.parametrize("answer", NONE_CASES)
def test_integerize_none(answer):
    assert integerize(answer) is None


PATHOLOGICAL = [
    r"(\sqrt{2}+\sqrt{3}+\sqrt{5}+\sqrt{7}+\sqrt{11})^{64}",  # expansion would explode
    r"\frac{1}{\sqrt[64]{2}+\sqrt[63]{3}+\sqrt[62]{5}+\sqrt[61]{7}}",  # slow to rationalise
    r"(3-\sqrt{7+\sqrt{5}})^{-32}",  # nested radical: sympy sign queries take minutes
    r"(\sqrt{2}+\sqrt{3}+\sqrt{5}+\sqrt{7})" * 6,
    "2^{2^{2^{2^{2}}}}",
    r"\sqrt{" + "9" * 150 + "}",
    "(" * 95 + "1" + ")" * 95,
]


def test_integerize_time_is_bounded():
    start = time.process_time()  # CPU seconds: a busy machine does not inflate them
    results = [integerize(answer) for answer in PATHOLOGICAL]
    assert time.process_time() - start < 10
    assert results[:-1] == [None] * (len(PATHOLOGICAL) - 1)
    assert results[-1] == Integerized(1, "integer", "")


def test_integerize_instruction_text():
    assert integerize(r"\frac{3}{4}").instruction == (
        "The answer can be written in the form $\\frac{m}{n}$, where $m$ and $n$ are relatively "
        "prime positive integers. Find $m+n$."
    )
    assert integerize(r"-\frac{3}{4}").instruction.startswith(
        "The answer can be written in the form $-\\frac{m}{n}$"
    )
    ksqrt = integerize(r"2\sqrt{3}").instruction
    assert "$k\\sqrt{m}$" in ksqrt and ksqrt.endswith("Find $k+m$.")
    framed = integerize(r"\frac{1+\sqrt{5}}{2}").instruction
    assert "$\\frac{k+m\\sqrt{n}}{p}$" in framed and "\\gcd(k, m, p) = 1" in framed
    assert framed.endswith("Find $k+m+n+p$.")
    assert integerize(r"4\pi").instruction.endswith("Find $k$.")


@pytest.mark.parametrize(
    ("answer", "form", "value"),
    [("0.5", "m/n", 3), ("1.25", "m/n", 9), ("-0.75", "-m/n", 7), (".0000672", "m/n", 312521)],
)
def test_integerize_decimals_opt_in(answer, form, value):
    result = integerize(answer, decimals_as_fractions=True)
    assert (result.form, result.value) == (form, value)


def test_integerize_rejects_non_strings():
    assert integerize(None) is None  # type: ignore[arg-type]
    assert integerize(3) is None  # type: ignore[arg-type]


def _square_free(n: int) -> bool:
    return n > 1 and all(e == 1 for e in sympy.factorint(n).values())


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6), st.integers(2, 10**6))
def test_property_fraction_gives_m_plus_n(m, n):
    g = math.gcd(m, n)
    m, n = m // g, n // g
    if n == 1:
        return  # an integer, covered elsewhere
    result = integerize(f"\\frac{{{m}}}{{{n}}}")
    assert (result.form, result.value) == ("m/n", m + n)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**4), st.integers(2, 10**4).filter(_square_free))
def test_property_k_sqrt_m_gives_k_plus_m(k, m):
    result = integerize(f"{k}\\sqrt{{{m}}}")
    assert (result.form, result.value) == ("k\\sqrt{m}", k + m)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 500),
    st.integers(1, 500),
    st.integers(2, 500).filter(_square_free),
    st.integers(2, 500),
)
def test_property_framed_radical_gives_k_m_n_p(k, m, n, p):
    g = math.gcd(k, m, p)
    k, m, p = k // g, m // g, p // g
    result = integerize(f"\\frac{{{k}+{m}\\sqrt{{{n}}}}}{{{p}}}")
    if p == 1:
        assert (result.form, result.value) == ("k+m\\sqrt{n}", k + m + n)
    else:
        assert (result.form, result.value) == ("\\frac{k+m\\sqrt{n}}{p}", k + m + n + p)


_TOKENS = ["\\frac", "\\sqrt", "\\pi", "{", "}", "(", ")", "[", "]", "^", "-", "+", "/", "*"]
_TOKENS += ["2", "3", "12", "0", ".5", "9", ",", "x", "\\cdot", "\\text{a}", "\\circ", "\\%"]


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.text(max_size=40), st.lists(st.sampled_from(_TOKENS), max_size=20).map("".join))
)
def test_property_integerize_never_raises(text):
    result = integerize(text)
    assert result is None or isinstance(result.value, int)


# ---------------------------------------------------------------------------------------------
# canonical_integer, templates, dedupe keys
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("023", "23"),
        ("+5", "5"),
        ("1,000", "1000"),
        ("1,000,000", "1000000"),
        ("-0", "0"),
        ("000", "0"),
        (" 42 ", "42"),
        ("-007", "-7"),
        ("\u22123", "-3"),  # unicode minus
        ("12.0", "12"),
        ("12.", "12"),
        ("9" * 5000, "9" * 5000),  # beyond int()'s default digit limit: kept exact
        ("1,00", None),
        ("1.5", None),
        ("--5", None),
        ("5e3", None),
        ("1 000", None),
        ("abc", None),
        ("", None),
        (r"\frac{1}{2}", None),
    ],
)
def test_canonical_integer(answer, expected):
    assert canonical_integer(answer) == expected


PROBLEM = "Find the number of positive integers $n \\le 1000$ such that\n\n$$n^2 + 1$$ is prime."


def test_template_round_trip():
    prompt = apply_template(PROBLEM)
    assert prompt == TEMPLATE_PREFIX + PROBLEM + TEMPLATE_SUFFIX
    assert prompt.startswith("Solve the following math problem step by step.")
    assert prompt.endswith('Remember to put your answer on its own line after "Answer:".')
    assert strip_template(prompt) == PROBLEM


def test_strip_template_tolerates_whitespace():
    prefix = re.sub(r"\s+", "  ", TEMPLATE_PREFIX).replace("problem.  ", "problem.\n")
    suffix = " \n" + TEMPLATE_SUFFIX.strip().replace(" ", "\t", 2) + "\n  "
    assert strip_template("  " + prefix + PROBLEM + suffix) == PROBLEM


def test_strip_template_without_template_or_with_one_half():
    assert strip_template("  \n" + PROBLEM + "\n ") == PROBLEM
    assert strip_template(TEMPLATE_PREFIX + PROBLEM) == PROBLEM
    assert strip_template(PROBLEM + TEMPLATE_SUFFIX) == PROBLEM


def test_dedupe_key_ignores_whitespace_keeps_case():
    a = "Find  $x$ if\n$x^2 = 4$ ."
    b = "Find $x$ if $x^2=4$."
    assert dedupe_key(a) == dedupe_key(b)
    assert dedupe_key("Let $A$ be") != dedupe_key("Let $a$ be")
    assert dedupe_key("12 3") == dedupe_key("123")  # whitespace-insensitive by design


# ---------------------------------------------------------------------------------------------
# Decontamination
# ---------------------------------------------------------------------------------------------

BOILERPLATE = (
    "can be written as $\\frac{m}{n}$, where $m$ and $n$ are relatively prime positive "
    "integers. Find $m+n$."
)
EVAL = {
    "dice": f"Two fair dice are rolled. The probability that the sum is prime {BOILERPLATE}",
    "polygon": (
        "A convex polygon has $12$ sides, and no three of its diagonals pass through a single "
        "interior point. Find the number of regions into which the diagonals divide the interior "
        "of the polygon, given that every vertex lies on a common circle of radius $5$."
    ),
    "sequence": (
        "The sequence $a_1, a_2, \\ldots$ satisfies $a_1 = 3$ and $a_{n+1} = a_n^2 - 2a_n + 2$ for "
        "every positive integer $n$. Find the remainder when $a_{20}$ is divided by $1000$."
    ),
}
UNRELATED = (
    "Three fair coins are tossed at once. The chance that exactly two of them land heads "
    + BOILERPLATE
)


def _boilerplate_corpus(size: int = 50) -> list[str]:
    """Different problems that all end in the same m/n sentence."""
    things = [
        "marbles",
        "cards",
        "socks",
        "balls",
        "coins",
        "dice",
        "tiles",
        "beads",
        "pens",
        "keys",
    ]
    events = ["all {} are red", "no two {} match", "the {} form a pair", "two {} are blue"]
    corpus = []
    for i in range(size):
        thing = things[i % len(things)]
        event = events[i % len(events)].format(thing)
        corpus.append(
            f"A box holds {i + 3} {thing}, of which {i % 5 + 1} are special. {i % 3 + 2} {thing} "
            f"are drawn. The probability that {event} {BOILERPLATE}"
        )
    return corpus


def _decontaminator(**kwargs) -> Decontaminator:
    return Decontaminator(list(EVAL.values()), list(EVAL), **kwargs)


def test_normalize_for_overlap():
    words = normalize_for_overlap("Let $x\\,=\\!\\dfrac{1}{2}$; FIND   x.")
    assert words == ["let", "x", "frac", "1", "2", "find", "x"]


@pytest.mark.parametrize("corpus", [None, _boilerplate_corpus()])
def test_exact_copy_matches(corpus):
    deco = _decontaminator(corpus=corpus)
    for key, text in EVAL.items():
        assert deco.match(text) == key


def test_near_duplicate_matches():
    deco = _decontaminator(corpus=_boilerplate_corpus())
    copy = (
        "A  convex polygon has $12$ sides,\nand no three of its diagonals pass through one "
        "interior point.  Find the number of regions into which the diagonals split the interior "
        "of the polygon,\\, given that every vertex lies on a common circle of radius $5$ ."
    )  # whitespace, LaTeX spacing, "a single" -> "one", "divide" -> "split"
    assert deco.match(copy) == "polygon"
    sequence = EVAL["sequence"].replace("$a_1 = 3$", "$a_1\\!=\\!3$").replace("every", "each")
    assert deco.match(sequence + " Express the answer as an integer.") == "sequence"


def test_boilerplate_alone_does_not_match():
    plain = _decontaminator(threshold=0.3)
    filtered = _decontaminator(threshold=0.3, corpus=_boilerplate_corpus())
    # Without the document-frequency filter the shared m/n sentence alone is enough to flag it.
    assert plain.match(UNRELATED) == "dice"
    assert filtered.boilerplate  # the m/n sentence's n-grams were dropped from the index
    assert filtered.best(UNRELATED) is None
    assert filtered.match(UNRELATED) is None
    assert filtered.match(EVAL["dice"]) == "dice"  # the eval problem itself still matches
    assert _decontaminator(corpus=_boilerplate_corpus()).match(UNRELATED) is None


def test_corpus_duplicates_do_not_hide_contamination():
    # Twelve verbatim copies of an eval problem in the corpus must not make it "boilerplate".
    corpus = _boilerplate_corpus() + [EVAL["polygon"]] * 12
    assert _decontaminator(corpus=corpus, max_df=10).match(EVAL["polygon"]) == "polygon"


def test_decontaminator_parameters():
    deco = Decontaminator(list(EVAL.values()), n=3, threshold=0.9)
    assert deco.match(EVAL["sequence"]) == EVAL["sequence"]  # no ids: returns the text
    assert deco.match("completely different words here") is None
    assert Decontaminator(["short one"], n=13).match("short one") == "short one"
    with pytest.raises(ValueError):
        Decontaminator(["a"], n=0)
    with pytest.raises(ValueError):
        Decontaminator(["a"], threshold=0)
    with pytest.raises(ValueError):
        Decontaminator(["a", "b"], ["only one id"])


def test_decontaminator_speed_synthetic():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(3000)]
    evals = [" ".join(rng.choices(vocab, k=80)) for _ in range(60)]
    train = [" ".join(rng.choices(vocab, k=70)) for _ in range(18_000)]
    start = time.process_time()  # CPU seconds: a busy machine does not inflate them
    deco = Decontaminator(evals, corpus=train)
    flagged = sum(deco.match(p) is not None for p in train)
    cpu_s = time.process_time() - start
    assert flagged == 0
    assert cpu_s < 15, cpu_s


# ---------------------------------------------------------------------------------------------
# Real data (read-only; skipped when absent)
# ---------------------------------------------------------------------------------------------

MATH500 = DATA / "math-500" / "test.jsonl"
AIME = [DATA / "aime-2024" / "test.jsonl", DATA / "aime-2025" / "test.jsonl"]
DAPO17K = DATA / "dapo-math-17k" / "dapo_math_17k.parquet"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.skipif(not MATH500.exists(), reason="MATH-500 not available")
def test_math500_answers(record_property):
    answers = [row["answer"] for row in _jsonl(MATH500)]
    assert len(answers) == 500
    forms: Counter = Counter()
    for answer in answers:
        result = integerize(answer)  # must never raise
        if re.fullmatch(r"-?\d+", answer.strip()):
            assert result == Integerized(int(answer), "integer", ""), answer
        else:
            forms[result.form if result is not None else None] += 1
    converted = sum(count for form, count in forms.items() if form is not None)
    print(f"MATH-500 non-integer answers: {sum(forms.values())}, converted {converted}: {forms}")
    record_property("math500_forms", dict(forms))
    assert sum(forms.values()) == 189
    assert converted >= 100  # 84 rewritten forms + 20 integers in disguise when written


@pytest.mark.skipif(
    not (DAPO17K.exists() and all(p.exists() for p in AIME)), reason="DAPO-17K/AIME not available"
)
def test_dapo17k_against_aime(record_property):
    pq = pytest.importorskip("pyarrow.parquet")
    rows = pq.read_table(DAPO17K, columns=["prompt"]).column("prompt").to_pylist()
    problems = [messages[0]["content"] for messages in rows]
    evals = [
        (f"{path.parent.name}/{row['id']}", row["problem"]) for path in AIME for row in _jsonl(path)
    ]
    ids, texts = zip(*evals, strict=True)

    start = time.process_time()  # CPU seconds: a busy machine does not inflate them
    deco = Decontaminator(texts, ids, corpus=problems)
    flagged = [i for i, problem in enumerate(problems) if deco.match(problem) is not None]
    elapsed = time.process_time() - start

    print(f"DAPO-17K rows {len(problems)}: flagged {len(flagged)} in {elapsed:.2f} CPU s")
    record_property("dapo17k_flagged", len(flagged))
    assert len(problems) == 17_917
    assert all(deco.match(text) == key for key, text in evals)  # each eval problem finds itself
    assert len(flagged) < 0.01 * len(problems)
    assert elapsed < 30
