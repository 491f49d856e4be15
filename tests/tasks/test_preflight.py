"""The preflight on the tiny test model: its report adds up, and an untrained policy (which
writes no parseable answer) is called out, as a warning or, with strict, as an error."""

import pytest

from dapo_core.config_loader import resolve
from tasks.training.preflight import NothingToLearn, preflight_task, run_preflight


@pytest.mark.slow
def test_preflight_report_adds_up(tiny_cfg):
    result = run_preflight(tiny_cfg, n_prompts=8)
    s = result.signal
    assert result.problems == 8 and result.group_size == tiny_cfg.rollout.group_size
    assert sum(s.pass_rate_hist) == 8 and len(s.pass_rate_hist) == result.group_size + 1
    assert (result.problem is None) == (s.mixed_group_frac >= tiny_cfg.train.preflight_min_mixed)
    metrics = result.metrics()
    assert metrics["preflight/mixed_group_frac"] == s.mixed_group_frac
    assert sum(metrics[f"preflight/groups_with_{k}_correct"] for k in range(5)) == 8


@pytest.mark.slow
def test_preflight_of_an_untrained_policy_names_the_format(tiny_cfg, tmp_path):
    cfg = resolve(
        tiny_cfg.to_dict(), overrides=[f"tiny.path={tmp_path}", "tiny.warm_start_steps=0"]
    )
    result = run_preflight(cfg, n_prompts=8)
    assert result.signal.mixed_group_frac < cfg.train.preflight_min_mixed
    assert "parseable answer" in result.problem
    with pytest.raises(NothingToLearn, match="parseable answer"):
        preflight_task.fn(cfg, strict=True, prompts=8)
    assert preflight_task.fn(cfg, strict=False, prompts=8).problem  # a warning, not an error
