"""Tests for dapo_core.records: one input record -> a Row or the reason it is malformed."""

import pytest

from dapo_core.curation import apply_template
from dapo_core.problem import Problem
from dapo_core.records import MALFORMED, Malformed, Row, parse_record


def dapo_row(content, truth="7", index=3):
    return {
        "prompt": [{"role": "system", "content": "x"}, {"role": "user", "content": content}],
        "reward_model": {"ground_truth": truth, "style": "rule"},
        "extra_info": {"index": index},
    }


def test_dapo_schema_strips_the_template_and_keeps_the_index():
    row = parse_record(dapo_row(apply_template("Find $x$.")))
    assert row == Row("Find $x$.", "7", "3")


def test_plain_schema_and_its_fallbacks():
    assert parse_record({"problem": " Find $y$. ", "answer": 12, "id": 5}) == Row(
        "Find $y$.", "12", "5"
    )
    assert parse_record({"question": "Q?", "label": "4"}) == Row("Q?", "4", None)
    assert parse_record({"question": "Q?", "ground_truth": "-4", "unique_id": "u"}) == Row(
        "Q?", "-4", "u"
    )
    # the AIME files: the raw problem in extra_info wins over the templated prompt
    rec = dapo_row(apply_template("templated"), index=0) | {"extra_info": {"raw_problem": "raw"}}
    assert parse_record(rec).problem == "raw"
    # a messages list serialised as JSON text, and a bare string prompt
    text = '[{"role": "user", "content": "Add 1 and 2."}]'
    assert parse_record({"prompt": text, "answer": "3"}).problem == "Add 1 and 2."
    assert parse_record({"prompt": apply_template("P"), "answer": "3"}).problem == "P"


def test_a_problem_keeps_its_own_id_and_prompt():
    p = Problem("arith-000001", "Compute 1 + 2.", "3", "Compute 1 + 2.", "synthetic:arith")
    assert parse_record(p) == Row(p.problem, "3", p.id, prompt=p.prompt, fixed_id=p.id)


def test_integer_valued_floats_are_integers_and_others_are_malformed():
    assert parse_record({"problem": "P", "answer": 12.0}).answer == "12"
    bad = parse_record({"problem": "P", "answer": 12.5})
    assert bad.reason == "answer_wrong_type" and "12.5" in bad.detail


@pytest.mark.parametrize(
    "rec, reason",
    [
        (["not", "a", "dict"], "not_a_record"),
        ({"answer": "1"}, "missing_problem"),
        ({"prompt": None, "answer": "1"}, "missing_problem"),
        ({"problem": apply_template(""), "answer": "1"}, "empty_problem"),
        ({"problem": 5, "answer": "1"}, "problem_wrong_type"),
        ({"prompt": [], "answer": "1"}, "bad_prompt_structure"),
        ({"prompt": [{"role": "system", "content": "x"}], "answer": "1"}, "bad_prompt_structure"),
        ({"prompt": [{"role": "user", "content": 3}], "answer": "1"}, "bad_prompt_structure"),
        ({"problem": "P"}, "missing_answer"),
        ({"problem": "P", "answer": "  "}, "empty_answer"),
        ({"problem": "P", "answer": True}, "answer_wrong_type"),
        ({"problem": "P", "answer": ["1"]}, "answer_wrong_type"),
        ({"problem": "P", "reward_model": "7"}, "answer_wrong_type"),
    ],
)
def test_malformed_records_say_why_and_never_raise(rec, reason):
    out = parse_record(rec)
    assert isinstance(out, Malformed) and out.reason == reason and out.reason in MALFORMED
    assert out.detail


def test_a_malformed_marker_passes_through():
    marker = Malformed("invalid_json", "f.jsonl line 3: ...")
    assert parse_record(marker) is marker
