"""The Table 1 ablation flow: a parent MLflow run, one child per variant, the table artifacts."""

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dapo_core.ablation import ABLATION_LADDER, PAPER_TABLE1_AIME24
from dapo_core.config import ConfigError
from dapo_core.config_loader import resolve
from flows.ablate import ablation_table, ordered_variants
from tasks.tracking import store


def test_variants_run_in_table1_order():
    assert ordered_variants(None) == list(ABLATION_LADDER)
    assert ordered_variants(["+dynamic_sampling", "grpo"]) == ["grpo", "+dynamic_sampling"]
    with pytest.raises(ConfigError, match="unknown variant"):
        ordered_variants(["dapo"])


def _result(variant, seed, per_problem_acc):
    acc = np.array(per_problem_acc, dtype=float)
    return {
        "variant": variant,
        "seed": seed,
        "status": "ok",
        "metrics": {
            "eval/avg_at_k": float(acc.mean()),
            "eval/avg_at_k_ci_low": float(acc.mean()) - 0.1,
            "eval/avg_at_k_ci_high": float(acc.mean()) + 0.1,
        },
        "per_problem": pd.DataFrame({"accuracy": acc}),
        "steps": 2,
        "train_wall_s": 1.0,
        "eval_wall_s": 0.5,
    }


def test_ablation_table_over_seeds(tiny_cfg):
    results = [
        _result("+clip_higher", 0, [1.0, 0.0, 0.5, 0.5]),
        _result("grpo", 0, [0.0, 0.0, 0.5, 0.5]),
        _result("grpo", 1, [1.0, 0.0, 0.5, 0.5]),
        {"variant": "+dynamic_sampling", "seed": 0, "status": "failed: OSError: disk full"},
    ]
    table = ablation_table(results, tiny_cfg)
    assert list(table["variant"]) == ["grpo", "+clip_higher", "+dynamic_sampling"]  # Table 1
    grpo, clip, ds = (table.iloc[i] for i in range(3))
    assert grpo["seeds"] == "0,1" and grpo["avg_at_k"] == pytest.approx(0.375)
    assert grpo["avg_at_k_seed_std"] == pytest.approx(np.std([0.25, 0.5], ddof=1))
    assert grpo["ci_low"] <= grpo["avg_at_k"] <= grpo["ci_high"]  # pooled bootstrap
    assert clip["ci_low"] == pytest.approx(0.4) and math.isnan(clip["avg_at_k_seed_std"])
    assert [grpo["paper_aime24"], clip["paper_aime24"]] == [30.0, 38.0]
    assert ds["status"].startswith("failed") and math.isnan(ds["avg_at_k"])


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
    assert "ablation/table.json" in arts
    csv = store.read_artifact_text(parent["run_id"], "ablation/table.csv")
    logged = pd.read_csv(io.StringIO(csv))
    assert list(logged["variant"]) == list(ABLATION_LADDER)
    md = store.read_artifact_text(parent["run_id"], "ablation/table.md")
    assert md.splitlines()[0].startswith("| variant | seeds | avg_at_k | ci_low | ci_high")
    sweep = Path(cfg.train.out_dir) / "ablate-test"  # the same files in the sweep's directory
    assert {"ablation.csv", "ablation.md", "ablation.png"} <= {p.name for p in sweep.iterdir()}
    print(f"ablate flow (6 variants x 1 step + eval): {elapsed:.1f}s")
