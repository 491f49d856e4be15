"""The Table 1 ablation flow: a parent MLflow run, one child per variant, the table artifacts."""

import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dapo_core.ablation import (
    ABLATION_LADDER,
    PAPER_TABLE1_AIME24,
    comparison_baseline,
    ordered_variants,
)
from dapo_core.ablation_stats import MECHANISM_SIGNALS
from dapo_core.config import ConfigError
from dapo_core.config_loader import resolve
from tasks.evaluation.ablation import SIGNAL_NAMES, ablation_table, mechanism_table
from tasks.tracking import store


def test_variants_run_in_table1_order():
    assert ordered_variants(None) == list(ABLATION_LADDER)
    assert ordered_variants(["+dynamic_sampling", "grpo"]) == ["grpo", "+dynamic_sampling"]
    with pytest.raises(ConfigError, match="unknown variant"):
        ordered_variants(["grpo", "+clip_lower"])


def test_algorithms_run_in_the_order_given_against_a_baseline():
    assert ordered_variants(["gspo", "dapo", "gspo"]) == ["gspo", "dapo"]  # each once
    assert ordered_variants(["+clip_higher", "grpo_kl"]) == ["+clip_higher", "grpo_kl"]
    with pytest.raises(ConfigError) as err:
        ordered_variants(["dapo", "gpso"])
    message = str(err.value)  # one line: the wrong name, then every valid one
    assert "\n" not in message and message.startswith(
        "unknown variant(s) gpso; Table 1 rungs: grpo"
    )
    assert message.endswith(
        "algorithms: dapo, dr_grpo, gspo, cispo, rloo, reinforce_pp, grpo_kl, ppo, "
        "one_step_off, staleness_2; did you mean 'gspo'?"
    )
    assert comparison_baseline(["grpo", "+clip_higher"], None) is None  # the ladder
    assert comparison_baseline(["gspo", "dapo"], None) == "gspo"  # the first given
    assert comparison_baseline(["gspo", "dapo"], "dapo") == "dapo"
    assert comparison_baseline(["grpo", "+clip_higher"], "grpo") == "grpo"
    with pytest.raises(ConfigError, match=r"^--baseline cispo is not among the variants \(gspo,"):
        comparison_baseline(["gspo", "dapo"], "cispo")


def test_ablation_table_against_a_baseline():
    """Each algorithm against the baseline, paired by seed and problem; not against the row
    before it (grpo_kl - gspo would be 0.5 on p0, not 0.25)."""
    results = [
        _result("dapo", 0, [0.5, 0.5, 0.0, 0.0]),
        _result("gspo", 0, [0.0, 0.5, 0.0, 0.0]),
        _result("grpo_kl", 0, [1.0, 0.5, 0.0, 0.5]),
        _result("dapo", 1, [0.5, 0.5, 0.5, 0.0]),
        _result("grpo_kl", 1, [0.5, 0.5, 0.5, 0.0]),
    ]
    table = ablation_table(
        results, n_boot=200, variants=["dapo", "gspo", "grpo_kl"], baseline="dapo"
    )
    assert list(table["variant"]) == ["dapo", "gspo", "grpo_kl"]
    dapo, gspo, kl = (table.iloc[i] for i in range(3))
    assert math.isnan(dapo["delta"]) and pd.isna(dapo["delta_vs"])  # the baseline itself
    # gspo ran seed 0 only: -0.5 on p0 of 4 problems
    assert gspo["delta"] == pytest.approx(-0.125) and gspo["delta_vs"] == "dapo"
    # grpo_kl over seeds 0 and 1: (+0.5 + 0.5 on p0, p3 of seed 0; 0 on seed 1) / 8
    assert kl["delta"] == pytest.approx(0.125) and kl["delta_vs"] == "dapo"
    assert kl["delta_ci_low"] <= kl["delta"] <= kl["delta_ci_high"]
    assert math.isnan(kl["paper_aime24"])  # not a Table 1 rung
    # a baseline whose runs all failed: rows, but no differences
    failed = [r for r in results if r["variant"] != "dapo"]
    failed.append({"variant": "dapo", "seed": 0, "status": "failed: boom"})
    table = ablation_table(failed, n_boot=50, variants=["dapo", "gspo"], baseline="dapo")
    assert table["delta"].isna().all()


def _result(variant, seed, per_problem_acc, probes=None, **signals):
    acc = np.array(per_problem_acc, dtype=float)
    return {
        "probes": probes or {},
        "variant": variant,
        "seed": seed,
        "status": "ok",
        "metrics": {"eval/avg_at_k": float(acc.mean())},
        "per_problem": pd.DataFrame(
            {"problem_id": [f"p{i}" for i in range(acc.size)], "accuracy": acc}
        ),
        "signals": {name: signals.get(name, 0.0) for name in SIGNAL_NAMES},
        "steps": 2,
        "train_wall_s": 1.0,
        "eval_wall_s": 0.5,
    }


def test_ablation_table_over_seeds():
    results = [
        _result("+overlong_filtering", 0, [1.0, 0.0, 0.5, 0.5]),
        _result("grpo", 0, [0.0, 0.0, 0.5, 0.5]),
        _result("grpo", 1, [1.0, 0.0, 0.5, 0.5]),
        {"variant": "+dynamic_sampling", "seed": 0, "status": "failed: OSError: disk full"},
    ]
    table = ablation_table(results, n_boot=200)
    assert list(table["variant"]) == ["grpo", "+overlong_filtering", "+dynamic_sampling"]
    grpo, filt, ds = (table.iloc[i] for i in range(3))
    assert grpo["seeds"] == "0,1" and grpo["avg_at_k"] == pytest.approx(0.375)
    assert grpo["avg_at_k_seed_std"] == pytest.approx(np.std([0.25, 0.5], ddof=1))
    assert grpo["ci_low"] <= grpo["avg_at_k"] <= grpo["ci_high"]  # pooled bootstrap
    assert math.isnan(grpo["delta"])  # the first rung has nothing before it
    # paired on the seed both ran (0), problem by problem: +1 on p0, 0 elsewhere
    assert filt["delta"] == pytest.approx(0.25) and filt["delta_ci_high"] <= 1.0
    assert filt["delta_vs"] == "grpo" and pd.isna(grpo["delta_vs"])
    assert filt["delta_ci_low"] >= 0.0 and math.isnan(filt["avg_at_k_seed_std"])
    assert [grpo["paper_aime24"], filt["paper_aime24"]] == [30.0, 36.0]
    assert ds["status"].startswith("failed") and math.isnan(ds["avg_at_k"])


def _ladder_results(seeds, rng):
    """Every rung of Table 1 over ``seeds``, 64 problems, with every mechanism signal logged."""
    return [
        _result(
            variant,
            s,
            rng.uniform(0.2 + 0.05 * i, 0.6 + 0.05 * i, 64),
            {"entropy_probe": np.stack([np.full(5, 0.91), np.full(5, 0.9100081)], axis=1)},
            **{name: rng.uniform(0.1, 0.9) for name in SIGNAL_NAMES},
        )
        for i, variant in enumerate(ABLATION_LADDER)
        for s in seeds
    ]


def test_a_change_reads_to_its_ci_and_an_identical_rung_says_so():
    from flows.report import _change

    assert _change(0.0213, -0.011, 0.052, False) == "+0.02 [-0.01, +0.05] ~0"
    assert _change(2.2e-05, -2.3e-05, 6.3e-05, False) == "+2e-05 [-2e-05, +6e-05] ~0"
    assert _change(0.0, 0.0, 0.0, False) == "0 (the same runs)"  # not +0e+00 [+0e+00, +0e+00]


@pytest.mark.parametrize("seeds", [[0, 1, 2, 3, 4], [0]])
def test_the_report_fits_80_columns(seeds):
    """Issue 26: the tables a sweep prints fit a terminal of 80 columns with one line per row
    (no cell wrapped or cut), and rows whose change has no CI (one seed) are said so once."""
    from rich.console import Console

    from flows.report import report_ablation

    results = _ladder_results(seeds, np.random.default_rng(0))
    table = ablation_table(results, n_boot=200)
    table.attrs.update(mechanisms=mechanism_table(results, n_boot=200), dir="runs/sweep")
    out = Console(width=80, record=True, file=io.StringIO())
    report_ablation(table, out)
    text = out.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    for variant in ABLATION_LADDER:  # each row whole on one line: name, avg@k, its CI
        assert any(re.match(rf"{re.escape(variant)} +0\.\d+ +0\.\d+-0\.\d+ ", ln) for ln in lines)
    for variant, signals in MECHANISM_SIGNALS.items():
        for signal, _ in signals:
            assert any(re.match(rf"{re.escape(variant)} +{signal} +[+-]\d", ln) for ln in lines)
    # one seed: differences over problems have a CI, per-run signals none: one line says so
    assert text.count("without a CI need 2+ seeds") == (len(seeds) == 1)
    assert "needs 2+ seeds" not in text and "…" not in text and "runs/sweep" in text


def test_the_comparison_report_keeps_its_links_whole_in_80_columns():
    """A pipe or a log is 80 columns wide to rich: the MLflow view's URL was cut in two there
    ("...workflowType=ma" / "chine_learning"), and could not be copied."""
    from rich.console import Console

    from flows.report import report_comparison

    url = "http://127.0.0.1:5000/#/experiments/1/runs?searchFilter=" + "x" * 90
    table = pd.DataFrame()
    table.attrs.update(terminal="table", warm={"avg_at_k": 0.5}, dir="runs/cmp", mlflow_view=url)
    out = Console(width=80, record=True, file=io.StringIO())
    report_comparison(table, out)
    assert any(line.endswith(url) for line in out.export_text().splitlines())


def test_done_says_what_this_attempt_trained():
    """A resumed run's "done:" counted the earlier attempts' steps as its own, and a resume of
    a finished run said "done: 30 steps in 3s" having trained nothing."""
    from flows.report import trained

    assert trained(40, 0, 52.4) == "40 steps in 52s"
    assert trained(40, 30, 13.0) == "steps 31-40 in 13s"
    assert trained(30, 30, 3.0) == "the run was complete already (30 steps)"


def test_mechanism_table_pairs_each_switch_with_its_signal():
    acc = [0.5, 0.5]

    def probe(s):  # (steps, [on, off]): the probe's per-step readings; runs differ in length
        off = 0.1 + 0.01 * s + 0.003 * np.arange(3 + s % 2)
        return np.stack([off + 0.002, off], axis=1)

    results = [
        r
        for s in range(4)
        for r in (
            _result("+overlong_filtering", s, acc, entropy=0.10 + 0.01 * s),
            # +0.05 on every seed; within each of its steps, on - off = +0.002
            _result("+clip_higher", s, acc, {"entropy_probe": probe(s)}, entropy=0.15 + 0.01 * s),
            _result("+overlong_shaping", s, acc, truncated_frac=0.1 * (s % 2)),  # 0 or 0.1
        )
    ]
    table = mechanism_table(results, n_boot=300).set_index(["variant", "signal"], drop=False)
    assert list(table["variant"]) == ["+clip_higher"] * 3 + ["+overlong_shaping"] * 2  # no grpo
    probed = table.loc[("+clip_higher", "entropy_probe")]  # paired within each step
    assert probed["delta"] == pytest.approx(0.002) and probed["ci_low"] == pytest.approx(0.002)
    assert probed["value"] - probed["previous"] == pytest.approx(0.002)
    assert probed["as_paper"] == "yes"
    clip = table.loc[("+clip_higher", "entropy")]
    shaping = table.loc[("+overlong_shaping", "truncated_frac")]
    assert clip["signal"] == "entropy" and clip["paper_direction"] == "up"
    assert clip["delta"] == pytest.approx(0.05) and clip["ci_low"] == pytest.approx(0.05)
    assert clip["distinguishable"] and clip["as_paper"] == "yes"
    assert shaping["signal"] == "truncated_frac" and shaping["paper_direction"] == "down"
    assert shaping["delta"] == pytest.approx(0.05)  # up, against the paper: never "yes"
    assert shaping["as_paper"] == "no"
    one_seed = [r for r in results if r["seed"] == 0]  # a per-run signal over one seed: no CI
    single = mechanism_table(one_seed, n_boot=100).set_index(["variant", "signal"])
    assert single.loc[("+clip_higher", "entropy"), "as_paper"] == "needs 2+ seeds"
    assert not single.loc[("+clip_higher", "entropy"), "distinguishable"]
    unprobed = [{**r, "probes": {}} for r in results]  # trained without tracking.switch_probe
    row = mechanism_table(unprobed, n_boot=100).set_index(["variant", "signal"])
    assert row.loc[("+clip_higher", "entropy_probe"), "as_paper"] == "not probed"


@pytest.mark.slow
def test_ablate_flow_parent_with_six_children(flows_env, flow_cfg, tmp_path):
    import json
    import time

    from flows.ablate import ablate_flow

    cfg = resolve(flow_cfg.to_dict(), overrides=["train.steps=1", "eval.every_n_steps=0"])
    params = tmp_path / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    t0 = time.perf_counter()
    table = ablate_flow(params=str(params), run_name="ablate-test", progress=False)
    elapsed = time.perf_counter() - t0
    assert list(table["variant"]) == list(ABLATION_LADDER)
    assert (table["status"] == "ok").all() and (table["steps"] == 1).all()
    assert list(table["paper_aime24"]) == list(PAPER_TABLE1_AIME24.values())

    (parent,) = [r for r in store.search_runs(cfg, "ablate") if r["name"] == "ablate-test"]
    assert parent["status"] == "FINISHED" and parent["tags"]["variant"] == "ladder"
    children = store.search_runs(cfg, "ablate", f"tags.mlflow.parentRunId = '{parent['run_id']}'")
    assert sorted(c["tags"]["variant"] for c in children) == sorted(ABLATION_LADDER)
    for c in children:
        assert c["status"] == "FINISHED" and "eval/avg_at_k" in c["metrics"]
        assert c["params"]["algo.clip_higher"] == json.dumps(
            ABLATION_LADDER[c["tags"]["variant"]]["clip_higher"]
        )
        # the rung whose signal a probe reads probes its own switch; the others do not probe
        probing = c["tags"]["variant"] == "+clip_higher"
        assert c["params"]["tracking.switch_probe"] == ("clip_higher" if probing else "null")
        assert ("probe/entropy_delta" in c["metrics"]) == probing
    # the ladder as one series over the rungs (step = Table 1 index), with its CI
    ladder = store.metric_history(parent["run_id"], "ladder/avg_at_k")
    assert [s for s, _ in ladder] == list(range(len(ABLATION_LADDER)))
    assert [v for _, v in ladder] == pytest.approx(list(table["avg_at_k"]))
    lows = [v for _, v in store.metric_history(parent["run_id"], "ladder/ci_low")]
    assert all(lo <= v for lo, (_, v) in zip(lows, ladder, strict=True))
    children_names = sorted(c["name"] for c in children)
    assert children_names == sorted(f"{v} seed{cfg.train.seed}" for v in ABLATION_LADDER)
    arts = set(store.list_artifacts(parent["run_id"]))
    assert {"ablation/table.csv", "ablation/table.md", "ablation/table.png"} <= arts
    # ... and the table is the sweep's Prefect artifact, linking to its MLflow runs
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        only = ArtifactFilter(key=ArtifactFilterKey(any_=["ablation-ablate-test"]))
        (artifact,) = client.read_artifacts(artifact_filter=only)
    assert artifact.type == "markdown" and "+dynamic_sampling" in artifact.data
    assert parent["run_id"] in artifact.data  # the parent run's page
    assert {"ablation/table.json", "ablation/mechanisms.csv", "ablation/mechanisms.json"} <= arts
    mechanisms = table.attrs["mechanisms"]  # one row per rung after grpo, its own signal
    expected = [(v, s) for v, signals in MECHANISM_SIGNALS.items() for s, _ in signals]
    assert list(zip(mechanisms["variant"], mechanisms["signal"], strict=True)) == expected
    token_level = mechanisms.set_index(["variant", "signal"]).loc[
        ("+token_level_loss", "long_weight_share")
    ]
    assert token_level["value"] >= token_level["previous"]  # weight moves to long responses
    probed = mechanisms.set_index(["variant", "signal"]).loc[("+clip_higher", "entropy_probe")]
    assert math.isfinite(probed["value"]) and math.isfinite(probed["previous"])
    csv = store.read_artifact_text(parent["run_id"], "ablation/table.csv")
    logged = pd.read_csv(io.StringIO(csv))
    assert list(logged["variant"]) == list(ABLATION_LADDER)
    md = store.read_artifact_text(parent["run_id"], "ablation/table.md")
    assert md.splitlines()[0].startswith("| variant | seeds | avg_at_k | ci_low | ci_high")
    sweep = Path(cfg.train.out_dir) / "ablate-test"  # the same files in the sweep's directory
    assert {"ablation.csv", "ablation.md", "ablation.png", "mechanisms.md"} <= {
        p.name for p in sweep.iterdir()
    }
    # A saved runs-table view of the sweep: its filter finds exactly the children, and every
    # column it shows is a tag or metric of theirs (some signals only some variants log).
    from mlflow import MlflowClient

    exp = MlflowClient(store.tracking_uri(cfg)).get_experiment_by_name(
        store.experiment_name(cfg, "ablate")
    )
    envelope = json.loads(exp.tags["mlflow.sharedViewState.ablate-test"])
    assert envelope["name"] == "ablation ablate-test" and envelope["createdAt"] > 0
    view = json.loads(envelope["state"])
    found = store.search_runs(cfg, "ablate", view["searchFilter"])
    assert sorted(r["run_id"] for r in found) == sorted(c["run_id"] for c in children)
    (key,) = view["groupBy"]["groupByKeys"]  # one row per variant: a tag every child carries
    assert key["mode"] == "tag" and all(key["groupByData"] in c["tags"] for c in children)
    for column in view["selectedColumns"]:
        kind, key = re.fullmatch(r"(tags|metrics)\.`(.+)`", column).groups()
        assert any(key in c[kind] for c in children), column
    print(f"ablate flow (6 variants x 1 step + eval): {elapsed:.1f}s")


def _cli_env(tmp_path, mlflow_uri=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), HF_HUB_OFFLINE="1")
    if mlflow_uri:
        env["MLFLOW_TRACKING_URI"] = mlflow_uri
    return env


@pytest.mark.slow
def test_pool_without_a_shared_server_says_what_to_do(tmp_path):
    cmd = [sys.executable, "-m", "flows.cli", "ablate", "--pool", "gpu-nodes", "--seeds", "0"]
    out = subprocess.run(cmd, env=_cli_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--pool needs a Prefect server" in out.stderr and "Traceback" not in out.stderr
    home = tmp_path / "prefect"  # importing Prefect creates its home, but nothing ran
    assert not (home / "prefect.db").exists() and not (home / "logs").exists()


def test_a_failed_child_is_reported_and_the_others_still_run(tiny_cfg, monkeypatch):
    from dapo_core.errors import TrainingInterrupted
    from flows import ablate

    ran = []

    def fake_child(config, variant, seed, *args):
        ran.append((variant, seed))
        if variant == "+clip_higher":
            raise OSError("disk full")

    monkeypatch.setattr(ablate, "ablate_run_flow", fake_child)
    children = [
        ablate.Child(v, s, tiny_cfg, f"/x/{v}/{s}") for v in ABLATION_LADDER for s in (0, 1)
    ]
    statuses = {(c.variant, c.seed): st for c, st in ablate._in_process(children, "p", None, False)}
    assert len(ran) == 12 and len(statuses) == 12  # every child ran, failed or not
    assert statuses[("+clip_higher", 1)] == "failed: OSError: disk full"
    assert all(st == "ok" for (v, _), st in statuses.items() if v != "+clip_higher")

    def interrupted(config, variant, seed, *args):
        raise TrainingInterrupted("stopped at step 3")

    monkeypatch.setattr(ablate, "ablate_run_flow", interrupted)
    with pytest.raises(TrainingInterrupted):  # Ctrl-C stops the sweep, not just one child
        list(ablate._in_process(children, "p", None, False))


def test_on_a_pool_a_crashed_child_is_submitted_once_more(tiny_cfg, monkeypatch):
    """The parent's polling loop with Prefect faked: a child that crashes once is resubmitted
    (it resumes from its checkpoint) and succeeds; one that fails twice is a failed row."""
    import types

    import prefect.client.orchestration
    import prefect.deployments

    from flows import ablate, sweep_pool

    outcomes = {"grpo seed0": ["Crashed", "Completed"], "grpo seed1": ["Failed", "Failed"]}
    outcomes["+overlong_filtering seed0"] = ["Completed"]
    outcomes["+clip_higher seed0"] = ["Cancelled"]  # stopped on purpose: not submitted again
    submitted = []

    def fake_run_deployment(name, parameters, flow_run_name, **kwargs):
        assert kwargs["tags"] == ["sweep:sw"] and kwargs["work_queue_name"] is None  # own pool
        submitted.append(flow_run_name)
        return types.SimpleNamespace(id=f"{flow_run_name}#{submitted.count(flow_run_name)}")

    class State:
        def __init__(self, name):
            self.name, self.message = name, "boom" if name != "Completed" else None

        def is_final(self):
            return True

        def is_completed(self):
            return self.name == "Completed"

        def is_cancelled(self):
            return self.name == "Cancelled"

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read_work_pool(self, pool):
            return pool

        def read_flow_runs(self, **filters):  # no runs left by an earlier attempt
            return []

        def read_flow_run(self, run_id):
            label, attempt = run_id.split("#")
            return types.SimpleNamespace(state=State(outcomes[label][int(attempt) - 1]))

    deployment = types.SimpleNamespace(apply=lambda work_pool_name: None)
    flow = types.SimpleNamespace(to_deployment=lambda **kw: deployment)
    monkeypatch.setattr(prefect.deployments, "run_deployment", fake_run_deployment)
    monkeypatch.setattr(prefect.client.orchestration, "get_client", lambda **kw: Client())
    monkeypatch.setattr(sweep_pool, "POLL_S", 0.0)
    children = [
        ablate.Child(v, s, tiny_cfg, "/x")
        for v, s in (("grpo", 0), ("grpo", 1), ("+overlong_filtering", 0), ("+clip_higher", 0))
    ]
    runs = sweep_pool.on_pool(flow, children, "p", None, "pool", "sw")
    statuses = {c.label: st for c, st in runs}
    assert statuses["grpo seed0"] == "ok" and statuses["+overlong_filtering seed0"] == "ok"
    assert statuses["grpo seed1"] == "failed: Failed: boom"
    assert statuses["+clip_higher seed0"] == "cancelled: boom"
    assert sorted(submitted) == sorted([*outcomes] + ["grpo seed0", "grpo seed1"])  # 2 resubmits


def test_an_unknown_pool_is_refused_before_anything_is_written(flows_env, flow_cfg, tmp_path):
    from flows.ablate import ablate_flow

    params = tmp_path / "params.json"
    params.write_text(json.dumps(flow_cfg.to_dict()))
    with pytest.raises(ConfigError, match="no work pool named 'gpu-nodes'.*work-pool create"):
        ablate_flow(params=str(params), run_name="ablate-nopool", pool="gpu-nodes", progress=False)
    assert not (Path(flow_cfg.train.out_dir) / "ablate-nopool").exists()
    assert not [r for r in store.search_runs(flow_cfg, "ablate") if r["name"] == "ablate-nopool"]


@pytest.mark.slow
def test_ablate_flow_compares_algorithms_against_a_baseline(flows_env, flow_cfg, tmp_path):
    """Two algorithm presets, one step each: the table in the order given, grpo_kl against
    dapo, its KL term logged by its child, the parent tagged with the baseline."""
    from flows.ablate import ablate_flow

    cfg = resolve(flow_cfg.to_dict(), overrides=["train.steps=1", "eval.every_n_steps=0"])
    params = tmp_path / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    table = ablate_flow(
        params=str(params),
        variants=["grpo_kl", "dapo"],
        baseline="dapo",
        run_name="ablate-algos",
        progress=False,
    )
    assert list(table["variant"]) == ["grpo_kl", "dapo"] and (table["status"] == "ok").all()
    kl, dapo = table.iloc[0], table.iloc[1]
    assert kl["delta_vs"] == "dapo" and math.isfinite(kl["delta"])
    assert math.isnan(dapo["delta"]) and table.attrs["baseline"] == "dapo"
    (parent,) = [r for r in store.search_runs(cfg, "ablate") if r["name"] == "ablate-algos"]
    assert parent["tags"]["variant"] == "vs dapo"
    children = store.search_runs(cfg, "ablate", f"tags.mlflow.parentRunId = '{parent['run_id']}'")
    by_variant = {c["tags"]["variant"]: c for c in children}
    kl_params = by_variant["grpo_kl"]["params"]
    assert (kl_params["algo.kl.name"], kl_params["algo.kl.beta"]) == ("k3", "0.04")
    assert by_variant["grpo_kl"]["metrics"]["train/kl_mean"] == 0.0  # step 1: pi = pi_ref
    assert "train/kl_mean" not in by_variant["dapo"]["metrics"]
    md = store.read_artifact_text(parent["run_id"], "ablation/table.md")
    assert "| grpo_kl |" in md and "| dapo |" in md


@pytest.mark.parametrize(
    "args",
    [["ablate", "--variants", "nope"], ["compare", "--seeds", "x"]],
    ids=["ablate", "compare"],
)
def test_a_refused_sweep_makes_no_prefect_home(tmp_path, args):
    """Importing Prefect makes its home: a sweep refused for a typo left an empty .prefect/."""
    home = tmp_path / "prefect-home"
    env = {**os.environ, "PREFECT_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "error:" in done.stdout + done.stderr
    assert not home.exists()


@pytest.mark.parametrize("command", ["ablate", "compare"])
def test_a_sweep_continued_with_other_settings_is_refused_before_it_starts(
    flow_cfg, tmp_path, monkeypatch, command
):
    """``--run-name`` of a sweep that began with other -S: one line naming them, exit 2, before
    a server or a worker starts, and the sweep's record of its settings untouched (a changed
    -S failed every run of a finished sweep and wrote its table over with the failures)."""
    from typer.testing import CliRunner

    import flows.commands.sweeps
    from flows.cli import app
    from flows.stages import keep_sweep_settings

    cfg = resolve(flow_cfg.to_dict(), overrides=[f"train.out_dir={tmp_path / 'runs'}"])
    params = tmp_path / "params.json"
    params.write_text(json.dumps(cfg.to_dict()))
    variants = ["--variants", "grpo"] if command == "ablate" else ["--methods", "grpo"]
    began = resolve(cfg.to_dict(), overrides=["train.steps=30"])
    tuned = {"grpo": []} if command == "ablate" else {v: [] for v in ("ppo", "grpo", "dapo")}
    keep_sweep_settings(began, tuned, "s1")
    record = (tmp_path / "runs" / "s1" / "sweep_settings.json").read_text()
    monkeypatch.setattr(flows.commands.sweeps, "_server", lambda **kw: pytest.fail("started"))
    out = CliRunner().invoke(
        app, [command, "--params", str(params), *variants, "--run-name", "s1", "--no-curate"]
    )
    assert out.exit_code == 2, out.output
    assert f"began with other settings (config.train.steps 30 -> {cfg.train.steps})" in out.output
    assert "(the same -c and -S)" in out.output and "Traceback" not in out.output
    assert (tmp_path / "runs" / "s1" / "sweep_settings.json").read_text() == record


def test_a_stopped_sweep_gives_one_way_to_resume():
    """In process, the child's own advice ("Continue with: dapo ablate with the same
    --run-name") came before the sweep's, which says the same."""
    from dapo_core.errors import TrainingInterrupted
    from flows.ablate import stopped_message

    child = TrainingInterrupted(
        "stopped after step 3 of 8; last checkpoint: step 2 (x). Continue with: dapo ablate "
        "with the same --run-name (finished variants are kept); step 3 is redone"
    )
    said = stopped_message("b1", 1, 2, None, child)
    assert said == (
        "sweep b1 stopped with 1 of 2 runs finished; stopped after step 3 of 8; last checkpoint: "
        "step 2 (x); to resume, run the same command with --run-name b1"
    )
    # `dapo demo`'s ladder: `dapo demo` has no --run-name, so its advice is the command it ran
    demo = "dapo ablate -S train.steps=20 --no-curate --run-name b1"
    said = stopped_message("b1", 1, 2, None, child, resume_with=demo)
    assert said.endswith(f"step 2 (x); to resume: {demo}") and "same command" not in said
