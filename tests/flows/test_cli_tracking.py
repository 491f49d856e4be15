"""`dapo train` and `dapo evaluate` log to MLflow like the flows do (and not with --no-track)."""

import re

from typer.testing import CliRunner

from flows.cli import app
from tasks.tracking.store import metric_history, search_runs


def _run_id(output: str) -> str:
    found = re.search(r"MLflow run (\w+)", output)
    assert found, output
    return found.group(1)


def test_cli_train_and_evaluate_are_tracked(flows_env, flow_cfg, flow_params, tmp_path):
    mlflow_uri = flows_env
    runner = CliRunner()
    run_dir = tmp_path / "cli-run"
    out = runner.invoke(app, ["train", "--params", flow_params, "--run-dir", str(run_dir)])
    assert out.exit_code == 0, out.output
    run_id = _run_id(out.output)
    assert [s for s, _ in metric_history(run_id, "train/acc_mean", mlflow_uri)] == [1, 2]
    assert (run_dir / "final" / "model.safetensors").exists()

    # The same directory again without --resume: refused, with the way out.
    again = runner.invoke(app, ["train", "--params", flow_params, "--run-dir", str(run_dir)])
    assert again.exit_code == 2 and "--resume" in again.output

    ev = runner.invoke(
        app, ["evaluate", "--params", flow_params, "--model", str(run_dir / "final")]
    )
    assert ev.exit_code == 0, ev.output
    eval_runs = {r["run_id"]: r for r in search_runs(flow_cfg, "evaluate", uri=mlflow_uri)}
    assert "eval/avg_at_k" in eval_runs[_run_id(ev.output)]["metrics"]

    before = len(search_runs(flow_cfg, "train", uri=mlflow_uri))
    quiet = runner.invoke(
        app,
        ["train", "--params", flow_params, "--run-dir", str(tmp_path / "quiet"), "--no-track"],
    )
    assert quiet.exit_code == 0, quiet.output
    assert "MLflow run" not in quiet.output
    assert len(search_runs(flow_cfg, "train", uri=mlflow_uri)) == before
