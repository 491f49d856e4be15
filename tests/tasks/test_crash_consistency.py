"""SIGKILL at random moments, resume, and compare with the uninterrupted run (issue 23): a kill
cannot be caught, so what the run directory holds at that instant must always be resumable to
the same result. ``python -m bench.crash_consistency`` does 20 kills on a 40-step run."""

import json

import pytest

from bench.crash_consistency import _attempt, after_seconds, at_step, compare, latest_step
from dapo_core.config_loader import resolve


@pytest.mark.slow
def test_sigkills_at_start_up_and_mid_training_resume_to_the_uninterrupted_run(tiny_cfg, tmp_path):
    overrides = ["train.steps=8", "train.checkpoint_every=1", "train.max_stalled_steps=0"]
    cfg = resolve(tiny_cfg.to_dict(), overrides=overrides)
    params = tmp_path / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    assert not _attempt(params, tmp_path / "full", None)
    cut = tmp_path / "cut"
    assert _attempt(params, cut, after_seconds(1.0))  # importing: nothing written yet
    # once a step is logged: in the next step or while its checkpoint is being written
    for step in (2, 5):
        assert _attempt(params, cut, at_step(cut, step))
        assert 0 < latest_step(cut) <= step
    assert not _attempt(params, cut, None)  # to the end
    assert compare(tmp_path / "full", cut) == []
