"""The method comparison's records (read from a run's logs), its table and its terminal view."""

import math

import pytest

from dapo_core import metric_names as metric
from tasks.evaluation.comparison import (
    DPO_KEYS,
    RL_KEYS,
    RunRecord,
    comparison_table,
    curves_figure,
    run_record,
    terminal_table,
)
from tasks.rundir import RunDir


def _rl_logs(path, grad_norms, generated, tokens, adv_var, val):
    rd = RunDir(path)
    rows = zip(grad_norms, generated, tokens, adv_var, strict=True)
    for step, (g, n, t, a) in enumerate(rows, start=1):
        rd.append_metrics(
            step,
            {
                metric.GRAD_NORM: g,
                metric.SAMPLES_GENERATED: n,
                metric.TOKENS_TRAINED: t,
                metric.ADV_VAR: a,
            },
        )
    for step, v in val.items():
        rd.append_validation(step, {metric.VAL_AVG_AT_K: v})
    return rd


def test_an_rl_run_record_counts_what_was_generated_and_trained_on(tmp_path):
    _rl_logs(
        tmp_path,
        grad_norms=[1.0, 3.0, 2.0, 2.0],
        generated=[64, 96, 64, 64],
        tokens=[300, 310, 320, 330],
        adv_var=[0.8, 1.0, 0.9, 0.9],
        val={2: 0.4, 4: 0.5},
    )
    r = run_record("dapo", 3, str(tmp_path), RL_KEYS, warm_val=0.3)
    assert (r.method, r.seed, r.status) == ("dapo", 3, "ok")
    assert r.responses == 288 and r.tokens == 1260
    assert r.curve == [(0.0, 0.0, 0.3), (160.0, 610.0, 0.4), (288.0, 1260.0, 0.5)]
    assert r.grad_norm_cv == pytest.approx(math.sqrt(2 / 3) / 2)  # sd of (1,3,2,2) / 2
    assert r.advantage_var == pytest.approx(0.9)


def test_responses_mined_before_training_start_the_curve(tmp_path):
    """PPO against a learned reward (and DPO) needed the mined pairs' responses first."""
    _rl_logs(tmp_path, [1.0, 1.0], [32, 32], [10, 10], [1.0, 1.0], {2: 0.6})
    r = run_record("ppo_rm", 0, str(tmp_path), RL_KEYS, 0.3, responses_before=5888)
    assert r.curve[0] == (5888, 0.0, 0.3) and r.curve[-1] == (5952, 20.0, 0.6)
    assert r.responses == 5952


def test_a_dpo_run_record_has_no_advantages_and_generates_nothing_while_training(tmp_path):
    rd = RunDir(tmp_path)
    for step in (1, 2, 3):
        rd.append_metrics(step, {"dpo/grad_norm": float(step), "dpo/tokens_trained": 100.0})
    rd.append_metrics(2, {"dpo/grad_norm": 2.0, "dpo/tokens_trained": 100.0})  # resumed: again
    rd.append_validation(3, {metric.VAL_AVG_AT_K: 0.55})
    r = run_record("dpo", 0, str(tmp_path), DPO_KEYS, 0.3, responses_before=5888)
    assert r.tokens == 300 and r.responses == 5888  # the repeated step counted once
    assert math.isnan(r.advantage_var)
    assert r.curve == [(5888, 0.0, 0.3), (5888, 300.0, 0.55)]


def _records():
    ok = [
        RunRecord("dapo", s, avg_at_k=a, wall_s=60.0, responses=1000.0, tokens=5e4)
        for s, a in enumerate([0.6, 0.62, 0.58])
    ]
    ppo = [
        RunRecord("ppo_rm", 0, avg_at_k=0.1, grad_norm_cv=0.5, advantage_var=2.0, wall_s=120.0),
        RunRecord("ppo_rm", 1, avg_at_k=0.4, grad_norm_cv=0.7, advantage_var=1.0, wall_s=180.0),
        RunRecord("ppo_rm", 2, status="failed: RuntimeError: boom"),
    ]
    return ok + ppo


def test_the_table_has_one_row_per_method_over_its_finished_seeds():
    table = comparison_table(_records(), ["ppo_rm", "dapo"], warm=0.3)
    assert list(table["method"]) == ["ppo_rm", "dapo"]
    ppo, dapo = table.iloc[0], table.iloc[1]
    assert ppo["runs"] == "2/3" and dapo["runs"] == "3/3"
    assert ppo["avg_at_k"] == pytest.approx(0.25) and dapo["avg_at_k"] == pytest.approx(0.6)
    assert dapo["seed_sd"] == pytest.approx(0.02)
    assert ppo["collapsed"] == 1 and dapo["collapsed"] == 0  # 0.1 < 0.5 * 0.3
    assert ppo["grad_norm_cv"] == pytest.approx(0.6) and ppo["advantage_var"] == pytest.approx(1.5)
    assert ppo["wall_min"] == pytest.approx(2.5) and dapo["wall_min"] == pytest.approx(1.0)
    assert math.isnan(dapo["grad_norm_cv"])  # none logged


def test_the_terminal_table_fits_80_columns_and_says_what_is_missing():
    table = comparison_table(
        _records() + [RunRecord("dpo", 0, avg_at_k=0.5)], ["ppo_rm", "dpo"], 0.3
    )
    text = terminal_table(table, k=8)
    lines = text.splitlines()
    assert len(lines) == 3 and max(len(line) for line in lines) <= 80
    assert lines[0].split()[:2] == ["method", "avg@8"]
    ppo, dpo = lines[1].split(), lines[2].split()
    assert ppo[0] == "ppo_rm" and ppo[1] == "0.250" and "1/2" in ppo  # collapsed / runs finished
    assert dpo[0] == "dpo" and dpo[2] == "-" and dpo[3] == "-"  # one seed: no CI, no sd


def test_the_curves_figure_has_a_line_per_method_on_both_axes():
    recs = [
        RunRecord("dapo", s, curve=[(0.0, 0.0, 0.3), (100.0, 500.0, 0.4 + s / 100)])
        for s in range(2)
    ]
    fig = curves_figure(recs, ["dapo", "dpo"], k=8)
    responses, tokens = fig.axes
    assert [line.get_label() for line in responses.lines] == ["dapo"]  # dpo has no runs
    assert list(tokens.lines[0].get_xdata()) == [0.0, 500.0]
    assert list(responses.lines[0].get_ydata()) == pytest.approx([0.3, 0.405])
