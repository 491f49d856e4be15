"""`dapo train` and `dapo evaluate` log to MLflow like the flows do (and not with --no-track)."""

import json
import re

import pytest
from typer.testing import CliRunner

from dapo_core.errors import PipelineError
from flows.cli import app
from mlflow import MlflowClient
from tasks.params import REPO_ROOT as ROOT
from tasks.tracking import registry
from tasks.tracking.store import metric_history, search_runs


def _run_id(output: str) -> str:
    found = re.search(r"MLflow run (\w+)", output)
    assert found, output
    return found.group(1)


@pytest.mark.slow
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
    # --resume with an override it would ignore: refused in one line, the run untouched.
    metrics = (run_dir / "metrics.jsonl").read_text()
    changed = runner.invoke(app, ["train", "--resume", str(run_dir), "-S", "train.steps=9"])
    assert changed.exit_code == 2 and "drop them" in changed.output
    assert "Traceback" not in changed.output
    assert (run_dir / "metrics.jsonl").read_text() == metrics

    # The run's policy, registered, is what `--model models:/NAME@champion` evaluates
    reg = runner.invoke(app, ["register", run_id, "--params", flow_params])
    assert reg.exit_code == 0 and "models:/dapo-policy@champion names it" in reg.output, reg.output
    # again: not a second version of the same policy (it made one); the alias stays on it
    again = runner.invoke(app, ["register", run_id, "--params", flow_params])
    assert again.output.startswith("already registered, as dapo-policy version "), again.output
    versions = MlflowClient(mlflow_uri).search_model_versions("name='dapo-policy'")
    assert len({v.model_id for v in versions}) == len(versions), versions
    champion = ["--model", "models:/dapo-policy@champion"]
    ev = runner.invoke(app, ["evaluate", "--params", flow_params, *champion])
    assert ev.exit_code == 0, ev.output
    assert re.search(r"eval/n_samples\s*│\s*2 │", ev.output), ev.output  # a count, not 2.0000
    eval_runs = {r["run_id"]: r for r in search_runs(flow_cfg, "evaluate", uri=mlflow_uri)}
    evaluated = eval_runs[_run_id(ev.output)]
    assert "eval/avg_at_k" in evaluated["metrics"]
    assert evaluated["tags"]["eval.model"] == "models:/dapo-policy@champion"
    # ... and its metrics are the registered model's (the Models page), not a new model's
    client = MlflowClient(mlflow_uri)
    champ = registry.logged_model_of("models:/dapo-policy@champion", mlflow_uri)
    linked = {(m.key, m.run_id) for m in client.get_logged_model(champ).metrics or []}
    assert ("eval/avg_at_k", evaluated["run_id"]) in linked
    outputs = client.get_run(evaluated["run_id"]).outputs
    assert not (outputs and outputs.model_outputs)  # no new model logged for it
    # a name nobody registered: one line that says what to do, no run
    missing = runner.invoke(app, ["evaluate", "--params", flow_params, "--model", "models:/x@y"])
    assert missing.exit_code == 2 and "dapo register" in missing.output, missing.output
    assert "Traceback" not in missing.output

    before = len(search_runs(flow_cfg, "train", uri=mlflow_uri))
    quiet = runner.invoke(
        app,
        ["train", "--params", flow_params, "--run-dir", str(tmp_path / "quiet"), "--no-track"],
    )
    assert quiet.exit_code == 0, quiet.output
    assert "MLflow run" not in quiet.output
    assert len(search_runs(flow_cfg, "train", uri=mlflow_uri)) == before
    # resumed without a choice, it stays untracked as it began (a new MLflow run would hold
    # only the continuation); --track would log it
    resumed = runner.invoke(app, ["train", "--resume", str(tmp_path / "quiet")])
    assert resumed.exit_code == 0, resumed.output
    assert "continuing untracked" in resumed.output and "MLflow run" not in resumed.output
    assert len(search_runs(flow_cfg, "train", uri=mlflow_uri)) == before


def test_unwritable_run_dir_is_one_line_and_opens_no_run(
    flows_env, flow_cfg, flow_params, tmp_path
):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a run directory under a file cannot be created (even by root)
    before = len(search_runs(flow_cfg, "train", uri=flows_env))
    out = CliRunner().invoke(
        app, ["train", "--params", flow_params, "--run-dir", str(blocker / "run")]
    )
    assert out.exit_code == 2, out.output
    assert "cannot write to the run directory" in out.output
    for layer in ("flows", "tasks", "dapo_core"):  # no traceback through the project's code
        assert f'File "{ROOT / layer}' not in out.output
    assert len(search_runs(flow_cfg, "train", uri=flows_env)) == before


def test_interrupted_training_says_how_to_continue_and_ends_the_run_killed(
    flows_env, flow_cfg, tmp_path, monkeypatch
):
    """Ctrl-C (KeyboardInterrupt) in the middle of a run: exit 130, the step reached, the last
    checkpoint and the exact resume command; the MLflow run is KILLED, not left RUNNING."""
    import json

    from dapo_core.config_loader import resolve
    from tasks.training.trainer import DAPOTrainer

    cfg = resolve(flow_cfg.to_dict(), overrides=["train.steps=6", "train.checkpoint_every=2"])
    params = tmp_path / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    original = DAPOTrainer.train_step

    def interrupted_at_step_3(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(DAPOTrainer, "train_step", interrupted_at_step_3)
    run_dir = tmp_path / "stopped"
    out = CliRunner().invoke(app, ["train", "--params", str(params), "--run-dir", str(run_dir)])
    assert out.exit_code == 130, out.output
    text = " ".join(out.output.split())
    assert "stopped after step 3 of 6" in text and "last checkpoint: step 2" in text
    assert f"dapo train --resume {run_dir}" in text
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    from tasks.tracking.store import read_run

    assert read_run(run_id, flows_env)["status"] == "KILLED"


@pytest.mark.slow
def test_without_a_prefect_server_train_never_imports_prefect(flow_params, tmp_path):
    """No Prefect server configured or running: `dapo train` runs its flow's function and leaves
    Prefect unimported (~2 s of every such command)."""
    import json
    import os
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from flows.cli import app\n"
        "try:\n"
        f"    app(['train', '--params', {flow_params!r}, '--run-dir', {str(tmp_path / 'run')!r},"
        " '-S', 'train.steps=1', '--no-track'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print(__import__('json').dumps(sorted(m for m in ('prefect', 'torch')"
        " if m in sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == ["torch"]  # it trained, on torch alone
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()


def test_help_lists_each_command_in_whole_sentences():
    """A command's line in `--help` is its docstring's first paragraph on one line: the
    docstring's own line breaks cut sentences mid-line ("report whether DAPO has" / "anything")."""
    for args, phrase in (
        ([], "DAPO has anything to learn from"),
        (["pairs"], "rewards. Writes the table"),
    ):
        out = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "100"})
        assert out.exit_code == 0, out.output
        rows = [re.sub(r"^[│ ]*|[│ ]*$", "", row) for row in out.output.splitlines()]
        assert any(phrase in row for row in rows), out.output


EVAL_SET = "unknown eval set 'bogus'"
RUN_NAME = "a run name is one folder name: no '/'"
UI_DB = "sqlite:///TMP/new/mlflow.db"  # not made, nor served


@pytest.mark.parametrize(
    "args, said",
    [
        (["pipeline", "--no-curate", "--eval-set", "bogus"], EVAL_SET),
        (["ablate", "--no-curate", "--variants", "grpo", "--eval-set", "bogus"], EVAL_SET),
        (["compare", "--no-curate", "--eval-set", "bogus"], EVAL_SET),
        (["evaluate", "--eval-set", "bogus"], EVAL_SET),
        (["evaluate", "--out", "FILE"], "is a file"),
        (["evaluate", "--out", "FILE/sub"], "afile is a file; give a directory"),
        (["curate", "--out", "FILE/curated"], "--out"),
        (["ablate", "--no-curate", "--variants", "grpo", "--eval-set", "FILE"], ".jsonl or .json"),
        (["curate", "--eval-dir", "FILE/eval"], "--eval-dir"),
        (["ablate", "--variants", "dapo,gpso"], "unknown variant(s) gpso; Table 1 rungs: grpo"),
        (["ablate", "--variants", "dapo,gspo", "--baseline", "cispo"], "--baseline cispo is not"),
        (["compare", "--methods", "dpo,ppo", "--seeds", "0"], "unknown method(s) ppo; choose"),
        (["ablate", "--no-curate", "--run-name", "../escape"], RUN_NAME),
        (["ablate", "--variants", "grpo", "--seeds", "0,0"], "distinct integers >= 0"),
        (["compare", "--seeds", "-1"], "distinct integers >= 0"),
        (["ablate", "--variants", ""], "--variants is empty"),
        (["compare", "--methods", ","], "--methods is empty"),
        (["compare", "--no-curate", "--run-name", "a/b"], RUN_NAME),
        (["pipeline", "--no-curate", "--run-name", "x" * 300], RUN_NAME),  # was a traceback
        (["pipeline", "--no-curate", "--run-name", " "], RUN_NAME),
        (["pipeline", "--no-curate", "--run-name", "/tmp/abs"], RUN_NAME),
        (["train", "-S", "tracking.tracking_uri=ftp://h/x"], "no tracking store for ftp://"),
        (["ui", "--print-only", "-S", f"tracking.tracking_uri={UI_DB}"], "no MLflow store at"),
        (["ui", "-S", "tracking.tracking_uri=http://127.0.0.1:1"], "is an MLflow server"),
    ],
    ids=[
        "pipeline",
        "ablate",
        "compare",
        "evaluate",
        "evaluate into a file",
        "evaluate under a file",
        "curate under a file",
        "an eval file without problems",
        "eval sets under a file",
        "unknown variant",
        "baseline not among the variants",
        "unknown method",
        "run name outside the runs folder",
        "a repeated seed",
        "a negative seed",
        "no variant",
        "no method",
        "nested run name",
        "a run name too long for the file system",
        "a run name of spaces",
        "absolute run name",
        "a tracking URI MLflow has no store for",
        "a UI on a store that is not there",
        "a UI on a tracking server",
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    flows_env, flow_params, tmp_path, monkeypatch, args, said
):
    """An unknown eval set, variant, baseline or method, or a file where the results' directory
    goes, is one line before anything trains, evaluates, starts a Prefect server or opens an
    MLflow run (an unknown eval set used to come after the training)."""
    from flows.commands import sweeps, training

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started before the arguments were checked")

    for module in (sweeps, training):
        monkeypatch.setattr(module, "_server", no_server)
    client = MlflowClient(flows_env)

    def runs() -> int:
        experiments = [e.experiment_id for e in client.search_experiments()]
        return len(client.search_runs(experiments)) if experiments else 0

    afile = tmp_path / "afile"
    afile.write_text("")
    args = [a.replace("FILE", str(afile)).replace("TMP", str(tmp_path)) for a in args]
    before = runs()
    out = CliRunner().invoke(app, [*args, "--params", flow_params])
    assert out.exit_code == 2, out.output
    assert said in out.output
    assert "Traceback" not in out.output and sorted(tmp_path.iterdir()) == [afile]
    assert runs() == before


def test_an_interrupted_evaluate_ends_its_run_and_says_how_to_start_over(
    flows_env, flow_params, monkeypatch
):
    """Ctrl-C mid-evaluation: exit 130, one line that says what to do, its MLflow run KILLED."""
    from flows.commands import base
    from tasks.evaluation import task

    def stopped(*args, **kwargs):  # Ctrl-C while the results are logged to the open run
        raise KeyboardInterrupt

    monkeypatch.setattr(task, "_log_evaluation", stopped)
    monkeypatch.setattr(base, "_exit_promptly", lambda: None)  # gc.freeze is for a real exit
    client = MlflowClient(flows_env)
    experiments = [e.experiment_id for e in client.search_experiments()]
    before = {r.info.run_id for r in client.search_runs(experiments)} if experiments else set()
    out = CliRunner().invoke(app, ["evaluate", "--params", flow_params])
    assert out.exit_code == 130, out.output
    assert "interrupted:" in out.output and "run the same command to evaluate again" in out.output
    assert "Traceback" not in out.output
    experiments = [e.experiment_id for e in client.search_experiments()]
    new = [r for r in client.search_runs(experiments) if r.info.run_id not in before]
    assert [r.info.status for r in new] == ["KILLED"]


def test_evaluate_out_writes_the_metrics_and_one_row_per_problem(flow_params, tmp_path):
    """``--out``: metrics.json holds what the table printed, per_problem.csv a row for each
    problem, samples.json each sample with what was read from it, and nothing else is left in
    the folder (each written whole, then renamed)."""
    import pandas as pd

    folder = tmp_path / "results[/]" / "eval"  # a path Rich would read as markup: no crash
    out = CliRunner().invoke(
        app, ["evaluate", "--params", flow_params, "--out", str(folder), "--no-track"]
    )
    assert out.exit_code == 0, out.output
    files = ["metrics.json", "per_problem.csv", "samples.json"]
    assert sorted(p.name for p in folder.iterdir()) == files
    metrics = json.loads((folder / "metrics.json").read_text())
    assert 0.0 <= metrics["eval/avg_at_k"] <= 1.0
    assert f"{metrics['eval/avg_at_k']:.4f}" in out.output
    per_problem = pd.read_csv(folder / "per_problem.csv")
    assert per_problem["problem_id"].is_unique and len(per_problem) > 0
    assert per_problem["accuracy"].mean() == pytest.approx(metrics["eval/avg_at_k"])
    samples = json.loads((folder / "samples.json").read_text())
    assert samples and {s["problem_id"] for s in samples} <= set(per_problem["problem_id"])


def test_a_multi_rank_launch_without_a_run_dir_is_refused(flow_params, tmp_path, monkeypatch):
    """Each rank used to name the default directory from its own clock: ranks a second apart
    wrote their optimizer states into different directories, and the checkpoint never resumed."""
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["train", "--params", flow_params], env={"WORLD_SIZE": "2"})
    assert out.exit_code == 2 and "name it with --run-dir" in out.output, out.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("tags", "said"),
    [
        ({"dapo.flow": "dpo", "mlflow.source.name": "dapo dpo"}, "`dapo dpo train` with"),
        ({"dapo.flow": "reward_model"}, "`dapo reward-model train` with"),
        ({"dapo.flow": "compare"}, "reproduce one of its method runs"),
    ],
)
def test_reproduce_refuses_a_run_it_cannot_make_again(flow_cfg, monkeypatch, tags, said):
    """A preference model's run or a comparison's parent is not re-run as a DAPO pipeline (it
    was): one line that names the command that makes it again, and nothing runs."""
    from flows import pipeline
    from tasks.tracking import store

    def ran(*args, **kwargs):
        raise AssertionError("a pipeline ran")

    info = {"tags": tags, "config": flow_cfg.to_dict(), "params": {}, "metrics": {}}
    monkeypatch.setattr(store, "read_run", lambda run_id, uri=None: info)
    monkeypatch.setattr(pipeline, "pipeline_flow", ran)
    out = CliRunner().invoke(app, ["reproduce", "0123abcd"])
    assert out.exit_code != 0 and "Traceback" not in out.output
    assert "run 0123abcd was made by" in out.output and said in out.output, out.output


def test_reproduce_reruns_a_comparisons_rl_method_as_a_pipeline(flow_cfg, monkeypatch):
    from flows import pipeline
    from flows.reproduce import reproduce_run
    from tasks.tracking import store

    tags = {"dapo.flow": "compare", "method": "grpo"}
    info = {"tags": tags, "config": flow_cfg.to_dict(), "params": {}, "metrics": {}}
    monkeypatch.setattr(store, "read_run", lambda run_id, uri=None: info)
    ran = []
    monkeypatch.setattr(pipeline, "pipeline_flow", lambda **kw: ran.append(kw) or {"ok": 1})
    out = reproduce_run("0123abcd", progress=False)
    assert out["result"] == {"ok": 1} and ran[0]["tags"] == {"reproduces": "0123abcd"}


def test_reproduce_into_a_folder_of_something_else_is_refused_its_own_continues(
    flow_cfg, monkeypatch, tmp_path
):
    """--run-name of another run's folder rewrote its config.json and logged a FINISHED run
    that trained nothing; a folder of other files was filled with a run. Both are refused,
    untouched; the folder of this run's own stopped reproduction is continued."""
    import json

    from dapo_core.config_loader import resolve
    from flows import pipeline
    from flows.reproduce import reproduce_run
    from tasks.tracking import store

    cfg = resolve(flow_cfg.to_dict(), overrides=[f"train.out_dir={tmp_path}"])
    info = {"tags": {}, "config": cfg.to_dict(), "params": {}, "metrics": {}}
    monkeypatch.setattr(store, "read_run", lambda run_id, uri=None: info)
    ran = []
    monkeypatch.setattr(pipeline, "pipeline_flow", lambda **kw: ran.append(kw) or {"ok": 1})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"train": {"steps": 40}}')
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "x.txt").write_text("hi")
    for name, said in (("other", "holds another run"), ("notes", "holds files not a run's")):
        before = sorted((p.name, p.read_bytes()) for p in (tmp_path / name).iterdir())
        with pytest.raises(PipelineError, match=f"{said}: pick another --run-name"):
            reproduce_run("0123abcd", run_name=name, progress=False)
        assert sorted((p.name, p.read_bytes()) for p in (tmp_path / name).iterdir()) == before
    assert ran == []
    own = tmp_path / "again"
    own.mkdir()
    (own / "logged_config.json").write_text(json.dumps(cfg.to_dict()))
    (own / "config.json").write_text("{}")  # its stopped training
    assert reproduce_run("0123abcd", run_name="again", progress=False)["result"] == {"ok": 1}
    assert reproduce_run("0123abcd", run_name="new", progress=False)["result"] == {"ok": 1}
    assert [kw["run_name"] for kw in ran] == ["again", "new"]


def test_a_stopped_reproduction_is_continued_by_reproduce_not_pipeline(tmp_path):
    """`dapo pipeline --run-name` would read params.yaml, not the original run's config."""
    from tasks.rundir import RunDir
    from tasks.training.task import resume_hint

    rd = RunDir(tmp_path / "reproduce-0123abcd")
    said = resume_hint("pipeline", rd, {"reproduces": "0123abcd"})
    assert said == "dapo reproduce 0123abcd --run-name reproduce-0123abcd"
    assert resume_hint("pipeline", rd) == (
        "dapo pipeline --run-name reproduce-0123abcd with the same -c and -S"
    )


def test_a_stopped_model_check_says_to_start_again_not_resume_its_scratch(monkeypatch):
    from dapo_core.errors import TrainingInterrupted
    from flows import models, stages

    def stopped(cfg, run, *args, **kwargs):
        raise TrainingInterrupted(f"Continue with: dapo train --resume {run}")

    monkeypatch.setattr(stages, "train_config", stopped)
    monkeypatch.setattr(models.shipped, "find", lambda key: ROOT / "checkpoints" / "tiny-arith")
    out = CliRunner().invoke(app, ["model", "check"])
    assert out.exit_code == 130 and "--resume" not in out.output
    assert "the reference run stopped; it is not kept: run the same command" in out.output


def test_reproduce_of_a_run_whose_reward_model_is_gone_says_so_and_runs_nothing(
    flow_cfg, monkeypatch, tmp_path
):
    """--check-only said the data and code match, and the re-run then failed once begun: a
    Prefect error line, a FAILED run and a folder of its files left behind."""
    from dapo_core.config_loader import resolve
    from flows import pipeline
    from flows.reproduce import reproduce_run
    from tasks.tracking import store

    gone = tmp_path / "rm"
    overrides = [f"train.out_dir={tmp_path / 'runs'}", "rollout.reward=model"]
    cfg = resolve(flow_cfg.to_dict(), overrides=[*overrides, f"rollout.reward_model={gone}"])
    info = {"tags": {}, "config": cfg.to_dict(), "params": {}, "metrics": {}}
    monkeypatch.setattr(store, "read_run", lambda run_id, uri=None: info)
    monkeypatch.setattr(pipeline, "pipeline_flow", lambda **kw: pytest.fail("a pipeline ran"))
    checked = reproduce_run("0123abcd", check_only=True)
    assert any(f"reward model {gone} is gone" in m for m in checked["mismatches"])
    with pytest.raises(PipelineError, match=f"cannot re-run 0123abcd: its reward model {gone}"):
        reproduce_run("0123abcd", progress=False)
    assert not (tmp_path / "runs").exists()
