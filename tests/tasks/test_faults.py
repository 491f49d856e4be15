"""Faults of the environment (issue 23, item 4): a full disk while writing a checkpoint or a
metrics row leaves the run resumable, ends in one line, and resumes to the uninterrupted run."""

import errno
import json

import pytest
import torch

from dapo_core.config_loader import resolve
from dapo_core.errors import PipelineError
from tasks.rundir import RunDir
from tasks.training import checkpoint
from tasks.training.run import run_training


def test_a_torn_metrics_row_is_skipped_and_cut_before_the_next(tmp_path):
    rd = RunDir(tmp_path)
    rd.append_metrics(1, {"train/loss": 0.5})
    with rd.metrics_file.open("a") as f:
        f.write('{"step": 2, "train/lo')  # the disk filled up mid-row
    assert [r["step"] for r in rd.read_metrics()] == [1]
    rd.append_metrics(2, {"train/loss": 0.25})
    lines = rd.metrics_file.read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"step": 1, "train/loss": 0.5},
        {"step": 2, "train/loss": 0.25},
    ]
    only_torn = RunDir(tmp_path / "other")
    only_torn.path.mkdir()
    only_torn.metrics_file.write_text('{"step": 1')
    only_torn.append_metrics(1, {"x": 1.0})
    assert only_torn.metrics_file.read_text() == '{"step": 1, "x": 1.0}\n'


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_keeps_the_last_one_and_the_run_resumes(
    tiny_cfg, tmp_path, monkeypatch
):
    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.steps=3", "train.checkpoint_every=1"])
    full = run_training(cfg, RunDir(tmp_path / "full"), progress=False)

    real_save, calls = torch.save, []

    def disk_full_at_step_2(obj, path, *args, **kwargs):
        calls.append(path)
        if ".tmp-step_000002" in str(path):
            with open(path, "wb") as f:
                f.write(b"partial")  # what fitted before the disk was full
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", disk_full_at_step_2)
    rd = RunDir(tmp_path / "cut")
    with pytest.raises(PipelineError) as stopped:
        run_training(cfg, rd, progress=False)
    message = str(stopped.value)
    assert "No space left on device" in message and "step 1 is intact" in message
    assert "\n" not in message
    assert [p.name for p in rd.checkpoints()] == ["step_000001"]
    assert rd.check_checkpoint(rd.checkpoints()[0]) is None  # complete and undamaged
    assert not list(rd.checkpoints_dir.glob(".tmp-*"))  # the partial one is gone

    monkeypatch.setattr(checkpoint.torch, "save", real_save)  # space freed
    rest = run_training(cfg, rd, resume=True, progress=False)
    assert rest.steps == 3

    def strip(h):  # timings differ between runs; everything else must match exactly
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in h]

    assert strip(rd.read_metrics()) == strip(full.history)
    a = _weights(tmp_path / "full" / "final")
    b = _weights(tmp_path / "cut" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _weights(model_dir):
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))
