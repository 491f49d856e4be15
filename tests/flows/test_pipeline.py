"""Smoke runs of the pipeline flows on the tiny config, under the session's Prefect harness."""

import json
import logging
import re
from pathlib import Path

import pytest

from dapo_core import metric_names as metric
from dapo_core.config_loader import resolve
from mlflow import MlflowClient
from tasks.data import version
from tasks.tracking import provenance, store

pytestmark = pytest.mark.slow

PLOTS = {
    "plots/reward_accuracy.png",
    "plots/entropy.png",
    "plots/response_length.png",
    "plots/clip_fractions.png",
    "plots/eval_curve.png",
}


def test_pipeline_logs_train_and_eval_to_one_run(pipeline_run, flow_cfg):
    train, ev = pipeline_run["train"], pipeline_run["evaluate"]
    assert pipeline_run["curate"]["status"] == "skipped"  # synthetic source: nothing to curate
    assert train.steps == 2 and train.complete and Path(train.model_path).name == "final"
    assert ev.mlflow_run_id == train.mlflow_run_id  # the evaluation joins the training run
    runs = store.search_runs(flow_cfg, "pipeline")
    (run,) = [r for r in runs if r["run_id"] == train.mlflow_run_id]
    assert run["status"] == "FINISHED"
    # params: the flattened resolved config
    assert run["params"]["algo.loss.eps_high"] == "0.28"
    assert run["params"]["train.steps"] == "2"
    assert run["params"]["algo.dynamic_sampling"] == "false"
    assert json.loads(run["params"]["eval.pass_ks"]) == flow_cfg.eval.pass_ks
    # tags: code, data, orchestration, what was run
    tags = run["tags"]
    assert tags["prefect.flow_run_id"] == pipeline_run["flow_run_id"]
    # a generated task reads no DVC output: its data.version says so, its digests identify it
    assert tags["data.version"] == provenance.data_version_of(flow_cfg)
    assert tags["data.version"].startswith("generated:synthetic:arith@")
    assert tags["data.train_digest"] and tags["data.val_digest"] and tags["data.eval_digest"]
    # ... and MLflow's own dataset inputs carry them (the runs table's Dataset column)
    inputs = MlflowClient(store.tracking_uri(flow_cfg)).get_run(run["run_id"]).inputs
    logged = {
        next(t.value for t in d.tags if t.key == "mlflow.data.context"): d.dataset
        for d in inputs.dataset_inputs
    }
    assert {c: logged[c].digest for c in logged} == {
        "training": tags["data.train_digest"],
        "validation": tags["data.val_digest"],
        "evaluation": tags["data.eval_digest"],
    }
    source = json.loads(logged["training"].source)
    assert source["tags"]["generator"] == "synthetic:arith"
    assert source["tags"]["synthetic.num_train"] == str(flow_cfg.synthetic.num_train)
    # (others may commit meanwhile: check the form, not today's HEAD)
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", tags["git.commit"])
    assert (tags["mlflow.source.name"], tags["mlflow.source.type"]) == ("dapo pipeline", "LOCAL")
    # the final policy is the run's MLflow model, its evaluation linked to it
    client = MlflowClient(store.tracking_uri(flow_cfg))
    (output,) = client.get_run(run["run_id"]).outputs.model_outputs
    model = client.get_logged_model(output.model_id)
    assert model.tags["dapo.path"] == str(Path(train.model_path).resolve()) and output.step == 2
    linked = {m.key: m.value for m in model.metrics}
    assert linked[metric.AVG_AT_K] == ev.metrics[metric.AVG_AT_K]
    # the evaluation summary is the flow run's Prefect artifact, linking to the MLflow run
    (artifact,) = _artifacts(pipeline_run["flow_run_id"])
    assert artifact.type == "markdown" and artifact.key.startswith("pipeline-")
    assert (
        f"{ev.metrics[metric.AVG_AT_K]:.3f}" in artifact.data and train.mlflow_url in artifact.data
    )
    assert tags["git.dirty"] in ("true", "false", "unknown")
    assert tags["seed"] == str(flow_cfg.train.seed)
    assert tags["variant"] == "+token_level_loss"  # full DAPO without dynamic sampling
    assert tags["dapo.flow"] == "pipeline" and tags["eval.set"] == "synthetic-test"
    # the model it trained from, as built (tasks.models.build)
    from tasks.models.build import dir_digest
    from tasks.models.resolve import resolve_model_path

    assert tags["model.digest"] == dir_digest(Path(resolve_model_path(flow_cfg)))
    # metrics: every training step once, validation at each step, the final eval at the end
    history = store.metric_history(run["run_id"], "train/acc_mean")
    assert [s for s, _ in history] == [1, 2]
    assert [s for s, _ in store.metric_history(run["run_id"], "val/avg_at_k")] == [1, 2]
    # the preflight of the starting policy, at step 0
    pre = store.metric_history(run["run_id"], "preflight/mixed_group_frac")
    assert [s for s, _ in pre] == [0] and 0.0 <= pre[0][1] <= 1.0
    assert "preflight/samples.json" in set(store.list_artifacts(run["run_id"]))
    # the starting policy at step 0 and the trained one at the end: the lift is one chart
    base = pipeline_run["baseline"]
    assert base.mlflow_run_id == train.mlflow_run_id and base.eval_set == ev.eval_set
    assert store.metric_history(run["run_id"], "eval/avg_at_k") == [
        (0, base.metrics["eval/avg_at_k"]),
        (2, ev.metrics["eval/avg_at_k"]),
    ]
    assert "eval-step0/synthetic-test/per_problem.csv" in set(store.list_artifacts(run["run_id"]))
    exp = MlflowClient(store.tracking_uri()).get_experiment_by_name("dapo-pipeline")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the training view
    # artifacts: config, plots, per-problem table, sample generations
    arts = set(store.list_artifacts(run["run_id"]))
    assert arts >= PLOTS
    assert {"config.json", "eval/synthetic-test/per_problem.csv"} <= arts
    assert {"samples/train_samples.json", "eval/synthetic-test/samples.json"} <= arts
    info = store.read_run(run["run_id"])
    assert resolve(info["config"]).to_dict()["algo"]["dynamic_sampling"] is False
    assert (Path(train.run_dir) / "plots" / "eval_curve.png").exists()


def _artifacts(flow_run_id: str) -> list:
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    only = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)]))
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=only)


@pytest.mark.parametrize("prefect", [True, False], ids=["prefect", "without-prefect"])
def test_train_retry_resumes_from_checkpoint(flows_env, flow_cfg, tmp_path, monkeypatch, prefect):
    """A train task that fails after a checkpoint is retried (by Prefect, or as Prefect would
    without a server: ``tasks.orchestration.without_prefect``) and continues from that
    checkpoint: the same 4 steps in the end, no step trained twice, one MLflow run."""
    import contextlib

    import flows.pipeline
    from flows.pipeline import train_flow
    from tasks.orchestration import call_flow, without_prefect
    from tasks.training import checkpoint
    from tasks.training.task import train_task
    from tasks.training.trainer import DAPOTrainer

    cfg = resolve(flow_cfg.to_dict(), overrides=["train.steps=4", "train.checkpoint_every=2"])
    params = tmp_path / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    steps_trained: list[int] = []
    failed: list[int] = []
    original_step, original_save = DAPOTrainer.train_step, checkpoint.save_checkpoint

    def counting_step(self):
        out = original_step(self)
        steps_trained.append(self.step)
        return out

    def save_then_crash_once(trainer, run_dir):
        path = original_save(trainer, run_dir)
        if trainer.step == 2 and not failed:
            failed.append(trainer.step)
            raise OSError("simulated node failure right after the step-2 checkpoint")
        return path

    monkeypatch.setattr(DAPOTrainer, "train_step", counting_step)
    monkeypatch.setattr(checkpoint, "save_checkpoint", save_then_crash_once)
    no_delay = train_task.with_options(retry_delay_seconds=0)
    monkeypatch.setattr(flows.pipeline, "train_task", no_delay)
    with contextlib.nullcontext() if prefect else without_prefect():
        name = f"retry-{'prefect' if prefect else 'direct'}"
        summary = call_flow(train_flow, params=str(params), run_name=name, progress=False)
    assert failed == [2]
    assert summary.steps == 4 and summary.complete and summary.resumed_from == 2
    assert steps_trained == [1, 2, 3, 4]  # nothing redone
    rows = [
        json.loads(x) for x in (Path(summary.run_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [s for s, _ in store.metric_history(summary.mlflow_run_id, "train/loss")] == [
        1,
        2,
        3,
        4,
    ]
    run = store.read_run(summary.mlflow_run_id)
    assert run["status"] == "FINISHED" and run["tags"]["train.steps_done"] == "4"


def test_train_flow_continues_a_named_run(flows_env, flow_cfg, tmp_path):
    """What the nightly schedule does: the same run name, a few more steps each time."""
    from flows.pipeline import train_flow

    params = tmp_path / "params.json"
    cfg = resolve(flow_cfg.to_dict(), overrides=["train.steps=3", "eval.every_n_steps=0"])
    params.write_text(json.dumps(cfg.to_dict()))
    first = train_flow(params=str(params), run_name="nightly-test", max_steps=2, progress=False)
    assert first.steps == 2 and not first.complete
    assert Path(first.model_path).parent.name == "step_000002"  # the latest checkpoint's model
    second = train_flow(params=str(params), run_name="nightly-test", max_steps=2, progress=False)
    assert second.steps == 3 and second.complete and second.resumed_from == 2
    assert second.mlflow_run_id == first.mlflow_run_id
    steps = [s for s, _ in store.metric_history(first.mlflow_run_id, "train/acc_mean")]
    assert steps == [1, 2, 3]


def test_evaluate_flow_opens_its_own_run(flows_env, flow_params, flow_cfg, pipeline_run):
    from flows.pipeline import evaluate_flow

    model = pipeline_run["train"].model_path
    out = evaluate_flow(params=flow_params, model=model, progress=False)
    runs = store.search_runs(flow_cfg, "evaluate")
    (run,) = [r for r in runs if r["run_id"] == out.mlflow_run_id]
    assert run["tags"]["eval.model"] == model
    assert run["metrics"]["eval/avg_at_k"] == out.metrics["eval/avg_at_k"]


def test_curate_skips_without_dvc_yaml(flow_cfg, tmp_path, caplog):
    from tasks.data.task import curate_task

    synthetic = curate_task.fn(flow_cfg, root=str(tmp_path))
    assert synthetic["status"] == "skipped" and synthetic["reason"] == "synthetic source"
    real = resolve(flow_cfg.to_dict(), overrides=["data.source=data/raw/dapo.parquet"])
    with caplog.at_level(logging.INFO):
        out = curate_task.fn(real, root=str(tmp_path))
    assert out == {"status": "skipped", "reason": "no dvc.yaml", "data_version": "none"}
    assert "no dvc.yaml" in caplog.text and "curate: skipped" in caplog.text


def test_curate_runs_dvc_stages_and_reports_the_data_version(flow_cfg, tmp_path):
    import subprocess
    import sys

    from tasks.data.task import curate_task

    subprocess.run(
        [sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True
    )
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  make:\n    cmd: python -c \"open('out.txt','w').write('42')\"\n"
        "    outs:\n      - out.txt\n"
    )
    real = resolve(flow_cfg.to_dict(), overrides=["data.source=data/raw/dapo.parquet"])
    out = curate_task.fn(real, root=str(tmp_path))
    assert out["status"] == "ran" and (tmp_path / "out.txt").read_text() == "42"
    assert out["data_version"] == version.data_version(tmp_path / "dvc.lock")
    assert out["data_version"] == "a1d0c6e83f027327d8461063f4ac58a6"  # md5 of "42"
    again = curate_task.fn(real, root=str(tmp_path))  # DVC skips the unchanged stage
    assert again["data_version"] == out["data_version"]


def test_a_run_continues_only_with_the_settings_it_began_with(flow_cfg, tmp_path):
    """`dapo pipeline --run-name NAME` without the first command's -S went on under
    params.yaml's settings and rewrote the run's config.json (a torn one too): refused now in
    one line, naming what differs; the same settings continue."""
    from dapo_core.errors import PipelineError
    from tasks.orchestration import without_prefect
    from tasks.training.task import train_task

    def settings(*overrides):
        return resolve(flow_cfg.to_dict(), overrides=["train.steps=2", *overrides])

    run = tmp_path / "rA"
    kw = {"kind": "pipeline", "progress": False, "track": False}
    with without_prefect():
        train_task(settings(), str(run), **kw)
        began = (run / "config.json").read_text()
        changed = r"began with other settings \(train.lr 0.01 -> 0.0001, train.steps 2 -> 5\)"
        with pytest.raises(PipelineError, match=changed):
            train_task(settings("train.steps=5", "train.lr=1e-4"), str(run), **kw)
        assert (run / "config.json").read_text() == began
        assert train_task(settings(), str(run), **kw).steps == 2  # the same: it continues
        older = json.loads(began)
        del older["train"]["lr"]  # a run of a version before this setting: it continues
        (run / "config.json").write_text(json.dumps(older))
        assert train_task(settings(), str(run), **kw).steps == 2
        (run / "config.json").write_text(began[:40])  # a write cut short
        with pytest.raises(PipelineError, match="config.json is not valid JSON"):
            train_task(settings(), str(run), **kw)
