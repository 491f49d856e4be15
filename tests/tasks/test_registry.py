"""Policies as MLflow models (issue 45, item 2): a run logs its policy as a LoggedModel by
reference, evaluations link their metrics to it, ``dapo register`` puts it in the Model Registry
under an alias, and a ``models:/`` URI loads it back; system metrics in a run's tab (item 3)."""

import time

import pytest

from dapo_core.config_loader import resolve
from dapo_core.errors import PipelineError
from mlflow import MlflowClient
from tasks.models.resolve import resolve_model_path
from tasks.tracking import registry
from tasks.tracking.store import MODEL_PATH_TAG
from tasks.tracking.tracker import Tracker


def _policy_dir(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def logged(tiny_cfg, fresh_mlflow_uri, tmp_path):
    """A finished run that logged one policy (step 5), evaluated twice (steps 5 and 5)."""
    final = _policy_dir(tmp_path / "run" / "final")
    t = Tracker(tiny_cfg, "train", uri=fresh_mlflow_uri)
    t.start_run("r", log_config=False)
    first = t.log_model(final, 5)
    again = t.log_model(final, 5)
    t.log_metrics({"eval/avg_at_k": 0.75, "not a number": "x"}, 5, again, ("test", "d1"))
    t.end()
    return t.run_id, first, again, final, fresh_mlflow_uri


def test_a_policy_is_one_logged_model_per_run_and_directory_with_its_metrics(logged):
    run_id, first, again, final, uri = logged
    assert first and first == again  # the evaluation found the model training logged
    client = MlflowClient(uri)
    model = client.get_logged_model(first)
    assert model.source_run_id == run_id and model.status.to_proto() == 2  # READY
    assert model.tags[MODEL_PATH_TAG] == str(final.resolve())
    assert model.params["step"] == "5"
    ((key, value, step, name, digest),) = [
        (m.key, m.value, m.step, m.dataset_name, m.dataset_digest) for m in model.metrics
    ]
    assert (key, value, step, name, digest) == ("eval/avg_at_k", 0.75, 5, "test", "d1")
    # ... and the run's Model column: MLflow lists the model among the run's outputs
    outputs = client.get_run(run_id).outputs
    assert [m.model_id for m in outputs.model_outputs] == [first]


def test_register_moves_the_alias_and_a_models_uri_loads_the_directory(logged, tiny_cfg):
    run_id, model_id, _, final, uri = logged
    one = registry.register(run_id, uri=uri)
    assert (one.name, one.version, one.alias, one.model_id) == (
        "dapo-policy",
        "1",
        "champion",
        model_id,
    )
    assert registry.model_path("models:/dapo-policy@champion", uri) == str(final.resolve())
    # the same policy again: its version, not a second one (a duplicate version 2 was made)
    two = registry.register(model_id, alias="current", uri=uri)
    assert (two.version, two.new, one.new) == ("1", False, True)
    assert MlflowClient(uri).get_model_version_by_alias("dapo-policy", "current").version == 1
    assert registry.model_path("models:/dapo-policy/1", uri) == str(final.resolve())
    # the config's model.name_or_path takes the URI too (dapo train -S model.name_or_path=...)
    cfg = resolve(
        tiny_cfg.to_dict(),
        overrides=[
            "model.name_or_path=models:/dapo-policy@champion",
            f"tracking.tracking_uri={uri}",
        ],
    )
    assert resolve_model_path(cfg) == str(final.resolve())


@pytest.mark.parametrize(
    "ref, message",
    [
        ("models:/dapo-policy@nobody", "not in the Model Registry"),
        ("models:/dapo-policy", "name a version or an alias"),
        ("final", "not a run id"),
        ("0" * 32, "no MLflow run"),
        ("m-0123", "no logged model m-0123"),
    ],
)
def test_a_wrong_reference_is_one_line_saying_what_to_do(logged, ref, message):
    uri = logged[-1]
    registry.register(logged[0], uri=uri)
    with pytest.raises(PipelineError, match=message):
        if ref.startswith("models:/"):
            registry.model_path(ref, uri)
        else:
            registry.register(ref, uri=uri)


@pytest.mark.parametrize(
    "name, alias, message",
    [
        ("bad/name", "champion", "--name 'bad/name'"),
        ("a:b", "champion", "has no '/', ':' or quote"),
        ("it's", "champion", "has no '/', ':' or quote"),  # broke the version search's filter
        (" ", "champion", "is not empty"),
        ("dapo-policy", "two words", "--alias 'two words'"),
        ("dapo-policy", "v3", "a version's own name"),
        ("dapo-policy", "Latest", "neither 'latest'"),
        ("dapo-policy", "x" * 256, "at most 255"),
    ],
)
def test_a_name_or_alias_mlflow_refuses_registers_nothing(logged, name, alias, message):
    """Refused before the version is made: MLflow refused these after it, leaving a version
    without its alias (and a traceback)."""
    run_id, *_, uri = logged
    with pytest.raises(PipelineError, match=message):
        registry.register(run_id, name=name, alias=alias, uri=uri)
    assert MlflowClient(uri).search_model_versions() == []
    registry.check_names("dapo-policy", "Champion_2-b")  # what MLflow takes passes


def test_a_run_without_a_policy_or_a_deleted_directory_is_refused(logged, tiny_cfg, tmp_path):
    run_id, _, _, final, uri = logged
    t = Tracker(tiny_cfg, "train", uri=uri)
    t.start_run("empty", log_config=False)
    t.end()
    with pytest.raises(PipelineError, match="logged no policy.*dapo train --resume"):
        registry.register(t.run_id, uri=uri)
    policy = tmp_path / "dpo"
    policy.mkdir()
    dpo = Tracker(tiny_cfg, "dpo", uri=uri)
    dpo.start_run("dpo", {"dapo.flow": "dpo", "dpo.out_dir": str(policy)}, log_config=False)
    dpo.end()
    with pytest.raises(PipelineError, match=f"DPO policy is the directory {policy}: `dapo eval"):
        registry.register(dpo.run_id, uri=uri)
    registry.register(run_id, uri=uri)
    (final / "config.json").unlink()
    with pytest.raises(PipelineError, match="holds no model any more"):
        registry.model_path("models:/dapo-policy@champion", uri)


def test_system_metrics_sample_into_the_run_until_it_ends(tiny_cfg, fresh_mlflow_uri, capfd):
    t = Tracker(tiny_cfg, "train", uri=fresh_mlflow_uri)
    t.start_run("sys", log_config=False)
    t.start_system_metrics(0.2)
    deadline = time.monotonic() + 30
    client = MlflowClient(fresh_mlflow_uri)
    while not client.get_run(t.run_id).data.metrics and time.monotonic() < deadline:
        time.sleep(0.1)
    t.end()
    names = set(client.get_run(t.run_id).data.metrics)
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= names
    assert t._system_metrics is None  # stopped with the run
    # MLflow's INFO lines on starting and stopping the monitor are not printed in a command
    assert "system metrics" not in capfd.readouterr().err.lower()


def test_system_metrics_are_off_at_zero(tiny_cfg, fresh_mlflow_uri):
    t = Tracker(tiny_cfg, "train", uri=fresh_mlflow_uri)
    t.start_run("off", log_config=False)
    t.start_system_metrics(0)
    assert t._system_metrics is None
    t.end()


def test_the_nightly_promotion_rule_promotes_only_a_better_validation_score(
    tiny_cfg, fresh_mlflow_uri, tmp_path
):
    """``promote_if_better``: no champion yet -> promoted; a lower or equal score -> kept; a
    higher one -> promoted, the alias moved; a run with no validation score -> not promoted."""

    def run(name: str, score: float | None) -> str:
        t = Tracker(tiny_cfg, "train", uri=fresh_mlflow_uri)
        t.start_run(name, log_config=False)
        t.log_model(_policy_dir(tmp_path / name / "final"), 4)
        if score is not None:
            t.log_metrics({"val/avg_at_k": 0.9}, 2)  # an earlier step's: not the one compared
            t.log_metrics({"val/avg_at_k": score}, 4)
        t.end()
        return t.run_id

    uri = fresh_mlflow_uri
    first = registry.promote_if_better(run("first", 0.40), uri=uri)
    assert first.registered.version == "1" and first.champion is None
    assert "promoted to models:/dapo-policy@champion" in first.describe("dapo-policy", "champion")
    for kept in (0.35, 0.40):
        same = registry.promote_if_better(run(f"kept{kept}", kept), uri=uri)
        assert same.registered is None and same.champion == 0.40
        assert "does not beat" in same.describe("dapo-policy", "champion")
    better = registry.promote_if_better(run("better", 0.45), uri=uri)
    assert better.registered.version == "2" and better.champion == 0.40
    champion = MlflowClient(uri).get_model_version_by_alias("dapo-policy", "champion")
    assert str(champion.version) == "2"
    unscored = registry.promote_if_better(run("unscored", None), uri=uri)
    assert unscored.registered is None and "eval.every_n_steps" in unscored.describe("d", "c")
    # a champion chosen by hand (its run logged no score) is not overruled by the rule
    registry.register(run("by-hand", None), "picked", uri=uri)
    kept = registry.promote_if_better(run("scored", 0.99), "picked", uri=uri)
    assert kept.registered is None and "has no val/avg_at_k to beat" in kept.describe("p", "c")


def test_a_dpo_run_s_advice_names_a_policy_that_is_there(tmp_path):
    """An iterative DPO round's directory is gone once the rounds end: the advice named it all
    the same; it now names the last round's policy (the command's --out)."""
    from tasks.tracking.registry import _no_policy_advice

    out = tmp_path / "dpo-policy"
    out.mkdir()
    said = _no_policy_advice({"dapo.flow": "dpo", "dpo.out_dir": str(out)})
    assert said.startswith(f"its DPO policy is the directory {out}: `dapo evaluate --model {out}`")
    round_dir = tmp_path / ".dpo-policy.rounds" / "round2"
    said = _no_policy_advice({"dapo.flow": "dpo", "dpo.out_dir": str(round_dir)})
    assert f"not kept once the rounds ended; the last round's policy is {out}:" in said
    assert f"`dapo evaluate --model {out}`" in said
    gone = tmp_path / "moved"
    said = _no_policy_advice({"dapo.flow": "dpo", "dpo.out_dir": str(gone)})
    assert said == f"its DPO policy was the directory {gone}, which is no longer there"
