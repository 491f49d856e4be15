"""The ``compare`` flow: PPO against a learned reward, DPO, GRPO and DAPO from the same warm
start, over seeds, and the table the seeds argue about (stability, variance, sample efficiency;
``dapo_core.comparison`` says how each is read).

For each seed, in this process, one after another:

1. ``pairs``: the warm-started policy's own groups on training problems, a correct response over
   an incorrect one (``tasks.preferences.pairs``), and a reward model trained on them
   (``tasks.preferences.reward_model``); the methods that learn from preferences use that seed's;
2. each method: ``ppo_rm`` (the ``ppo`` preset with its critic, ``rollout.reward=model`` against
   the seed's reward model, the KL penalty in the reward: ``PPO_RM_KL``), ``dpo`` (offline DPO
   with the NLL term on the seed's pairs, validated after each epoch), ``grpo`` (Table 1's
   baseline) and ``dapo`` (the full recipe), the last two on the rule-based reward; then its
   final policy evaluated on the evaluation set.

A method's cost includes what it needed first: ``ppo_rm``'s wall time and responses include the
mining and the reward model's training, ``dpo``'s the mining. Every run, RL or DPO, leaves
``metrics.jsonl`` and ``validation.jsonl`` in its directory and a nested MLflow run under the
comparison's parent (experiment ``dapo-compare``); the parent gets the table, the chart and the
warm start's scores. A finished run keeps its ``record.json``: the same command with
``--run-name`` after an interruption redoes only what was not finished (training itself resumes
from its last checkpoint).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow
from prefect.exceptions import TerminationSignal
from prefect.states import Cancelled

from dapo_core import metric_names as metric
from dapo_core.comparison import (
    PREFERENCE_METHODS,
    check_methods,
    method_configs,
    split_methods_overrides,
)
from dapo_core.config import Config
from dapo_core.config_loader import resolve
from dapo_core.errors import TrainingInterrupted
from flows.ablate import children_view
from flows.stages import default_run_name, keep_sweep_settings, load_config, run_dir_for
from tasks.data.task import curate_task
from tasks.evaluation.comparison import (
    DPO_KEYS,
    RL_KEYS,
    RunRecord,
    comparison_table,
    curves_figure,
    run_record,
    terminal_table,
)
from tasks.evaluation.task import evaluate_task
from tasks.orchestration import (
    crashed_when_killed,
    publish_markdown,
    run_logger,
)
from tasks.rundir import RunDir
from tasks.signals import deferred_signals
from tasks.training.task import train_task

PPO_RM_KL = ["algo.kl.name=k1", "algo.kl.where=reward", "algo.kl.beta=0.3"]
"""InstructGPT's per-token KL penalty in the reward (Ouyang et al. 2022), for ppo_rm unless the
config sets a KL: without it, PPO against this task's reward model trades accuracy for the
learned reward; at beta 0.1 one seed in five still collapsed, at 0.3 none did
(docs/guide/preferences.md)."""
MINE_PROMPTS, MINE_PER_GROUP = 800, 4  # `dapo pairs mine`'s defaults
VIEW_METRICS = [metric.AVG_AT_K, metric.ACC_MEAN, metric.REWARD_MEAN, metric.GRAD_NORM]


@flow(name="compare")
@crashed_when_killed  # its own interrupt handling; a SIGKILL ends it CRASHED
def compare_flow(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    methods: list[str] | None = None,
    seeds: list[int] | None = None,
    eval_set: str | None = None,
    run_name: str | None = None,
    curate: bool = True,
    progress: bool = True,
) -> pd.DataFrame | Cancelled:
    """See the module docstring. Returns the table (``attrs``: its directory, the terminal
    version, the MLflow parent run); interrupted, the flow run ends CANCELLED with the line that
    says how to resume."""
    from tasks.tracking.provenance import run_tags
    from tasks.tracking.tracker import Tracker

    log = run_logger()
    names = check_methods(methods)
    base, tuned = split_methods_overrides(overrides or [])
    cfg = load_config(params, config, base)
    seeds = list(seeds) if seeds else [cfg.train.seed]
    for s in seeds:  # every config checked before anything runs
        method_configs(cfg, tuned, s)
    if curate:
        curate_task(cfg)
    name = run_name or default_run_name("compare")
    keep_sweep_settings(cfg, tuned, name)  # a finished run's record holds for these settings only
    root = run_dir_for(cfg, name)
    parent = Tracker(cfg, "compare")
    parent.start_or_resume(
        RunDir(root),
        name,
        run_tags(cfg, "compare", methods=",".join(names), seeds=",".join(map(str, seeds))),
    )
    records: list[RunRecord] = []
    try:
        parent.log_params({"compare.methods": ",".join(names), "compare.seeds": seeds})
        warm = _warm_start(cfg, eval_set, root / "warm_start.json")
        parent.log_metrics(
            {"warm_start/avg_at_k": warm["avg_at_k"], "warm_start/val": warm["val"]}, 0
        )
        for s in seeds:
            configs = method_configs(cfg, tuned, s)
            prefs = _preferences(configs["dapo"], root / f"seed{s}", s, parent.run_id, names, log)
            for m in names:
                record = _method(
                    m, s, configs, prefs, root, warm, eval_set, parent.run_id, progress
                )
                records.append(record)
                if record.status == "ok":
                    parent.log_metrics({f"avg_at_k/{m}/seed{s}": record.avg_at_k}, 0)
                    log.info("compare: %s seed %d: avg@k %.3f", m, s, record.avg_at_k)
                else:
                    log.error("compare: %s seed %d %s", m, s, record.status)
    except (KeyboardInterrupt, TerminationSignal, TrainingInterrupted) as e:
        with deferred_signals():
            parent.end("KILLED")
        why = f" ({e})" if str(e) else ""  # a training run says where it stopped
        message = (
            f"comparison {name} stopped with {len(records)} runs finished{why}; to resume, run "
            f"the same command with --run-name {name}"
        )
        return Cancelled(message=message, data=TrainingInterrupted(message))
    except BaseException:
        with deferred_signals():
            parent.end("FAILED")
        raise
    table = _report(parent, root, records, names, warm, cfg.eval.n_samples)
    view = parent.save_runs_view(
        re.sub(r"[^A-Za-z0-9_-]", "-", name),
        f"compare {name}",
        children_view(parent.run_id, by="method", metrics=VIEW_METRICS),
    )
    link = f"\n\n[The parent MLflow run]({parent.run_url()})" if parent.run_url() else ""
    publish_markdown(
        f"compare-{name}",
        f"# Comparison {name}\n\n```\n{table.attrs['terminal']}\n```{link}\n",
        f"dapo compare {name}: stability, update variance, sample efficiency",
    )
    parent.end("FINISHED" if all(r.status == "ok" for r in records) else "FAILED")
    table.attrs |= {"dir": str(root), "run_id": parent.run_id, "warm": warm, "mlflow_view": view}
    table.attrs["failed"] = [
        f"{r.method} seed {r.seed} ({r.status})" for r in records if r.status != "ok"
    ]
    return table


def _warm_start(cfg: Config, eval_set: str | None, cache: Path) -> dict[str, Any]:
    """The warm-started policy's avg@k on the evaluation set (each method's starting point, and
    the collapse threshold's reference) and on the validation split (each curve's first point);
    computed once per comparison."""
    if cache.exists():
        return json.loads(cache.read_text())
    from tasks.data.splits import eval_problems, splits
    from tasks.evaluation.evaluate import evaluate_policy
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.rollout.factory import make_generator
    from tasks.runtime import configure_torch

    device = configure_torch(cfg.train.cpu_threads)
    path = resolve_model_path(cfg)
    model, tokenizer = load_policy(path, cfg.model.dtype, device)
    generator = make_generator(cfg, model, tokenizer, path)
    _, problems = eval_problems(cfg, eval_set)
    test = evaluate_policy(generator, tokenizer, problems, cfg, progress=False).as_validation
    val = evaluate_policy(generator, tokenizer, splits(cfg).val, cfg, progress=False).as_validation
    warm = {"avg_at_k": test["val/avg_at_k"], "val": val["val/avg_at_k"]}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(warm))
    return warm


def _preferences(
    cfg: Config, seed_dir: Path, seed: int, parent_id: str | None, names: list[str], log
) -> dict[str, Any] | None:
    """The seed's pairs and reward model (when a method needs them), with what they cost."""
    if not PREFERENCE_METHODS & set(names):
        return None
    from tasks.preferences.pairs import mine_to_file, read_pairs
    from tasks.preferences.reward_model import train_reward_model

    done = seed_dir / "preferences.json"
    if done.exists():
        return json.loads(done.read_text())
    pairs, rm_dir = seed_dir / "pairs.parquet", seed_dir / "reward-model"
    t0 = time.perf_counter()
    if not pairs.exists():
        mine_to_file(cfg, pairs, MINE_PROMPTS, MINE_PER_GROUP, seed, dvc=False)
    provenance = read_pairs(str(pairs)).provenance
    mine_s = time.perf_counter() - t0
    log.info("compare: seed %d: %s", seed, f"{provenance['groups']} groups mined in {mine_s:.0f} s")
    t0 = time.perf_counter()
    rm = None
    if "ppo_rm" in names:
        rm = train_reward_model(
            cfg,
            str(pairs),
            rm_dir,
            seed=seed,
            extra_tags={"variant": "reward_model", "method": "reward_model"},
            run_name=f"reward model seed{seed}",
            kind="compare",
            parent_run_id=parent_id,
        )
        log.info("compare: seed %d: reward model held-out accuracy %.3f", seed, rm.heldout_accuracy)
    prefs = {
        "pairs": str(pairs),
        "reward_model": str(rm_dir) if rm else None,
        "reward_model_accuracy": rm.heldout_accuracy if rm else None,
        "responses": provenance["groups"] * cfg.rollout.group_size,
        "mine_s": mine_s,
        "reward_model_s": time.perf_counter() - t0 if rm else 0.0,
    }
    done.write_text(json.dumps(prefs))
    return prefs


def _method(
    method: str,
    seed: int,
    configs: dict[str, Config],
    prefs: dict[str, Any] | None,
    root: Path,
    warm: dict[str, Any],
    eval_set: str | None,
    parent_id: str | None,
    progress: bool,
) -> RunRecord:
    """One (method, seed): trained, evaluated and read into a record; a failure is a record with
    its reason (the others go on), an interruption stops the comparison."""
    run_dir = root / method / f"seed{seed}"
    done = run_dir / "record.json"
    if done.exists():
        return RunRecord(**json.loads(done.read_text()))
    t0 = time.perf_counter()
    try:
        if method == "dpo":
            record, evaluated = _dpo(
                configs["dapo"], seed, prefs, run_dir, warm, eval_set, parent_id
            )
            before = prefs["mine_s"]
        else:
            record, evaluated = _rl(
                method, seed, configs, prefs, run_dir, warm, eval_set, parent_id, progress
            )
            before = prefs["mine_s"] + prefs["reward_model_s"] if method == "ppo_rm" else 0.0
    except (KeyboardInterrupt, TerminationSignal, TrainingInterrupted):
        raise
    except Exception as e:  # noqa: BLE001 - one failed run does not stop the comparison
        return RunRecord(method, seed, status=f"failed: {type(e).__name__}: {str(e)[:200]}")
    m = evaluated.metrics
    record.avg_at_k = m["eval/avg_at_k"]
    record.ci_low, record.ci_high = m["eval/avg_at_k_ci_low"], m["eval/avg_at_k_ci_high"]
    record.wall_s = before + time.perf_counter() - t0
    done.write_text(json.dumps(record.as_dict()))
    return record


def _rl(method, seed, configs, prefs, run_dir, warm, eval_set, parent_id, progress):
    cfg = configs[method]
    responses_before = 0.0
    if method == "ppo_rm":
        learned = ["rollout.reward=model", f"rollout.reward_model={prefs['reward_model']}"]
        kl = PPO_RM_KL if cfg.algo.kl.name == "none" else []
        cfg = resolve(cfg.to_dict(), overrides=learned + kl)
        responses_before = prefs["responses"]
    label = f"{method} seed{seed}"
    trained = train_task.with_options(task_run_name=f"train {label}")(
        cfg,
        str(run_dir),
        kind="compare",
        run_name=label,
        variant=method,
        parent_run_id=parent_id,
        progress=progress,
        extra_tags={"method": method},
    )
    evaluated = evaluate_task.with_options(task_run_name=f"evaluate {label}")(
        cfg,
        trained.model_path,
        eval_set,
        kind="compare",
        run_id=trained.mlflow_run_id,
        step=trained.steps,
        run_dir=trained.run_dir,
        progress=progress,
    )
    record = run_record(method, seed, str(run_dir), RL_KEYS, warm["val"], responses_before)
    return record, evaluated


def _dpo(cfg, seed, prefs, run_dir, warm, eval_set, parent_id):
    from tasks.preferences.dpo import train_dpo

    rd, model_dir = RunDir(run_dir), run_dir / "model"
    run_dir.mkdir(parents=True, exist_ok=True)

    def on_step(step: int, total: int, m: dict) -> None:
        if "dpo/grad_norm" in m:
            rd.append_metrics(step, m)
        if "val/avg_at_k" in m:
            rd.append_validation(step, {k: v for k, v in m.items() if k.startswith("val/")})

    if not model_dir.exists():
        trained = train_dpo(
            cfg,
            prefs["pairs"],
            model_dir,
            seed=seed,
            on_step=on_step,
            extra_tags={"variant": "dpo", "method": "dpo"},
            run_name=f"dpo seed{seed}",
            kind="compare",
            parent_run_id=parent_id,
            validate=True,
        )
        run_id, steps = trained.run_id, trained.steps
        (run_dir / "trained.json").write_text(json.dumps({"run_id": run_id, "steps": steps}))
    else:  # trained before an interruption; only the evaluation was missing
        done = json.loads((run_dir / "trained.json").read_text())
        run_id, steps = done["run_id"], done["steps"]
    evaluated = evaluate_task.with_options(task_run_name=f"evaluate dpo seed{seed}")(
        cfg, str(model_dir), eval_set, kind="compare", run_id=run_id, step=steps, progress=False
    )
    record = run_record("dpo", seed, str(run_dir), DPO_KEYS, warm["val"], prefs["responses"])
    return record, evaluated


def _report(parent, root: Path, records: list[RunRecord], names, warm, k: int) -> pd.DataFrame:
    """The table, its terminal version and the chart: in the comparison's directory and on the
    MLflow parent run."""
    table = comparison_table(records, names, warm["avg_at_k"])
    short = terminal_table(table, k)
    table.attrs["terminal"] = short
    table.to_csv(root / "comparison.csv", index=False)
    (root / "comparison.txt").write_text(short + "\n")
    with (root / "records.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(r.as_dict()) + "\n")
    figure = curves_figure(records, names, k)
    figure.savefig(root / "sample_efficiency.png", dpi=120)
    parent.log_frame(table, "comparison.csv")
    parent.log_text(short, "comparison.txt")
    parent.log_figure(figure, "sample_efficiency.png")
    parent.log_text((root / "records.jsonl").read_text(), "records.jsonl")
    return table
