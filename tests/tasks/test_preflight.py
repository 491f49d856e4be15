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


@pytest.mark.slow
def test_the_training_after_a_preflight_takes_its_policy_and_trains_as_from_a_fresh_load(
    tiny_cfg, tmp_path, monkeypatch
):
    """One load for the two stages (``HandedPolicy``), the same run as without the hand-off, and
    the hand-off taken once: a retried training loads afresh (its first attempt trained it)."""
    import torch

    from tasks.models.loading import load_policy, transformers_quietly
    from tasks.rundir import RunDir
    from tasks.training.run import run_training

    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.steps=2"])
    auto = transformers_quietly().AutoModelForCausalLM
    loads, from_pretrained = [], auto.from_pretrained

    def counted(*args, **kwargs):
        loads.append(args[0])
        return from_pretrained(*args, **kwargs)

    monkeypatch.setattr(auto, "from_pretrained", counted)
    checked = run_preflight(cfg, n_prompts=4)
    runs = RunDir(tmp_path / "handed"), RunDir(tmp_path / "fresh")
    run_training(cfg, runs[0], progress=False, policy=checked.policy)
    assert len(loads) == 1 and checked.policy.loaded is None  # taken, not loaded again
    run_training(cfg, runs[1], progress=False, policy=checked.policy)
    assert len(loads) == 2  # nothing left to take: loaded
    monkeypatch.undo()
    handed, fresh = (load_policy(str(r.final), "float32")[0].state_dict() for r in runs)
    assert all(torch.equal(handed[k], fresh[k]) for k in fresh)  # the same run


def test_every_preflight_metric_is_said_by_dapo_metrics():
    import torch

    from dapo_core.metric_names import describe
    from dapo_core.signal import group_signal
    from tasks.training.preflight import PreflightResult

    acc = torch.tensor([[True, False], [False, False]])
    signal = group_signal(
        acc, torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool)
    )
    names = PreflightResult(signal, 2, 2, None, []).metrics()
    assert "preflight/groups_with_2_correct" in names and all(describe(n) for n in names), names


@pytest.mark.slow
def test_dapo_preflight_prints_its_report_once_on_stdout(tiny_cfg, tmp_path):
    """It said the report twice (the stage's log lines, then its own), all on stderr:
    `dapo preflight > report.txt` kept nothing."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    params = tmp_path / "params.json"
    params.write_text(json.dumps(tiny_cfg.to_dict()))
    done = subprocess.run(
        [str(Path(sys.executable).with_name("dapo")), "preflight", "--params", str(params)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DAPO_WARM": "0"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("preflight on ") == 1 and "preflight on " not in done.stderr
    assert done.stdout.count("  answer ") == 3, done.stdout


@pytest.mark.slow
def test_dapo_preflight_strict_prints_its_report_before_it_refuses(tiny_cfg, tmp_path):
    """With --strict the stage raised before the report was printed: only the error was left."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    untrained = [f"tiny.path={tmp_path / 'm'}", "tiny.warm_start_steps=0"]
    params = tmp_path / "params.json"
    params.write_text(json.dumps(resolve(tiny_cfg.to_dict(), overrides=untrained).to_dict()))
    done = subprocess.run(
        [str(Path(sys.executable).with_name("dapo")), "preflight", "--params", str(params),
         "--prompts", "8", "--strict"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "DAPO_WARM": "0"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout.startswith("preflight on 8 prompts") and "  answer " in done.stdout
    assert done.stderr.startswith("error: preflight: only"), done.stderr
