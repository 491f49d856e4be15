"""Evaluation metrics from samples, determinism, and a model that emits garbage."""

import pytest

from dapo_core.config_loader import resolve
from dapo_core.problem import Problem
from tasks.evaluation.evaluate import evaluate_policy, summarize
from tasks.models.loading import load_policy
from tasks.models.resolve import resolve_model_path
from tasks.rollout.generators import HFGenerator, Rollouts


def _cfg(tiny_cfg, n):
    return resolve(tiny_cfg.to_dict(), overrides=[f"eval.n_samples={n}", "eval.pass_ks=[1,2,4,32]"])


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
    assert m["eval/truncated_frac"] == 1 / 8
    assert m["eval/avg_at_k_ci_low"] <= 3 / 8 <= m["eval/avg_at_k_ci_high"]
    table = r.per_problem
    assert list(table.columns) == [
        "problem_id",
        "answer",
        "accuracy",
        "majority_answer",
        "mean_response_len",
        "truncated_frac",
    ]
    assert table["accuracy"].tolist() == [0.5, 0.25]
    assert table["majority_answer"].tolist() == ["2", "5"]


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
