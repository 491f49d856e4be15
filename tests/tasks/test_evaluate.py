"""Evaluation metrics from samples, determinism, a model that emits garbage, answer formats, and
published benchmarks evaluated as published (../shared/data, skipped when absent)."""

import json
import typing
from pathlib import Path

import pytest

from dapo_core.answers import canonical_integer
from dapo_core.config import EvalConfig
from dapo_core.config_loader import from_dict, resolve
from dapo_core.problem import Problem
from dapo_core.reward import ANSWER_FORMATS, equivalence_name
from tasks.evaluation.evaluate import evaluate_policy, summarize
from tasks.models.loading import load_policy
from tasks.models.resolve import resolve_model_path
from tasks.rollout.generators import HFGenerator, Rollouts

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"  # ../shared/data
PUBLISHED = {
    # name: (file, problems as published)
    "aime-2024": (DATA / "aime-2024" / "aime-2024.parquet", 30),
    "aime-2024-qwen": (DATA / "aime-2024" / "test.jsonl", 30),
    "aime-2025": (DATA / "aime-2025" / "test.jsonl", 30),
    "math-500": (DATA / "math-500" / "test.jsonl", 500),
}


def _cfg(tiny_cfg, n, *overrides):
    return resolve(
        tiny_cfg.to_dict(),
        overrides=[f"eval.n_samples={n}", "eval.pass_ks=[1,2,4,32]", *overrides],
    )


def _problems():
    return [Problem("a", "1+1", "2", "1+1", "t"), Problem("b", "2+2", "004", "2+2", "t")]


def test_summarize_hand_computed(tiny_cfg):
    cfg = _cfg(tiny_cfg, 4)
    texts = [
        "Answer: 2",
        "Answer: 3",
        "no idea",
        "Answer: 2",  # a: 2/4 correct, majority 2
        "Answer: 5",
        "Answer: 5",
        "Answer: 4",
        "",  # b: 1/4 correct (gt 004), majority 5
    ]
    r = summarize(_problems(), texts, [3] * 8, [True] * 7 + [False], cfg)
    m = r.metrics
    assert m["eval/avg_at_k"] == 3 / 8
    assert m["eval/pass_at_1"] == 3 / 8
    assert m["eval/pass_at_2"] == pytest.approx((1 - 1 / 6 + 1 - 3 / 6) / 2)  # 1-C(2,2)/C(4,2)
    assert "eval/pass_at_32" not in m  # n = 4 does not allow it
    assert m["eval/maj_at_k"] == 0.5
    assert m["eval/unparseable_frac"] == 2 / 8
    # every metric an evaluation logs is said by `dapo metrics` (maj@k, pass@k... were not),
    # and on the validation split too
    from dapo_core.metric_names import describe

    assert all(describe(name) and describe("val/" + name[5:]) for name in m), m
    assert m["eval/truncated_frac"] == 1 / 8
    assert m["eval/avg_at_k_ci_low"] <= 3 / 8 <= m["eval/avg_at_k_ci_high"]
    table = r.per_problem
    assert list(table.columns) == [
        "problem_id",
        "answer",
        "accuracy",
        "majority_answer",
        "majority_correct",
        "extracted",
        "mean_response_len",
        "truncated_frac",
    ]
    assert table["accuracy"].tolist() == [0.5, 0.25]
    assert table["majority_answer"].tolist() == ["2", "5"]
    assert table["majority_correct"].tolist() == [True, False]
    assert table["extracted"].tolist() == [
        "2 (2); 3 (1); no answer (1)",
        "5 (2); 4 (1); no answer (1)",
    ]
    assert [s["extracted"] for s in r.samples] == ["2", "5"]
    assert r.scoring == {
        "eval/answer_format": "dapo",
        "eval/equivalence": equivalence_name(),
    }


def test_majority_votes_by_value_not_text(tiny_cfg):
    """Hand-computed: problem a (gt 1/2) has 0.5, 1/2, \\dfrac{1}{2} (one value, 3 votes) against
    0.25 twice: by text 0.25 wins (2 votes to 1 each) and maj@k would be 0; by value the
    majority is 0.5 and correct. Problem b (gt 7) has 3, \\frac{6}{2}, 3.0 (one value, 3 votes)
    against 7 twice: by value 3 wins and is wrong. maj@k = 1/2; avg@k = (3/5 + 2/5) / 2."""
    cfg = _cfg(tiny_cfg, 5)
    problems = [Problem("a", "p", "\\frac{1}{2}", "p", "t"), Problem("b", "q", "7", "q", "t")]
    texts = [
        "Answer: 0.25",
        "Answer: 0.5",
        "Answer: 1/2",
        "Answer: 0.25",
        "Answer: $\\dfrac{1}{2}$",
    ]
    texts += ["Answer: 7", "Answer: 3", "Answer: \\frac{6}{2}", "Answer: 7", "Answer: 3.0"]
    r = summarize(problems, texts, [3] * 10, [True] * 10, cfg)
    assert r.metrics["eval/avg_at_k"] == 0.5
    assert r.metrics["eval/maj_at_k"] == 0.5
    assert r.per_problem["majority_answer"].tolist() == ["0.5", "3"]
    assert r.per_problem["majority_correct"].tolist() == [True, False]
    assert r.per_problem["extracted"].tolist()[1] == "3 (3); 7 (2)"  # integers shown canonical


class GarbageGenerator:
    """A model that emits nothing parseable."""

    def generate(self, prompts, n, temperature, top_p, max_new_tokens):
        k = len(prompts) * n
        return Rollouts(n, [[1]] * len(prompts), [[7, 7]] * k, [False] * k, ["%%##"] * k, 0)


def test_garbage_model_scores_zero_and_is_counted(tiny_cfg):
    from tasks.models.loading import load_policy

    _, tok = load_policy(resolve_model_path(tiny_cfg))
    r = evaluate_policy(GarbageGenerator(), tok, _problems(), _cfg(tiny_cfg, 4), progress=False)
    assert r.metrics["eval/avg_at_k"] == 0.0 and r.metrics["eval/maj_at_k"] == 0.0
    assert r.metrics["eval/unparseable_frac"] == 1.0


def test_the_progress_bar_leaves_no_blank_line_where_output_is_not_a_terminal(tiny_cfg, capfd):
    """The bar erases itself when done; where output is a file or a CI log it could not be
    drawn, and it left a blank line between the log lines."""
    from tasks.models.loading import load_policy

    _, tok = load_policy(resolve_model_path(tiny_cfg))
    capfd.readouterr()
    evaluate_policy(GarbageGenerator(), tok, _problems(), _cfg(tiny_cfg, 4), progress=True)
    assert capfd.readouterr().out == ""


def test_deterministic_for_a_seed(tiny_cfg):
    cfg = _cfg(tiny_cfg, 4)
    model, tok = load_policy(resolve_model_path(tiny_cfg))
    gen = HFGenerator(model, tok, cfg.rollout.max_prompt_len)
    from tasks.data.splits import eval_problems

    _, problems = eval_problems(cfg)
    a = evaluate_policy(gen, tok, problems[:6], cfg, progress=False)
    b = evaluate_policy(gen, tok, problems[:6], cfg, progress=False)
    assert a.metrics == b.metrics
    assert a.per_problem.equals(b.per_problem)
    assert [s["response"] for s in a.samples] == [s["response"] for s in b.samples]


def test_empty_eval_set_is_an_error(tiny_cfg):
    with pytest.raises(ValueError, match="empty"):
        evaluate_policy(GarbageGenerator(), None, [], _cfg(tiny_cfg, 2), progress=False)


@pytest.mark.parametrize("text", ["", "{}\n{}\n"], ids=["empty file", "rows without fields"])
def test_an_eval_set_file_without_problems_is_a_user_error(tiny_cfg, tmp_path, text):
    """Refused when the set is read, before a model loads or a run opens: a user error (one
    line from the command, not retried), naming the file."""
    from tasks.data.splits import eval_problems
    from tasks.orchestration import USER_ERRORS

    path = tmp_path / "set.jsonl"
    path.write_text(text)
    with pytest.raises(USER_ERRORS, match=r"set\.jsonl holds no problem \(\d rows"):
        eval_problems(tiny_cfg, str(path))


# --- answer formats and equivalence beyond integers -------------------------------------------


def _half():
    return [Problem("h", "1/2?", "\\frac{1}{2}", "1/2?", "t")]


def test_non_integer_ground_truth_and_majority_by_equivalence(tiny_cfg):
    texts = ["Answer: 0.5", "Answer: 1/2", "Answer: 0.5", "Answer: 0.25"]
    r = summarize(_half(), texts, [3] * 4, [True] * 4, _cfg(tiny_cfg, 4))
    assert r.metrics["eval/avg_at_k"] == 0.75
    # the majority "0.5" is not the text of the ground truth, but it is equivalent to it
    assert r.metrics["eval/maj_at_k"] == 1.0
    assert r.per_problem["extracted"].tolist() == ["0.5 (2); 1/2 (1); 0.25 (1)"]


@pytest.mark.parametrize(
    ("answer_format", "correct"),
    [
        ("dapo", [1, 1, 0, 0]),  # the Answer line, else the last box
        ("boxed", [0, 1, 0, 1]),
        ("minerva", [0, 0, 1, 0]),
        ("auto", [1, 1, 1, 1]),  # whichever marker comes last
    ],
)
def test_answer_format_decides_what_is_read(tiny_cfg, answer_format, correct):
    texts = [
        "Answer: 0.5",  # DAPO's prompt
        "So it is $\\boxed{\\frac{1}{2}}$.",  # "put your final answer within \\boxed{}"
        "Final answer: below\nThe final answer is $0.5$. I hope it is correct.",  # Minerva
        "Answer: 0.2\nCorrection: $\\boxed{0.5}$",  # a later box corrects the Answer line
    ]
    problems = [Problem(f"h{i}", "1/2?", "\\frac{1}{2}", "1/2?", "t") for i in range(4)]
    cfg = _cfg(tiny_cfg, 1, f"eval.answer_format={answer_format}")
    r = summarize(problems, texts, [3] * 4, [True] * 4, cfg)
    assert r.per_problem["accuracy"].tolist() == correct
    assert r.scoring["eval/answer_format"] == answer_format


def test_config_answer_formats_are_the_rewards():
    hint = typing.get_type_hints(EvalConfig)["answer_format"]
    assert typing.get_args(hint) == ANSWER_FORMATS


def test_config_logged_before_answer_format_loads_with_dapo(tiny_cfg):
    raw = tiny_cfg.to_dict()
    del raw["eval"]["answer_format"]
    assert from_dict(raw).eval.answer_format == "dapo"


# --- published benchmarks, evaluated as published ------------------------------------------------


def _published(name):
    path, _ = PUBLISHED[name]
    return pytest.param(
        name,
        marks=pytest.mark.skipif(not path.exists(), reason=f"real data not here: {path}"),
    )


@pytest.mark.parametrize("name", [_published(n) for n in PUBLISHED])
def test_published_benchmarks_keep_every_problem_and_answer(tiny_cfg, name):
    from tasks.data.splits import eval_problems

    path, count = PUBLISHED[name]
    _, problems = eval_problems(tiny_cfg, str(path))
    assert len(problems) == count
    if path.suffix == ".jsonl":  # the publisher's answers; integer literals written canonically
        kept = {p.problem: p.answer for p in problems}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            published = canonical_integer(row["answer"]) or row["answer"]
            assert kept[row["problem"].strip()] == published


@pytest.mark.slow
@pytest.mark.skipif(not PUBLISHED["math-500"][0].exists(), reason="real data not here")
def test_math_500_is_judged_as_published(tiny_cfg):
    """All 500 problems stay (78 of them had no integer form; 91 had their answer rewritten by
    the training curation), and each published answer, written back in any of the formats,
    is judged equivalent to itself."""
    from tasks.data.splits import eval_problems

    _, problems = eval_problems(tiny_cfg, str(PUBLISHED["math-500"][0]))
    assert any(p.answer == "\\left( 3, \\frac{\\pi}{2} \\right)" for p in problems)
    assert sum(not p.answer.lstrip("-").isdigit() for p in problems) >= 180
    for answer_format, write in [
        ("dapo", "Working.\nAnswer: {}"),
        ("boxed", "So it is $\\boxed{{{}}}$."),
        ("minerva", "Final Answer: The final answer is ${}$. I hope it is correct."),
    ]:
        cfg = _cfg(tiny_cfg, 1, f"eval.answer_format={answer_format}")
        texts = [write.format(p.answer) for p in problems]
        r = summarize(problems, texts, [1] * 500, [True] * 500, cfg)
        assert r.metrics["eval/avg_at_k"] == 1.0, answer_format
        assert r.metrics["eval/num_problems"] == 500.0


def test_rows_an_eval_set_file_leaves_out_are_counted_in_a_warning(tiny_cfg, tmp_path, caplog):
    """A raw eval-set file's unreadable rows are left out, and said so: an evaluation quietly
    smaller than its file would be misread."""
    import logging

    from tasks.data.splits import eval_problems

    path = tmp_path / "set.jsonl"
    path.write_text(
        '{"problem": "What is 2+2?", "answer": "4"}\n{"problem": "torn\n{"problem": "3+3?"}\n'
    )
    with caplog.at_level(logging.WARNING, logger="tasks.data.eval_sets"):
        _, problems = eval_problems(tiny_cfg, str(path))
        eval_problems(tiny_cfg, str(path))  # read again to evaluate: not said twice
    assert [p.answer for p in problems] == ["4"]
    (warned,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert "2 of 3 rows left out" in warned and "invalid_json" in warned
