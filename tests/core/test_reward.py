"""Tests for dapo_core.reward: the rule-based outcome reward of DAPO (Eq. 7)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.answers import parse_integer as normalize_integer
from dapo_core.reward import Score, extract_answer, score

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
    ("the answer: 540", "540"),  # not at the start of a line: not an Answer line
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


def test_non_integer_ground_truth_only_matches_verbatim() -> None:
    assert score("Answer: \\frac{1}{2}", "\\frac{1}{2}").acc
    assert not score("Answer: 0.5", "\\frac{1}{2}").acc


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


@pytest.mark.parametrize("text", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_adversarial_input_is_bounded(text: str) -> None:
    for truth in ("1", "9" * 5_000):
        start = time.perf_counter()
        result = score(text, truth)
        elapsed = time.perf_counter() - start
        assert isinstance(result, Score)
        assert result.score in (1.0, -1.0)
        assert elapsed < 2.0, f"took {elapsed:.2f} s"


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
