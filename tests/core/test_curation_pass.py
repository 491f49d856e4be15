"""Tests for dapo_core.curation_pass: answers, ids, the pass's accounting, the validation split.

Expected values are computed by hand (the sha1 digests are written out in the comments).
"""

import hashlib

import pytest

from dapo_core.curation import apply_template
from dapo_core.curation_pass import (
    Answer,
    asks_rounding,
    curate_records,
    normalize_answer,
    problem_id,
    split_validation,
    with_instruction,
)
from dapo_core.errors import PipelineError
from dapo_core.problem import Problem


def test_terminating_decimals_are_exact_fractions_unless_rounding_was_asked():
    three_quarters = normalize_answer("0.75")
    assert three_quarters is not None and three_quarters.form == "m/n"
    assert three_quarters.value == "7"  # 3/4 in lowest terms: m + n = 7
    assert normalize_answer("3.21", rounded=True) is None
    assert normalize_answer("-1.5").value == "5"  # -3/2: the sign is in the stated form
    assert asks_rounding("Round your answer to the nearest hundredth.")
    assert asks_rounding("Express it to two decimal places.")
    assert not asks_rounding("What is 3/4 as a decimal?")


def test_normalize_answer():
    assert normalize_answer("023") == Answer("23", "integer", "")
    assert normalize_answer("-7") == Answer("-7", "integer", "")
    assert normalize_answer(r"\boxed{5}") == Answer("5", "integer", "")  # an integer in disguise
    half = normalize_answer(r"\frac{3}{4}")
    assert (half.value, half.form) == ("7", "m/n") and "m+n" in half.instruction
    assert normalize_answer("(1, 2)") is None  # no integer form


def test_with_instruction():
    assert with_instruction("Find x.", Answer("5", "integer", "")) == "Find x."
    assert with_instruction("Find x.", Answer("7", "m/n", "Find $m+n$.")) == "Find x. Find $m+n$."


def test_problem_id_is_the_sha1_of_the_whitespace_free_text():
    # sha1("Whatis1+1?") = 41480bb5b400c6e4...
    assert problem_id("What is 1 + 1?") == "41480bb5b400c6e4"
    assert problem_id("What  is\n1+1?") == problem_id("What is 1 + 1?")


def test_split_validation_takes_the_smallest_hashes():
    # sha1: a 86f7e437..., b e9d71f5e..., c 84a51684..., d 3c363836... -> order d, c, a, b
    rows = [{"id": i} for i in "abcd"]
    train, val = split_validation(rows, 2)
    assert [r["id"] for r in val] == ["d", "c"]  # hash order
    assert [r["id"] for r in train] == ["a", "b"]  # input order
    assert split_validation(rows, 0) == (rows, [])
    # the same rule for any item, given its id; independent of the input order
    problems = [Problem(i, i, "1", i, "s") for i in "dbca"]
    p_train, p_val = split_validation(problems, 2, id_of=lambda p: p.id)
    assert [p.id for p in p_val] == ["d", "c"] and [p.id for p in p_train] == ["b", "a"]
    with pytest.raises(PipelineError, match="data.val_size"):
        split_validation(rows, 4)


def test_curate_records_accounts_for_every_row():
    records = [
        {"problem": "Find $a$.", "answer": "023"},  # 0 kept, answer 23
        {"problem": "Find  $a$.", "answer": "23"},  # 1 a copy that agrees: duplicate
        {"problem": "Find $b$.", "answer": "1"},  # 2 and 3: copies that disagree
        {"problem": "Find $b$.", "answer": "2"},
        {"problem": "Find $c$.", "answer": "(1, 2)"},  # 4 no integer form
        {"problem": "Find $d$.", "answer": r"\frac{1}{2}"},  # 5 kept, m/n -> 3
        {"answer": "5"},  # 6 malformed
        {"problem": "Compute the value of the shared sentence here now.", "answer": "9"},  # 7
    ]
    evals = {"ev": [Problem("e1", records[7]["problem"], "9", "", "ev")]}
    out = curate_records(records, "src", evals, ngram=3, threshold=0.5)
    assert out.input_rows == 8
    assert dict(out.dropped) == {
        "missing_problem": 1,
        "duplicate": 1,
        "conflicting_answers": 2,
        "no_integer_form": 1,
        "contaminated": 1,
    }
    assert len(out.kept) + sum(out.dropped.values()) == out.input_rows
    assert out.conflicting_problems == 1 and dict(out.converted) == {"m/n": 1}
    assert [(m["source_row"], m["eval"]) for m in out.matches] == [(7, "ev/e1")]
    first, half = out.kept
    assert (first["answer"], first["copies"], first["source_row"]) == ("23", 2, 0)
    assert first["id"] == hashlib.sha1(b"Find$a$.").hexdigest()[:16]
    assert first["prompt"] == apply_template("Find $a$.") and first["source"] == "src"
    assert (half["answer"], half["answer_form"], half["original_answer"]) == (
        "3",
        "m/n",
        r"\frac{1}{2}",
    )
    assert half["problem"].startswith("Find $d$. ")
    # rejected rows: every drop except plain duplicates, in the order the pass meets them
    assert [(r["source_row"], r["reason"]) for r in out.rejected] == [
        (6, "missing_problem"),
        (2, "conflicting_answers"),
        (3, "conflicting_answers"),
        (4, "no_integer_form"),
        (7, "contaminated"),
    ]
