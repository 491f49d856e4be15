"""``dapo compare``: every method over seeds under one MLflow parent, the table and curves
written, a second call resumes from the records, and an interrupt leaves the parent KILLED (a
wrong method, refused before anything runs: test_cli_tracking)."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from dapo_core.errors import TrainingInterrupted
from dapo_core.reward import Score
from tasks.tracking import store


def _length_parity(response: str, answer: str) -> Score:
    """A stand-in for the rule when mining pairs: the session's tiny policy is never right, so
    its groups would give no pairs; response lengths differ, so these groups are mixed."""
    right = len(response) % 2 == 1
    return Score(1.0 if right else -1.0, right, None)


@pytest.fixture(scope="module")
def compared(flows_env, flow_params):
    from flows.compare import compare_flow
    from tasks.preferences import pairs

    params = flow_params
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pairs, "score", _length_parity)
        table = compare_flow(params=params, seeds=[0, 1], run_name="compare-test", progress=False)
    return params, table


def _children(cfg, parent_id):
    return store.search_runs(cfg, "compare", f"tags.mlflow.parentRunId = '{parent_id}'")


@pytest.mark.slow
def test_one_compare_sweep(compared, flow_cfg, subtests):
    """What one `dapo compare` sweep (two seeds) must show, each a subtest of one item: the sweep
    is the expensive part, and the suite's workers would each run it for a test of their own."""
    for check in (
        _every_method_and_seed_is_trained_evaluated_and_tabled,
        _the_methods_that_learn_from_preferences_pay_for_the_mined_responses,
        _the_runs_nest_under_one_parent_in_mlflow,
        _the_same_command_again_resumes_from_the_records,  # last: it runs the command again
    ):
        with subtests.test(check.__name__.strip("_")):
            check(compared, flow_cfg)


def _every_method_and_seed_is_trained_evaluated_and_tabled(compared, flow_cfg):
    from dapo_core.comparison import METHODS

    _, table = compared
    assert list(table["method"]) == list(METHODS) and (table["runs"] == "2/2").all()
    assert table["avg_at_k"].between(0, 1).all() and table["ci_low"].notna().all()
    by = table.set_index("method")
    assert math.isnan(by.loc["dpo", "advantage_var"])  # DPO has no advantages
    assert by.loc["ppo_rm", "advantage_var"] > 0  # (the tiny policy's rule-based groups, all
    # wrong, give GRPO zero advantages and DAPO's dynamic sampling no batch)
    assert (by.loc[["ppo_rm", "dpo"], "tokens"] > 0).all() and (table["wall_min"] > 0).all()
    root = Path(table.attrs["dir"])
    for name in ("comparison.csv", "comparison.txt", "sample_efficiency.png", "records.jsonl"):
        assert (root / name).stat().st_size > 0
    assert max(len(line) for line in table.attrs["terminal"].splitlines()) <= 80
    # the terminal table is the sweep's Prefect artifact, linking to its MLflow parent run
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        only = ArtifactFilter(key=ArtifactFilterKey(any_=["compare-compare-test"]))
        (artifact,) = client.read_artifacts(artifact_filter=only)
    assert table.attrs["terminal"] in artifact.data and table.attrs["run_id"] in artifact.data


def _the_methods_that_learn_from_preferences_pay_for_the_mined_responses(compared, flow_cfg):
    _, table = compared
    root = Path(table.attrs["dir"])
    records = [json.loads(line) for line in (root / "records.jsonl").read_text().splitlines()]
    for r in records:
        mined = json.loads((root / f"seed{r['seed']}" / "preferences.json").read_text())
        first_x = r["curve"][0][0]
        assert first_x == (mined["responses"] if r["method"] in ("ppo_rm", "dpo") else 0), r
        assert len(r["curve"]) > 1  # validated during training
    dpo = [r for r in records if r["method"] == "dpo"]
    assert all(r["responses"] == r["curve"][0][0] for r in dpo)  # nothing generated in training


def _the_runs_nest_under_one_parent_in_mlflow(compared, flow_cfg):
    from dapo_core.comparison import METHODS

    _, table = compared
    (parent,) = [r for r in store.search_runs(flow_cfg, "compare") if r["name"] == "compare-test"]
    assert parent["run_id"] == table.attrs["run_id"] and parent["status"] == "FINISHED"
    assert "warm_start/avg_at_k" in parent["metrics"]
    assert "viewStateShareKey=compare-test" in table.attrs["mlflow_view"]  # runs grouped by method
    children = _children(flow_cfg, parent["run_id"])
    got = sorted((c["tags"]["method"], c["tags"]["seed"]) for c in children)
    assert got == sorted((m, str(s)) for m in (*METHODS, "reward_model") for s in (0, 1))
    assert all(c["status"] == "FINISHED" for c in children)
    names = {c["name"] for c in children}
    assert {"dpo seed1", "reward model seed1", "ppo_rm seed1", "dapo seed0"} <= names
    for c in children:
        if c["tags"]["method"] in METHODS:
            assert "eval/avg_at_k" in c["metrics"], c["tags"]["method"]
        if c["tags"]["method"] == "ppo_rm":  # against the learned reward, KL in the reward
            assert "model" in c["params"]["rollout.reward"]
            assert "k1" in c["params"]["algo.kl.name"] and "reward" in c["params"]["algo.kl.where"]


def _the_same_command_again_resumes_from_the_records(compared, flow_cfg):
    from flows.compare import compare_flow

    params, table = compared
    before = len(_children(flow_cfg, table.attrs["run_id"]))
    again = compare_flow(params=params, seeds=[0, 1], run_name="compare-test", progress=False)
    pd.testing.assert_frame_equal(again, table)
    assert len(_children(flow_cfg, table.attrs["run_id"])) == before  # nothing retrained


def test_an_interrupt_ends_the_parent_killed_and_says_how_to_resume(
    flows_env, flow_cfg, flow_params, monkeypatch
):
    import flows.compare as compare

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "_method", stop)
    params = flow_params
    with pytest.raises(TrainingInterrupted, match="--run-name compare-stop"):
        compare.compare_flow(
            params=params, methods=["dapo"], run_name="compare-stop", progress=False
        )
    (parent,) = [r for r in store.search_runs(flow_cfg, "compare") if r["name"] == "compare-stop"]
    assert parent["status"] == "KILLED"


@pytest.mark.parametrize("kind, command", [("compare", "dapo compare"), ("ablate", "dapo ablate")])
def test_a_sweep_run_stopped_mid_training_points_back_to_its_sweep(tmp_path, kind, command):
    """Not `dapo train --resume DIR`, which a stopped comparison's message used to offer beside
    its own way to resume (the records say what the sweep has finished)."""
    from tasks.rundir import RunDir
    from tasks.training.task import resume_hint

    assert resume_hint(kind, RunDir(tmp_path / "run")).startswith(f"{command} with the same")


@pytest.mark.slow
def test_a_failed_run_is_in_the_table_and_fails_the_parent_the_others_go_on(
    flows_env, flow_cfg, flow_params, monkeypatch
):
    import flows.compare as compare

    real = compare._rl

    def broken_grpo(method, *args, **kwargs):
        if method == "grpo":
            raise RuntimeError("out of memory")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(compare, "_rl", broken_grpo)
    params = flow_params
    table = compare.compare_flow(
        params=params, methods=["grpo", "dapo"], run_name="compare-fail", progress=False
    )
    assert list(table["runs"]) == ["0/1", "1/1"]
    assert table.attrs["failed"] == ["grpo seed 0 (failed: RuntimeError: out of memory)"]
    (parent,) = [r for r in store.search_runs(flow_cfg, "compare") if r["name"] == "compare-fail"]
    assert parent["status"] == "FAILED"
    assert not (Path(table.attrs["dir"]) / "grpo" / "seed0" / "record.json").exists()  # redone
