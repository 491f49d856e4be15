"""Tests for dapo_core.reward: the rule-based outcome reward of DAPO (Eq. 7)."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core import equivalence
from dapo_core.answers import parse_integer as normalize_integer
from dapo_core.reward import Score, equivalence_name, equivalent, extract_answer, score

REASONING = (
    "Let the number of tiles be $n$. Each row holds $12$ tiles, so we need $n / 12$ rows.\n"
    "Checking small cases: $12 \\cdot 3 = 36$ and $12 \\cdot 4 = 48$, so the pattern holds.\n"
)


def respond(final: str) -> str:
    """A response with some reasoning and ``final`` as its last line."""
    return REASONING + final


# --- correct forms ----------------------------------------------------------------------------

CORRECT = [
    ("Answer: 540", "540"),
    ("answer: 540", "540"),
    ("ANSWER: 540", "540"),
    ("Answer : 540", "540"),
    ("**Answer:** 540", "540"),
    ("**Answer**: 540", "540"),
    ("> **Answer:** 540", "540"),
    ("Final Answer: 540", "540"),
    ("## Final Answer: 540", "540"),
    ("\\textbf{Answer:} 540", "540"),
    ("Answer: 0540", "540"),
    ("Answer: 1,000", "1000"),
    ("Answer: 1\\,000", "1000"),
    ("Answer: 1{,}000", "1000"),
    ("Answer: 1 000", "1000"),
    ("Answer: 1,234,567", "1234567"),
    ("Answer: 540.", "540"),
    ("Answer: **540**", "540"),
    ("Answer: `540`", "540"),
    ("Answer: $540$", "540"),
    ("Answer: $$540$$", "540"),
    ("Answer: \\(540\\)", "540"),
    ("Answer: \\[540\\]", "540"),
    ("Answer: \\boxed{540}", "540"),
    ("Answer: $\\boxed{540}$", "540"),
    ("Answer: \\boxed {540}", "540"),
    ("Answer: \\boxed{\\boxed{540}}", "540"),  # boxed twice
    ("Answer: $\\boxed{\\fbox{540}}$", "540"),
    ("Answer: \\fbox{540}", "540"),
    ("Answer: 540 degrees", "540"),
    ("Answer: 540^\\circ", "540"),
    ("Answer: $540^{\\circ}$", "540"),
    ("Answer: 540°", "540"),
    ("Answer: \\text{540 cm}", "540"),
    ("Answer: 540 \\text{ cm}^2", "540"),
    ("Answer: 540 \\mathrm{m}", "540"),
    ("Answer: 540 dollars", "540"),
    ("Answer: \\$540", "540"),
    ("Answer: 540\\%", "540"),
    ("Answer: x = 540", "540"),
    ("Answer: $n=540$", "540"),
    ("Answer: m+n = 41", "41"),
    ("Answer: 540.0", "540"),
    ("Answer: 540.00", "540"),
    ("Answer: 2^3+1", "9"),
    ("Answer: 2^{10}", "1024"),
    ("Answer: \\frac{18}{2}", "9"),
    ("Answer: \\dfrac{27}{3}", "9"),
    ("Answer: \\tfrac{36}{4}", "9"),
    ("Answer: 3 \\times 3", "9"),
    ("Answer: 3 \\cdot 3", "9"),
    ("Answer: 3×3", "9"),
    ("Answer: \\sqrt{81}", "9"),
    ("Answer: \\sqrt[3]{729}", "9"),
    ("Answer: \\left(1+2\\right)^2", "9"),
    ("Answer: \\frac{\\frac{36}{2}}{2}", "9"),
    ("Answer: 2.5 \\times 4", "10"),
    ("Answer: \\sqrt{2}\\cdot\\sqrt{8}", "4"),
    ("Answer: -540", "-540"),
    ("Answer: −540", "-540"),
    ("Answer: $-\\frac{1080}{2}$", "-540"),
    ("Answer: The final answer is $\\boxed{540}$. I hope it is correct.", "540"),
    ("Answer: The final answer is 540.", "540"),
    ("Answer: There are 540 ways.", "540"),
    ("Answer:\n540", "540"),
    ("**Answer:**\n\n$540$", "540"),
    ("Answer: 540\r", "540"),
    ("Answer: 540\n\n", "540"),
    ("Answer: 0", "0"),
    # forms the field accepts (issue 25): Minerva's ending, \approx, an unbraced box, MATH's
    # thousands separator with a space
    ("Final Answer: The final answer is $540$. I hope it is correct.", "540"),
    ("Final Answer: The final answer is 540. I hope it is correct.", "540"),
    ("Answer: $x\\approx 540$", "540"),
    ("Answer: x ≈ 540", "540"),
    ("Answer: \\boxed 540", "540"),
    ("So it is $\\boxed 540$.", "540"),
    ("Answer: $32,\\! 349$", "32349"),
    ("Answer: 11,\\! 111,\\! 111,\\! 100", "11111111100"),
]


@pytest.mark.parametrize(("final", "truth"), CORRECT)
def test_equivalent_forms_are_correct(final: str, truth: str) -> None:
    result = score(respond(final), truth)
    assert result == Score(1.0, True, str(int(truth)))


# --- wrong forms ----------------------------------------------------------------------------

WRONG = [
    # hedges: several candidate answers
    ("Answer: 540 or 541", "540"),
    ("Answer: 540, 541", "540"),
    ("Answer: 540 and 541", "540"),
    ("Answer: $540$ or $541$", "540"),
    ("Answer: \\boxed{540} \\boxed{541}", "540"),
    ("Answer: \\pm 540", "540"),
    ("Answer: ±540", "540"),
    ("Answer: +-540", "-540"),
    ("Answer: +/- 540", "540"),
    ("Answer: x = 540 or x = 541", "540"),
    ("Answer: [540, 541]", "540"),
    ("Answer: 540 or so", "540"),
    # truncated
    ("Answer:", "540"),
    ("Answer:   ", "540"),
    ("Answer: \\boxed{54", "540"),
    ("so the total number of tiles is 54", "540"),
    ("we conclude that the count is $\\boxed{54", "540"),
    # missing
    ("", "540"),
    ("I am not sure how to finish this problem.", "540"),
    # non-integers and values that are not the integer
    ("Answer: 540.5", "540"),
    ("Answer: 1/2", "0"),
    ("Answer: \\frac{1}{2}", "0"),
    ("Answer: 0.5", "0"),
    ("Answer: \\sqrt{2}", "1"),
    ("Answer: 5\\pi", "5"),
    ("Answer: 5 pi", "5"),
    ("Answer: 5!", "5"),
    ("Answer: 540 thousand", "540"),
    ("Answer: 540 \\approx 541", "540"),
    ("Answer: It is not 540", "540"),
    ("Answer: at least 540", "540"),
    ("Answer: approximately 540", "540"),
    # wrong numbers
    ("Answer: 541", "540"),
    ("Answer: -540", "540"),
    ("Answer: 540541", "540"),
    ("Answer: 54", "540"),
    # garbage
    ("Answer: five hundred forty", "540"),
    ("Answer: $Answer", "540"),
    ("Answer: }}{{540", "540"),
    ("Answer: \\frac{540}", "540"),
    # mixed numbers are numbers, not products: 2 1/2 is 5/2 (issue 25: it scored as 1)
    ("Answer: $2\\frac{1}{2}$", "1"),
    ("Answer: $3\\frac{2}{3}$", "2"),
    ("Answer: $-1\\frac{1}{2}$", "-1"),
    ("Final Answer: The final answer is $541$. I hope it is correct.", "540"),
    ("Answer: $x\\approx 541$", "540"),
    ("Answer: \\approx 540", "540"),  # "about 540", like "approximately 540"
    ("Answer: 540, 000", "540000"),  # ", " lists; it is no thousands separator
]


@pytest.mark.parametrize(("final", "truth"), WRONG)
def test_wrong_forms_score_minus_one(final: str, truth: str) -> None:
    result = score(respond(final), truth)
    assert result.score == -1.0
    assert result.acc is False


def test_score_values_are_plus_and_minus_one() -> None:
    good, bad = score("Answer: 7", "7"), score("Answer: 8", "7")
    assert (good.score, good.acc) == (1.0, True)
    assert (bad.score, bad.acc) == (-1.0, False)
    assert isinstance(good.score, float) and isinstance(bad.score, float)


# --- ground-truth normalisation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("final", "truth"),
    [
        ("Answer: 23", "023"),
        ("Answer: 023", "23"),
        ("Answer: 23", " 23 "),
        ("Answer: 23", "0023"),
        ("Answer: -7", "-7"),
        ("Answer: -0", "0"),
        ("Answer: 1000", "1,000"),
    ],
)
def test_ground_truth_is_normalised(final: str, truth: str) -> None:
    assert score(respond(final), truth).acc


def test_huge_integers_are_compared_exactly() -> None:
    n = 10**39 + 1  # 40 digits: a float comparison could not tell these apart
    assert score(f"Answer: {n}", str(n)).acc
    assert not score(f"Answer: {n}", str(n - 1)).acc
    assert not score(f"Answer: {n - 1}", str(n)).acc
    assert not score(f"Answer: {float(n)}", str(n)).acc  # float text ("1e+39") is refused


def test_integer_length_cap() -> None:
    at_cap = "9" * 1000
    assert score(f"Answer: {at_cap}", at_cap).acc
    over_cap = "9" * 1001
    assert not score(f"Answer: {over_cap}", over_cap).acc
    assert normalize_integer("1" + "0" * 5000) is None  # past int()'s 4300-digit limit


# --- ground truths that are not integers: Math-Verify's equivalence -----------------------------

NON_INTEGER = [
    # (answer line, ground truth, equivalent): one row per kind the issue lists, both ways
    ("Answer: \\frac{1}{2}", "\\frac{1}{2}", True),
    ("Answer: 1/2", "0.5", True),
    ("Answer: 0.5", "\\frac{1}{2}", True),
    ("Answer: 0.25", "\\frac{1}{2}", False),
    ("Answer: $\\dfrac{1}{3}$", "\\frac13", True),
    ("Answer: $\\frac{1}{4}$", "\\frac13", False),
    ("Answer: .4", "0.4", True),
    ("Answer: .04", "0.4", False),
    ("Answer: 1,000.99", "1000.99", True),
    ("Answer: \\$1,000.99", "1000.99", True),
    ("Answer: 1,000.9", "1000.99", False),
    ("Answer: $\\frac{1}{3}\\text{ meters}$", "\\frac{1}{3}", True),
    ("Answer: $2.5\\text{ cm}$", "25", False),
    ("Answer: $k = \\frac{1}{3}$", "\\frac{1}{3}", True),
    ("Answer: $k = \\frac{1}{3}$", "\\frac{1}{2}", False),
    ("Answer: $2\\frac{1}{2}$", "\\frac{5}{2}", True),  # a mixed number
    ("Answer: $-\\frac{1}{2}$", "-0.5", True),
    ("Answer: $\\frac{1}{2}$", "-0.5", False),
    ("Answer: $\\sqrt{117}$", "3\\sqrt{13}", True),
    ("Answer: $\\frac{1}{2}$ or $\\frac{1}{3}$", "\\frac12", False),  # a hedge
    ("Answer: \\boxed{\\frac{1}{2}", "\\frac12", False),  # truncated: braces do not balance
    ("Answer: 0.333", "\\frac{1}{3}", False),  # a rounding
]


# Decimal commas, read as Math-Verify reads them, only against a number with a decimal point:
# MATH writes lists so (MATH-500's "-2,1" is the two answers -2 and 1).
NON_INTEGER += [
    ("Answer: 1000,99", "1000.99", True),
    ("Answer: 1.22", "1,22", True),
    ("Answer: 0,111", "0.111", True),  # a grouped number does not start with 0
    ("Answer: 1,220", "1.22", False),  # digits grouped by threes: 1220
    ("Answer: 1,23", "1.22", False),
    ("Answer: $-2,1$", "-2,1", True),  # a list, compared as one
    ("Answer: $1, -2$", "-2,1", True),
]


@pytest.mark.parametrize(("final", "truth", "equivalent"), NON_INTEGER)
def test_non_integer_ground_truth_is_judged_by_math_verify(
    final: str, truth: str, equivalent: bool
) -> None:
    assert score(respond(final), truth).acc is equivalent


def test_ground_truth_math_verify_cannot_read_is_matched_verbatim() -> None:
    assert score("Answer: \\text{Evelyn}", "\\text{Evelyn}").acc
    assert score("Answer: (A)", " (A) ").acc
    assert not score("Answer: (B)", "(A)").acc


SOLUTION = (
    "In order for $N$ to be divisible by 12, $N$ must be divisible by $4$ and $3$. The smallest "
    "possible $14{,}9AB$ divisible by 4 is $14{,}912.$ However, our next possibility, $14{,}916,$ "
    "is a multiple of $3,$ since $1 + 4 + 9 + 1 + 6 = 21.$ Therefore, $\\boxed{14{,}916}$ is our "
    "answer."
)
MINERVA_SOLUTION = (
    "The overall loss is $100 \\% - 72 \\%=28 \\%$. Final Answer: The final answer is $28 \\%$. "
    "I hope it is correct. Note: The solution provided is incorrect. The correct approach is:"
)


@pytest.mark.parametrize(
    "response",
    [
        "So she needs 2\\frac12 cups. I hope it is correct.",
        "Final Answer: She needs 2 1/2 cups.",
        "Final Answer: She needs $2\\frac{1}{2}$ cups of flour.",
        "Final Answer: The final answer is $2\\frac{1}{2}$. I hope it is correct.",
    ],
)
def test_mixed_number_in_prose_is_no_false_positive(response: str) -> None:
    for truth in ("1", "2"):  # the product 2 * 1/2, the whole part
        assert not score(response, truth, "auto").acc
    if "$" in response:
        assert score(response, "\\frac{5}{2}", "auto").acc


def test_ground_truth_given_as_a_worked_solution_is_read_for_its_answer() -> None:
    """MATH's ``solution`` field as the gold (as Math-Verify's own tests give it): its marked
    answer is the ground truth, an integer here, so the exact path judges it."""
    assert score("Final Answer: The final answer is $14 {, }916$.", SOLUTION, "auto").acc
    assert score("Answer: 14916", SOLUTION).acc
    assert not score("Answer: 14912", SOLUTION).acc
    assert not score("Answer: 12", SOLUTION).acc  # not the first number of the solution
    assert score("a total loss of $\\boxed{28\\%}$.", MINERVA_SOLUTION, "auto").acc
    assert not score("a total loss of $\\boxed{72\\%}$.", MINERVA_SOLUTION, "auto").acc
    gold = "So the ratio is $\\boxed{\\frac{1}{3}}$, as claimed."
    assert score("Answer: 0.5", gold.replace("3", "2")).acc  # non-integer: Math-Verify judges
    assert not score("Answer: 0.5", gold).acc


def test_equivalence_refuses_costly_and_cut_off_texts_without_calling_math_verify() -> None:
    for text in ("10^{10^{10}}", "9^9^9", "2^{1000000}", "100000!", "\\binom{100000}{5}"):
        assert not equivalent(text, "\\frac{1}{2}"), text
    assert not equivalent("\\frac{1}{2", "\\frac{1}{2}")
    assert not equivalent("1" * 300, "\\frac{1}{2}")  # longer than an answer may be
    assert equivalent("0.5", "\\frac{1}{2}")


def test_equivalence_is_named_for_reports() -> None:
    assert equivalence_name().startswith("exact integers, else math-verify 0.")


def test_non_string_arguments_do_not_raise() -> None:
    assert score("Answer: 5", 5).acc  # type: ignore[arg-type]
    assert score(None, "5") == Score(-1.0, False, None)  # type: ignore[arg-type]
    assert score(b"Answer: 5", "5").acc is False  # type: ignore[arg-type]


# --- extraction: Answer line precedence and the \boxed fallback ---------------------------------


def test_last_answer_line_wins() -> None:
    text = "Answer: 1\nWait, I made an error; recomputing.\nAnswer: 2\nDone."
    assert extract_answer(text) == "2"
    assert score(text, "2").acc and not score(text, "1").acc


def test_answer_line_wins_over_boxed() -> None:
    earlier_box = "First guess: $\\boxed{7}$.\nAnswer: 8"
    later_box = "Answer: 8\nAs a check, $\\boxed{7}$."
    for text in (earlier_box, later_box):
        assert score(text, "8").acc
        assert not score(text, "7").acc


def test_boxed_fallback_uses_the_last_box() -> None:
    text = "Try $\\boxed{3}$ first... no.\nSo the result is $\\boxed{4}$."
    assert extract_answer(text) == "4"
    assert score(text, "4") == Score(1.0, True, "4")
    assert not score(text, "3").acc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Thus $\\boxed{42}$.", "42"),
        ("Thus \\boxed {42}.", "42"),
        ("Thus \\fbox{42}.", "42"),
        ("Thus $\\boxed{\\frac{84}{2}}$.", "\\frac{84}{2}"),
        ("Thus $\\boxed{\\text{42 cm}}$.", "\\text{42 cm}"),
        ("Thus $\\boxed{42}$ and $\\fbox{43}$.", "43"),
        ("No box here.", None),
        ("Broken \\boxed{42", None),
        ("Empty \\boxed{}", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 42", "42"),
        ("Answer: $\\boxed{42}$", "$\\boxed{42}$"),
        ("**Final Answer:** 42 apples", "42 apples"),
        ("answer:\n\n  42  \n", "42"),
        ("Answer:", None),
        ("The answer is 42.", None),
        ("The answer is: 42", None),
        ("  - Answer: 42", "42"),
    ],
)
def test_extract_answer_line(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_answer_word_in_later_prose_does_not_hide_the_answer_line() -> None:
    text = "Answer: 12\nI hope this answer is right; the answer choices were unclear."
    assert score(text, "12").acc


def test_answer_line_found_in_a_long_response() -> None:
    body = "We keep computing the partial sums and the answer is not obvious yet.\n" * 300
    text = body + "Answer: 77\n" + "Double-checked the answer above.\n" * 5
    assert 20_000 < len(text) < 25_000
    assert score(text, "77").acc


# --- pred ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pred"),
    [
        ("Answer: 023", "23"),
        ("Answer: $\\boxed{540}$", "540"),
        ("Answer: 1,000 dollars", "1000"),
        ("Answer: \\frac{18}{2}", "9"),
        ("Answer: -0", "0"),
        ("So it is \\boxed{12}.", "12"),
        ("Answer: 540 or 541", "540 or 541"),
        ("Answer: 1/2", "1/2"),
        ("Answer:", None),
        ("No answer at all", None),
    ],
)
def test_pred(text: str, pred: str | None) -> None:
    assert score(text, "540").pred == pred


def test_pred_of_long_garbage_is_clipped() -> None:
    result = score("Answer: " + "x" * 5000, "1")
    assert result.pred is not None and len(result.pred) <= 200


# --- normalize_integer -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("540", 540),
        ("+540", 540),
        ("-0012", -12),
        ("\\boxed{1,000}", 1000),
        ("(-8)^{1/3}", -2),
        ("\\frac{2}{\\sqrt{3}-1}-\\sqrt{3}", 1),
        ("(\\sqrt{3}+1)(\\sqrt{3}-1)", 2),
        ("2^{-1}", None),
        ("\\frac{1}{0}", None),
        ("\\sqrt{-4}", None),
        ("9^9^9", None),
        ("", None),
        ("   ", None),
        ("1e3", None),
        ("0x10", None),
        ("1_000", None),
        ("$14 {, }916$", 14916),  # LaTeX's {,} separator with blanks (a Math-Verify case)
        ("14{ , }916", 14916),
        ("1{,}2", None),
        ("14 {, }91", None),
    ],
)
def test_normalize_integer(text: str, value: int | None) -> None:
    assert normalize_integer(text) == value


# --- adversarial input: bounded time, never raises ----------------------------------------------

ADVERSARIAL = {
    "megabyte of digits": "7" * 1_000_000,
    "answer with a megabyte of digits": "Answer: " + "7" * 1_000_000,
    "megabyte of answer lines": "Answer: 1\n" * 100_000,
    "megabyte of empty answer lines": "Answer:\n" * 130_000,
    "one long line of answer markers": "answer:" * 150_000,
    "answer words without colons": "the answer " * 100_000,
    "answer-like lines that never match": "so the answer: is near\n" * 50_000,
    "one line of Final Answer markers": "Final Answer: 1 " * 60_000,
    "one line of Minerva closings": "We get 1 and 2. I hope it is correct. " * 20_000,
    "unclosed display formulas": "Answer:\n\\[\n" * 100_000,
    "prose of numbers after the marker": "Final Answer: the " + "1 and the " * 50_000,
    "10k nested braces in a box": "\\boxed{" * 10_000 + "1" + "}" * 10_000,
    "10k open braces": "Answer: " + "{" * 10_000,
    "deep parentheses": "Answer: " + "(" * 5_000 + "1" + ")" * 5_000,
    "moderately deep parentheses": "Answer: " + "(" * 60 + "1" + ")" * 60,
    "tower of powers": "Answer: 9^9^9^9^9",
    "python tower": "Answer: 9**9**9",
    "latex tower": "Answer: 2^{2^{2^{2^{2^{2^{2}}}}}}",
    "huge exponent": "Answer: 10^{10^{10}}",
    "negative huge exponent": "Answer: 2^{-99999999}",
    "factorial bait": "Answer: 99999999!",
    "many fracs": "Answer: " + "\\frac{" * 2_000,
    "many sqrts": "Answer: " + "\\sqrt{" * 30 + "2" + "}" * 30,
    "surd soup": "Answer: \\frac{1}{\\sqrt{2}+\\sqrt{3}+\\sqrt{5}+\\sqrt{7}}",
    "surd power": "Answer: (\\sqrt{2}+\\sqrt{3}+\\sqrt{5}+\\sqrt{7})^{6}",
    "cube-root soup": "Answer: \\frac{1}{\\sqrt[3]{2}+\\sqrt[3]{3}+\\sqrt[3]{5}+\\sqrt[3]{7}}",
    "nested text macros": "Answer: " + "\\text{" * 3_000 + "5" + "}" * 3_000,
    "many boxes": "Answer: " + "\\boxed{1}" * 5_000,
    "unicode that lowercases longer": "İ" * 50_000 + "\nANSWER: 5",
    "null bytes": "\x00" * 100_000 + "\nAnswer: \x00",
    "many thousands separators": "Answer: " + "1," * 700 + "000",
    "int beyond the str limit": "Answer: " + "9" * 4_400,
    "escaped braces": "Answer: \\boxed{\\{" * 1_000,
    "blank run before a caret": "Answer: 1" + " " * 1_400 + "^",
    "blank run before an equals sign": "Answer: x" + " " * 1_400 + "= 5",
    "markdown bullets before answer": "- " * 100_000 + "answer:",
}


ADVERSARIAL_FOR_MATH_VERIFY = {
    "surd to a large power": "Answer: (1+\\sqrt{2})^{999}",
    "nested radicals": "Answer: " + "\\sqrt{2+" * 20 + "2" + "}" * 20,
    "long sum of fractions": "Answer: " + "+".join(f"\\frac{{1}}{{{k}}}" for k in range(2, 14)),
    "big binomial": "Answer: \\binom{99999}{49999}",
    "factorial of a big number": "Answer: 99999!",
    "power tower in braces": "Answer: 2^{3^{4^{5}}}",
    "huge exponent": "Answer: 7^{123456}",
    "deep parentheses": "Answer: " + "(" * 90 + "1" + ")" * 90,
    "matrix": "Answer: \\begin{pmatrix}" + "1 & " * 60 + "1\\end{pmatrix}",
}


@pytest.mark.parametrize(
    "text",
    [*ADVERSARIAL.values(), *ADVERSARIAL_FOR_MATH_VERIFY.values()],
    ids=[*ADVERSARIAL.keys(), *ADVERSARIAL_FOR_MATH_VERIFY.keys()],
)
def test_adversarial_input_is_bounded(text: str) -> None:
    # Math-Verify imported and warmed up first: a one-off cost (~1 CPU s, more on a slow machine)
    # that is not a judgement's, and that the first test in a worker would otherwise pay.
    equivalence._math_verify()
    # an integer, an integer past the cap, and a ground truth that Math-Verify judges
    for truth in ("1", "9" * 5_000, "\\frac{1}{2}"):
        for answer_format in ("dapo", "boxed", "minerva", "auto"):
            start = time.process_time()  # CPU seconds: a busy machine does not inflate them
            result = score(text, truth, answer_format)
            cpu_s = time.process_time() - start
            assert isinstance(result, Score)
            assert result.score in (1.0, -1.0)
            assert cpu_s < 2.0, f"{answer_format}: took {cpu_s:.2f} CPU s"


def test_megabyte_of_answer_lines_still_finds_the_last() -> None:
    text = "Answer: 1\n" * 100_000 + "Answer: 2"
    assert score(text, "2").acc


# --- properties ---------------------------------------------------------------------------------

WRAPPERS = [
    lambda n: f"Some reasoning.\nAnswer: {n}",
    lambda n: f"Some reasoning.\n**Answer:** ${n}$",
    lambda n: f"Some reasoning.\nAnswer: \\boxed{{{n}}}",
    lambda n: f"Some reasoning.\nAnswer: {n:,}",
    lambda n: f"Some reasoning.\nAnswer: {n}.",
    lambda n: f"Some reasoning.\nAnswer: x = {n}",
    lambda n: f"So the final result is $\\boxed{{{n}}}$.",
]

integers = st.integers(min_value=-(10**300), max_value=10**300)


@settings(max_examples=300, deadline=None)
@given(n=integers, wrap=st.sampled_from(WRAPPERS))
def test_wrapped_integer_is_correct_and_neighbour_is_not(
    n: int, wrap: Callable[[int], str]
) -> None:
    text = wrap(n)
    assert score(text, str(n)).acc
    assert not score(text, str(n + 1)).acc


@settings(max_examples=300, deadline=None)
@given(response=st.text(), truth=st.text())
def test_arbitrary_text_never_raises(response: str, truth: str) -> None:
    result = score(response, truth)
    assert isinstance(result, Score)
    assert result.score == (1.0 if result.acc else -1.0)


LATEX_TOKENS = [
    *"${}()[]^_-+/*,.=x",
    *("Answer:", "\n", " ", "0", "1", "2", "9", "99", "or"),
    *("\\frac", "\\dfrac", "\\sqrt", "\\boxed", "\\text", "\\cdot", "\\times", "\\pm"),
    *("\\left(", "\\right)", "\\circ", "\\,"),
]


@settings(max_examples=500, deadline=None)
@given(tokens=st.lists(st.sampled_from(LATEX_TOKENS), max_size=60), truth=integers)
def test_latex_soup_never_raises(tokens: list[str], truth: int) -> None:
    result = score("".join(tokens), str(truth))
    assert isinstance(result, Score)
    assert result.score == (1.0 if result.acc else -1.0)


# --- a regression: unbalanced braces before the Answer line (issue 25) ---------------------------

BRACE_RUNS = {
    "a run of open braces": "{" * 20_000 + "\nAnswer: 540",
    "open braces, no newline in the run, then blanks": "{" * 20_000 + " \n\n Answer: 540",
    "open boxes": "\\boxed{" * 5_000 + "\nAnswer: 540",
    "open text macros": "\\text{" * 5_000 + "\nAnswer: 540",
    "open braces on every line": "Let $S = \\{a_n, {\n" * 5_000 + "Answer: 540",
    "open fractions": "$\\frac{" * 5_000 + "\nAnswer: 540",
    "a mixed run": "{\\boxed{{\\frac{1}{" * 2_000 + "\n**Answer:** $540$",
}


@pytest.mark.parametrize("text", BRACE_RUNS.values(), ids=BRACE_RUNS.keys())
@pytest.mark.parametrize("answer_format", ["dapo", "auto"])
def test_answer_line_after_unbalanced_braces_is_read(text: str, answer_format: str) -> None:
    start = time.process_time()
    result = score(text, "540", answer_format)
    assert result == Score(1.0, True, "540")
    assert time.process_time() - start < 1.0  # CPU seconds (quadratic scans took minutes)


# --- the DAPO marker wherever it stands in its line, as verl's math_dapo reads it (issue 42) -----

MID_LINE = {
    "after a sentence": ("So we get it. Answer: 540", "540"),
    "after words on its line": ("the answer: 540", "540"),
    "a revision on a later line": ("...\nAnswer: 12\nWait, recheck. Answer: 13", "13"),
    "a revision on the same line": ("Answer: 12 wait, no. Answer: 13", "13"),
    "markdown around the colon": ("We find x. **Answer**: 13", "13"),
    "a brace flood on the answer's line": ("{" * 50_000 + "Answer: 540", "540"),
    "an open box on the answer's line": ("\\boxed{" * 5_000 + " Answer: 540", "540"),
}


@pytest.mark.parametrize(("text", "truth"), MID_LINE.values(), ids=MID_LINE.keys())
def test_dapo_reads_the_last_answer_marker_wherever_it_stands(text: str, truth: str) -> None:
    start = time.process_time()
    assert score(text, truth) == Score(1.0, True, truth)
    assert time.process_time() - start < 1.0  # CPU seconds: the walk stays linear
    wrong = str(int(truth) + 1)
    assert not score(text, wrong).acc


def test_a_mid_line_marker_is_the_dapo_formats_alone() -> None:
    """The other formats keep their rules: a box only, a Minerva sentence only, and auto's
    markers (an Answer line, "Final Answer:" anywhere, a box, a sentence)."""
    text = "So we get it. Answer: 540"
    assert extract_answer(text, "boxed") is None and extract_answer(text, "minerva") is None
    assert not score(text, "540", "auto").acc
    assert score("So we get it. Final Answer: 540", "540", "auto").acc


# --- answer formats ---------------------------------------------------------------------------

FORMATS = [
    # response, answer_format, extracted
    ("Answer: 3\nCheck: $\\boxed{5}$.", "dapo", "3"),  # the Answer line wins over a box
    ("Answer: 3\nCheck: $\\boxed{5}$.", "boxed", "5"),
    ("Answer: 3\nCheck: $\\boxed{5}$.", "auto", "5"),  # the marker that comes last
    ("Answer: 3\nCheck: $\\boxed{5}$.", "minerva", None),
    ("First $\\boxed{3}$.\nAnswer: 5", "auto", "5"),
    ("Final Answer: The final answer is $100$. I hope it is correct.", "dapo", "$100$"),
    ("Final Answer: The final answer is $100$. I hope it is correct.", "minerva", "$100$"),
    ("Final Answer: The final answer is $100$. I hope it is correct.", "auto", "$100$"),
    ("Final Answer: The final answer is $100$. I hope it is correct.", "boxed", None),
    ("So the final answer is $\\frac{1}{2}$.", "minerva", "$\\frac{1}{2}$"),
    ("So the final answer is $\\frac{1}{2}$.", "dapo", None),  # prose, no Answer line
    ("The final answer is 7.78. I hope it is correct. <|im_start|>user", "minerva", "7.78"),
    ("Final Answer: The final answer is $\\boxed{5}$. I hope it is correct.", "auto", "5"),
    ("Thus $\\boxed 4$.", "boxed", "4"),
    ("0.5", "auto", "0.5"),  # a response of one short line is its own answer
    ("The answer: $9$", "auto", "$9$"),
    ("0.5", "dapo", None),
    ("0.5\nand more lines", "auto", None),
    ("Answer:", "auto", None),  # truncated
    # A display formula after the marker is read whole, across its lines.
    ("Working.\nAnswer:\n\\[\n9\n\\]", "dapo", "\\[ 9 \\]"),
    ("Working.\nAnswer: $$\n9\n$$\nDone.", "dapo", "$$ 9 $$"),
    ("Working.\nAnswer:\n\\[\n9", "dapo", "\\["),  # never closed: the line as it is
    ("Working.\nAnswer:\n\\[\n5\n\\] or \\[ 6 \\]\nMore.", "dapo", "\\[ 5 \\] or \\[ 6 \\]"),
    ("Answer: $$5$$ or $$6$$\nMore.", "dapo", "$$5$$ or $$6$$"),  # a hedge stays one
    ("Answer \\[ \n 9 \n \\]", "auto", "\\[ 9 \\]"),  # Math-Verify's cases, labelled
    ("Answer $$ \n 9 \n $$", "auto", "$$ 9 $$"),
    ("Answer $ \n 9 \n $", "auto", None),  # inline math does not span lines
    ("Answer \\( \n 9 \n \\)", "auto", None),
    # "Final Answer:" in mid-line (auto only); prose there is the one number it names.
    (
        "So $5 \\times 6 \\times 4 = 120$. Final Answer: The volume is 120. I hope it is correct.",
        "auto",
        "120",
    ),
    ("Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", "auto", "3"),
    ("It is 19. Final Answer: The domain of $f(x)$ has 19 points. <|im_start|>user", "auto", "19"),
    ("Final Answer: The area is $\\frac{1}{2}$ square units.", "auto", "$\\frac{1}{2}$"),
    ("Final Answer: either 3 or 4 hours ago.", "auto", "either 3 or 4 hours ago."),  # hedge
    ("So $x = 2$. Final Answer: 7", "dapo", "7"),  # DAPO's marker anywhere in a line
    ("So $x = 2$. Final Answer: 7", "minerva", None),
    # The sentence Minerva's "I hope it is correct" closes, when nothing marks the answer.
    (
        "The divisors are 1, 2, 3. Therefore, there are 12 distinct sequences that meet the three "
        "given conditions. I hope it is correct. <|im_start|>user",
        "auto",
        "12",
    ),
    ("We get 7.5 and 2. I hope it is correct.", "auto", "We get 7.5 and 2"),  # two numbers
    # A mixed number in prose is not its whole part.
    ("So she needs 2\\frac12 cups. I hope it is correct.", "auto", "So she needs 2\\frac12 cups"),
    ("Final Answer: She needs 2 1/2 cups.", "auto", "She needs 2 1/2 cups."),
    ("Final Answer: She needs $2\\frac{1}{2}$ cups.", "auto", "$2\\frac{1}{2}$"),
    ("Answer: 4\nThe number 3 is odd. I hope it is correct.", "auto", "4"),  # a marker first
]


@pytest.mark.parametrize(("response", "answer_format", "extracted"), FORMATS)
def test_answer_formats(response: str, answer_format: str, extracted: str | None) -> None:
    assert extract_answer(response, answer_format) == extracted  # type: ignore[arg-type]


def test_unknown_answer_format() -> None:
    with pytest.raises(ValueError, match="unknown answer format"):
        extract_answer("Answer: 5", "latex")  # type: ignore[arg-type]
    assert score("Answer: 5", "5", "latex") == Score(-1.0, False, None)  # type: ignore[arg-type]


def test_last_line_fast_path_agrees_with_the_general_path() -> None:
    for final in ("Answer: 540", "Answer: $\\boxed{540}$", "Answer: 540 or 541", "Answer:"):
        for answer_format in ("dapo", "auto"):
            text = REASONING + final
            raw = extract_answer(text, answer_format)  # type: ignore[arg-type]
            assert score(text, "540", answer_format).acc == (raw is not None and "or" not in raw)


@settings(max_examples=300, deadline=None)
@given(
    content=st.text(alphabet="0123456789 *_}{$\\.-/xAnswerNSWER:", max_size=16),
    answer_format=st.sampled_from(["dapo", "auto", "boxed", "minerva"]),
)
def test_the_last_line_shortcut_reads_as_the_formats_reader(content: str, answer_format: str):
    """``extract_answer`` reads a last line that starts with ``Answer:`` without walking the text;
    whatever follows the colon, it must read what the format's own reader reads."""
    from dapo_core import extraction

    text = REASONING + "Answer:" + content
    reader = extraction._READERS[answer_format]
    assert extract_answer(text, answer_format) == (reader(text) or None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "response, gold",
    [
        ("Work.\nAnswer: **\\frac{1}{2}**", "\\frac{1}{2}"),
        ("Work.\n**Answer: 0.5**", "\\frac12"),
        ("Work.\nAnswer: __3/4__", "\\frac34"),
    ],
)
def test_an_answer_in_bold_is_read_without_its_emphasis(response: str, gold: str) -> None:
    """The markdown around a non-integer answer used to stay on it (``**\\frac{1}{2}**``, or
    ``0.5**``) and fail the equivalence check: a correct answer scored -1."""
    result = score(response, gold)
    assert result.acc and "*" not in result.pred and "_" not in result.pred


# --- hand-labelled cases of every kind (tests/fixtures/equivalence.jsonl) -------------------------

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "equivalence.jsonl"
LABELLED = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize(
    "case", LABELLED, ids=[f"{i}-{c['kind']}-{c['format']}" for i, c in enumerate(LABELLED)]
)
def test_hand_labelled_equivalence(monkeypatch, case: dict) -> None:
    # The labels are under test here, not the deadline (its own tests are below): a generous one
    # keeps a starved xdist worker from turning a slow right answer into a wrong one.
    monkeypatch.setattr(equivalence, "_EQUIVALENCE_SECONDS", 30.0)
    monkeypatch.setattr(equivalence, "_EQUIVALENCE_WALL_SECONDS", 300.0)
    result = score(case["response"], case["gold"], case["format"])
    assert result.acc is case["equivalent"], case.get("note", "")


def test_hand_labelled_cases_cover_the_issue() -> None:
    kinds = {c["kind"] for c in LABELLED}
    assert {"minerva", "approx", "bare_box", "thousands_space", "mixed_number"} <= kinds
    assert {"fraction_decimal", "frac_spelling", "leading_dot", "thousands_decimal"} <= kinds
    assert {"unit", "assignment", "integer", "format"} <= kinds
    integer_golds = [c for c in LABELLED if normalize_integer(c["gold"]) is not None]
    marked = [c for c in integer_golds if extract_answer(c["response"], c["format"]) is not None]
    assert len(marked) >= 40
    agree = [score(c["response"], c["gold"], c["format"]).acc is c["equivalent"] for c in marked]
    assert all(agree)  # integer ground truths: 100% where the response marks its answer


# --- anywhere: threads, spawned workers, a deadline that works off the main thread --------------

THREAD_CASES = [
    ("Answer: 0.5", "\\frac{1}{2}", True),
    ("Answer: $\\dfrac{2}{6}$", "\\frac13", True),
    ("Answer: 0.25", "\\frac{1}{2}", False),
    ("Answer: 540", "540", True),
]


def test_scoring_off_the_main_thread() -> None:
    results: list[object] = []

    def work() -> None:
        try:
            results.extend(score(r, g).acc for r, g, _ in THREAD_CASES)
        except BaseException as e:  # reported below
            results.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert results == [expected for _, _, expected in THREAD_CASES]


def test_scoring_in_a_spawned_worker() -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        scores = pool.starmap(score, [(r, g) for r, g, _ in THREAD_CASES])
    assert [s.acc for s in scores] == [expected for _, _, expected in THREAD_CASES]


def _stubborn(*args: object, **kwargs: object) -> bool:
    """A judgement that never ends and swallows every Exception, as library loops do."""
    while True:
        with contextlib.suppress(Exception):  # what the deadline must get through
            sum(range(1000))


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "other thread"])
def test_a_judgement_past_its_deadline_is_not_equivalent(
    monkeypatch, caplog, in_thread: bool
) -> None:
    import math_verify

    caplog.set_level(logging.DEBUG, logger="dapo_core.equivalence")

    equivalence._math_verify()  # loaded and warmed up first, with the real verify
    monkeypatch.setattr(equivalence, "_EQUIVALENCE_SECONDS", 0.2)
    monkeypatch.setattr(equivalence, "_EQUIVALENCE_WALL_SECONDS", 0.5)
    monkeypatch.setattr(math_verify, "verify", _stubborn)
    gold = f"\\frac{{1}}{{{7 + in_thread}}}"  # a pair no other test has cached
    outcome: list[object] = []

    def work() -> None:
        try:
            start = time.process_time()  # the stubborn judge spins: CPU time bounds it too
            outcome.append(score("Answer: 0.125", gold).acc)
            outcome.append(time.process_time() - start)
            time.sleep(0.4)  # a withdrawn deadline must not fire later
            outcome.append(score("Answer: 7", "7").acc)
        except BaseException as e:  # reported below
            outcome.append(e)

    if in_thread:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join(30)
    else:
        work()
    assert outcome[0] is False and outcome[1] < 3.0 and outcome[2] is True, outcome
    said = [r.getMessage() for r in caplog.records if "ran past its deadline" in r.getMessage()]
    assert len(said) == 1 and gold in said[0], caplog.text
    monkeypatch.undo()  # the real verify again: a cut-short verdict was not cached
    assert score("Answer: 0.125", gold).acc is (gold == "\\frac{1}{8}")


def test_the_deadline_counts_cpu_time_not_waiting(monkeypatch) -> None:
    """A judgement that waits (a busy machine: the thread is not running) is not cut short."""
    import math_verify

    from dapo_core.deadline import thread_cpu_clock

    if thread_cpu_clock(threading.get_ident()) is None:
        pytest.skip("no per-thread CPU clock here: the budget is wall-clock time")

    def patient(*args: object, **kwargs: object) -> bool:
        time.sleep(0.5)
        return True

    equivalence._math_verify()  # loaded and warmed up first, with the real verify
    monkeypatch.setattr(equivalence, "_EQUIVALENCE_SECONDS", 0.2)
    monkeypatch.setattr(math_verify, "verify", patient)
    assert score("Answer: 0.0625", "\\frac{1}{16}").acc


@pytest.mark.parametrize("truth", list(ADVERSARIAL.values())[:8], ids=list(ADVERSARIAL)[:8])
def test_adversarial_ground_truth_is_bounded(truth: str) -> None:
    """A ground truth is read for a marked answer too (a worked solution): bounded the same."""
    start = time.process_time()
    result = score("Answer: 1", truth, "auto")
    assert isinstance(result, Score) and time.process_time() - start < 2.0  # CPU seconds
