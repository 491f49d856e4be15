"""The ``ablate`` flow: DAPO's Table 1 ladder, or algorithms of the family, each variant trained
and evaluated over seeds.

Each (variant, seed) is its own flow run of ``ablate-run`` (train, then evaluate, in one MLflow
run nested under the sweep's parent run):

- in this process, one after another (``pool=None``), or
- submitted to a Prefect work pool (``pool``): workers pick the runs up, concurrently, on this
  machine (``dapo ablate --workers N`` starts a local server and N workers, ``flows.cluster``) or
  on others. A child whose training fails is retried (the train task, then, on a pool, the whole
  flow run once more) and continues from its last checkpoint; a child that still fails is
  reported in the table and does not stop the others.

A sweep that stops early (Ctrl-C, SIGTERM, or an error in this process) first cancels its
unfinished flow runs on the pool, found by their ``sweep:<run name>`` tag: queued ones at once,
running ones through their workers, which stop the processes; the flow run of the sweep itself
ends CANCELLED and the command says in one line what it cancelled and how to resume.

The parent gathers every child from MLflow as it finishes (so remote workers need only share the
tracking server) and logs the ablation table (``tasks.evaluation.ablation``): avg@k with its CI per
variant, each rung's paired difference to the one before, every mechanism's own signal, and the
paper's numbers in their own column; plus a chart with separate panels. The same files are
written to the sweep's directory.

Variants are Table 1 rungs or algorithm presets (``dapo_core.ablation.ALGORITHM_PRESETS``). Rungs
alone run in Table 1 order, each compared with the rung before (the ladder is cumulative: the
difference is one switch's). As soon as a preset is among them, or ``baseline`` is given, they
run in the order given and each is compared with the baseline (by default the first given), with
the same paired statistics: algorithms are not a ladder, and "each against the one before" would
compare, say, CISPO with GSPO for no reason.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import pandas as pd
from prefect import flow
from prefect.exceptions import TerminationSignal
from prefect.states import Cancelled

from dapo_core import metric_names as metric
from dapo_core.ablation import (
    ABLATION_LADDER,
    apply_variant,
    comparison_baseline,
    ordered_variants,
    split_sweep_overrides,
)
from dapo_core.ablation_stats import PROBES, SIGNALS, probe_steps, probed_switch, run_signals
from dapo_core.config import Config
from dapo_core.config_loader import from_dict, resolve
from dapo_core.errors import PipelineError, TrainingInterrupted
from flows.signals import collector_for_work
from flows.stages import default_run_name, keep_sweep_settings, load_config, run_dir_for
from flows.sweep_pool import Stopped, check_pool, describe, on_pool, stop_runs
from tasks.data.task import curate_task
from tasks.evaluation.ablation import ablation_table, mechanism_table
from tasks.evaluation.task import evaluate_task
from tasks.orchestration import (
    cancelled_when_interrupted,
    crashed_when_killed,
    publish_markdown,
    run_logger,
)
from tasks.rundir import RunDir
from tasks.signals import deferred_signals
from tasks.training.task import train_task

SIGNAL_METRICS = sorted(
    {s.metric for s in SIGNALS} | {m for p in PROBES.values() for m in (p.on, p.off)}
)
"""The per-step metrics the sweep reads back from each child (its signals and probes)."""


def slug(variant: str) -> str:
    """A variant name fit for paths and metric names (``+clip_higher`` -> ``clip_higher``)."""
    return variant.lstrip("+")


@dataclass(frozen=True)
class Child:
    """One (variant, seed) run of the sweep: its config, directory and label."""

    variant: str
    seed: int
    cfg: Config
    run_dir: str

    @property
    def label(self) -> str:
        return f"{self.variant} seed{self.seed}"


@flow(name="ablate-run", flow_run_name="{variant} seed{seed}")
@cancelled_when_interrupted
def ablate_run_flow(
    config: dict[str, Any],
    variant: str,
    seed: int,
    run_dir: str,
    parent_run_id: str | None,
    eval_set: str | None = None,
    progress: bool = False,
) -> str | None:
    """Train and evaluate one variant and seed (``config`` is its whole resolved config, so a
    worker on another machine needs nothing else); returns its MLflow run id. Training continues
    from the run's last checkpoint: a retried train task, or a resubmitted child, redoes only the
    steps after it."""
    collector_for_work()  # a worker's flow-run process has not (a command's already has)
    cfg = from_dict(config)
    trained = train_task.with_options(task_run_name=f"train {variant} seed{seed}")(
        cfg,
        run_dir,
        kind="ablate",
        run_name=f"{variant} seed{seed}",
        variant=variant,
        parent_run_id=parent_run_id,
        progress=progress,
    )
    evaluate_task.with_options(task_run_name=f"evaluate {variant} seed{seed}")(
        cfg,
        trained.model_path,
        eval_set,
        kind="ablate",
        run_id=trained.mlflow_run_id,
        step=trained.steps,
        run_dir=trained.run_dir,
        progress=progress,
    )
    return trained.mlflow_run_id


@flow(name="ablate")
@crashed_when_killed  # its own interrupt handling; a SIGKILL ends it CRASHED
def ablate_flow(
    params: str | None = None,
    config: list[str] | None = None,
    overrides: list[str] | None = None,
    variants: list[str] | None = None,
    seeds: list[int] | None = None,
    eval_set: str | None = None,
    run_name: str | None = None,
    curate: bool = True,
    progress: bool = True,
    pool: str | None = None,
    baseline: str | None = None,
    resume_with: str | None = None,
) -> pd.DataFrame:
    """Train and evaluate each Table 1 variant (cumulative switches) or algorithm for each seed;
    with ``pool``, as flow runs of the ``ablate-run`` deployment on that work pool. ``baseline``:
    the variant the others are compared with (``comparison_baseline``). ``resume_with``: the
    command a stop's message gives to resume (default: the same command with ``--run-name``).

    Interrupted (Ctrl-C, SIGTERM), the flow run ends CANCELLED and the call raises
    TrainingInterrupted, whose message says what was cancelled and how to resume; the parent
    MLflow run ends KILLED. Returning the state rather than raising keeps Prefect from logging the
    interruption as an error with its call stack."""
    from tasks.tracking.provenance import run_tags
    from tasks.tracking.tracker import Tracker

    log = run_logger()
    names = ordered_variants(variants)
    base, tuned = split_sweep_overrides(names, overrides or [])
    cfg = load_config(params, config, base)
    baseline = comparison_baseline(names, baseline)
    seeds = list(seeds) if seeds else [cfg.train.seed]
    if pool:
        check_pool(pool)  # before anything is written or tracked
    if curate:
        curate_task(cfg)
    name = run_name or default_run_name("ablate")
    keep_sweep_settings(cfg, tuned, name)  # before the parent run or its tables are touched
    root = run_dir_for(cfg, name)
    children = [
        Child(v, s, _child_config(cfg, v, s, tuned[v]), str(root / slug(v) / f"seed{s}"))
        for v in names
        for s in seeds
    ]
    parent = Tracker(cfg, "ablate")
    parent.start_or_resume(
        RunDir(root),
        name,
        run_tags(
            cfg,
            "ablate",
            variant="ladder" if baseline is None else f"vs {baseline}",
            variants=",".join(names),
            seeds=seeds,
        ),
    )
    results: list[dict[str, Any]] = []
    runs = (
        on_pool(ablate_run_flow, children, parent.run_id, eval_set, pool, name)
        if pool
        else _in_process(children, parent.run_id, eval_set, progress)
    )
    try:
        parent.log_params(
            {"ablate.variants": ",".join(names), "ablate.seeds": ",".join(map(str, seeds))}
        )
        with closing(runs):  # its client is closed before the clean-up below opens another
            for child, status in runs:
                res = _result(cfg, parent.run_id, child, status)
                results.append(res)
                done = f"{len(results)}/{len(children)}"
                if res["status"] == "ok":
                    key = f"avg_at_k/{slug(child.variant)}/seed{child.seed}"
                    parent.log_metrics({key: res["avg_at_k"]}, 0)
                    log.info("ablate: %s %s: avg@k %.4f", done, child.label, res["avg_at_k"])
                else:
                    log.error("ablate: %s %s %s", done, child.label, res["status"])
    except (KeyboardInterrupt, TerminationSignal, TrainingInterrupted) as e:  # Ctrl-C, SIGTERM
        with deferred_signals():  # a second Ctrl-C would leave the runs queued
            cancelled = stop_runs(name, pool) if pool else None
            parent.end("KILLED")
        message = stopped_message(name, len(results), len(children), cancelled, e, resume_with)
        return Cancelled(message=message, data=TrainingInterrupted(message))
    except BaseException as e:
        with deferred_signals():
            cancelled = stop_runs(name, pool) if pool else None
            if cancelled and any(cancelled):
                log.error("ablate: sweep %s failed (%s); %s", name, e, describe(cancelled))
            parent.end("FAILED")
        raise
    table = log_tables(parent, results, cfg, root, names, baseline)
    failed = [f"{r['variant']} seed {r['seed']}" for r in results if r["status"] != "ok"]
    view = parent.save_runs_view(
        re.sub(r"[^A-Za-z0-9_-]", "-", name), f"ablation {name}", children_view(parent.run_id)
    )
    table.attrs["mlflow_view"] = view
    _publish(name, table, parent.run_url(), view)
    parent.end("FAILED" if failed else "FINISHED")
    log.info("ablate: tables written to %s and to MLflow run %s", root, parent.run_id)
    if view:
        log.info("ablate: every run side by side in MLflow (`dapo ui` serves it): %s", view)
    if failed:
        raise PipelineError(f"ablation variants failed: {', '.join(failed)} (see the table)")
    return table


def stopped_message(
    name: str,
    done: int,
    total: int,
    cancelled: Stopped | None,
    cause: BaseException,
    resume_with: str | None = None,
) -> str:
    """One line: what the stop left behind and how to go on."""
    where = f"sweep {name} stopped with {done} of {total} runs finished"
    if cancelled is not None:
        where += f"; {describe(cancelled)}"
    elif isinstance(cause, TrainingInterrupted):  # in process: the child says where it stopped
        where += f"; {str(cause).split('. Continue with:')[0]}"  # its advice is the sweep's, below
    if resume_with:
        return f"{where}; to resume: {resume_with}"
    return f"{where}; to resume, run the same command with --run-name {name}"


def children_view(
    parent_id: str | None, by: str = "variant", metrics: Sequence[str] | None = None
) -> dict[str, Any]:
    """The MLflow runs table for a sweep: its child runs only, one row each, with the columns a
    reader compares (the ``by`` tag, seed, avg@k and, by default, each switch's signal)."""
    if metrics is None:
        metrics = [metric.AVG_AT_K, *sorted({s.metric for s in SIGNALS}), metric.ENTROPY_DELTA]
    return {
        "searchFilter": f"tags.mlflow.parentRunId = '{parent_id}'",
        # one row per variant, its seeds averaged and expandable (MLflow's "Group by")
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": by}],
        },
        "selectedColumns": [f"tags.`{t}`" for t in (by, "seed")]
        + [f"metrics.`{m}`" for m in metrics],
    }


def _result(cfg: Config, parent_id: str | None, child: Child, status: str) -> dict[str, Any]:
    """One row of results: the child's gathered results, or its failure."""
    res: dict[str, Any] = {"variant": child.variant, "seed": child.seed, "status": status}
    if status == "ok":
        try:
            res.update(gather(cfg, parent_id, child))
        except Exception as e:  # noqa: BLE001 - a child we cannot read is a failed row
            res["status"] = f"failed: could not read its results: {e}"[:300]
    return res


def _child_config(cfg: Config, variant: str, seed: int, tuned: Sequence[str] = ()) -> Config:
    """The variant's config for one seed, probing the rung's switch where its signal is read by
    a probe (``dapo_core.ablation_stats.probed_switch``), its preset's entries ``tuned``
    (``dapo_core.ablation.split_sweep_overrides``)."""
    overrides = [f"train.seed={seed}"]
    if switch := probed_switch(variant):
        overrides.append(f"tracking.switch_probe={switch}")
    return apply_variant(resolve(cfg.to_dict(), overrides=overrides), variant, tuned)


def _in_process(children: list[Child], parent_id, eval_set, progress):
    """Each child as a flow run in this process, one after another: (child, status)."""
    for child in children:
        try:
            ablate_run_flow(
                child.cfg.to_dict(),
                child.variant,
                child.seed,
                child.run_dir,
                parent_id,
                eval_set,
                progress,
            )
        except TrainingInterrupted:
            raise
        except Exception as e:  # noqa: BLE001 - one failed child does not stop the sweep
            yield child, f"failed: {type(e).__name__}: {str(e)[:200]}"
            continue
        yield child, "ok"


def gather(cfg: Config, parent_id: str | None, child: Child) -> dict[str, Any]:
    """A finished child's results, read back from MLflow (where any worker logged them)."""
    from tasks.tracking import store

    uri = store.tracking_uri(cfg)
    found = store.search_runs(
        cfg,
        "ablate",
        f"tags.mlflow.parentRunId = '{parent_id}' and tags.variant = '{child.variant}' "
        f"and tags.seed = '{child.seed}'",
    )
    if not found:
        raise PipelineError(f"{child.label} finished but its MLflow run is not under the sweep")
    run = max(found, key=lambda r: r["metrics"].get(metric.AVG_AT_K) is not None)
    metrics, run_id = run["metrics"], run["run_id"]
    eval_name = run["tags"].get("eval.set", cfg.eval.eval_set)
    per_problem = pd.read_csv(
        io.StringIO(store.read_artifact_text(run_id, f"eval/{eval_name}/per_problem.csv", uri))
    )
    history: dict[int, dict[str, float]] = {}
    for name in SIGNAL_METRICS:
        for step, value in store.metric_history(run_id, name, uri):
            history.setdefault(step, {})[name] = value
    steps = [history[s] for s in sorted(history)]
    return {
        "run_id": run_id,
        "metrics": metrics,
        "avg_at_k": metrics[metric.AVG_AT_K],
        "per_problem": per_problem[["problem_id", "accuracy"]],
        "signals": run_signals(steps),
        "probes": {name: probe_steps(steps, p) for name, p in PROBES.items()},
        "steps": int(run["tags"].get("train.steps_done", 0)),
        "train_wall_s": float(run["tags"].get("train.wall_s", "nan")),
        "eval_wall_s": metrics.get(metric.EVAL_TIME, float("nan")),
    }


def _publish(name: str, table: pd.DataFrame, run_url: str | None, view: str | None) -> None:
    """The ablation table as the sweep's Prefect artifact, linking to its MLflow runs."""
    from tasks.tracking.artifacts import markdown_table

    links = [f"[the parent MLflow run]({run_url})"] if run_url else []
    links += [f"[every run side by side]({view})"] if view else []
    text = f"# Ablation {name}\n\n{markdown_table(table)}\n\n{', '.join(links)}\n"
    publish_markdown(f"ablation-{name}", text, f"dapo ablate {name}: avg@k per variant")


def log_tables(
    parent: Any,
    results: list[dict[str, Any]],
    cfg: Config,
    root,
    names: list[str] | None = None,
    baseline: str | None = None,
) -> pd.DataFrame:
    """The ablation and mechanism tables and the chart: to the parent run and to ``root``."""
    from tasks.tracking.artifacts import markdown_table
    from tasks.tracking.plots import ablation_chart, save_figures

    n_boot, seed = cfg.eval.bootstrap_samples, cfg.eval.seed
    table = ablation_table(results, n_boot, seed, variants=names, baseline=baseline)
    mechanisms = mechanism_table(results, n_boot, seed)
    # One series per quantity over the ladder (step = the rung's index in Table 1; against a
    # baseline, the variant's place in the table), so the parent run charts the whole sweep as
    # one line rather than one bar chart per variant.
    order = list(ABLATION_LADDER) if baseline is None else list(table["variant"])
    for row in table[table["status"] == "ok"].to_dict("records"):
        rung = order.index(row["variant"])
        ladder = {k: row[k] for k in ("avg_at_k", "ci_low", "ci_high")}
        ladder.update({f"signal_{s.name}": row[s.name] for s in SIGNALS})
        parent.log_metrics({f"ladder/{k}": v for k, v in ladder.items() if pd.notna(v)}, rung)
        parent.log_metrics({f"avg_at_k/{slug(row['variant'])}": row["avg_at_k"]}, 0)
    figure = ablation_chart(table[table["status"] == "ok"], mechanisms)
    root.mkdir(parents=True, exist_ok=True)
    # (frame, its file name in the sweep's directory, in the parent run's ablation/ artifacts)
    outputs = ((table, "ablation", "table"), (mechanisms, "mechanisms", "mechanisms"))
    for frame, local, logged in outputs:
        frame.to_csv(root / f"{local}.csv", index=False)
        (root / f"{local}.md").write_text(markdown_table(frame))
        parent.log_table(frame.to_dict("records"), f"ablation/{logged}.json")  # a UI table
        parent.log_frame(frame, f"ablation/{logged}.csv")
        parent.log_frame(frame, f"ablation/{logged}.md")
    save_figures({"ablation.png": figure}, root)
    parent.log_figure(figure, "ablation/table.png")
    table.attrs["mechanisms"] = mechanisms  # for the command's report
    table.attrs["baseline"] = baseline
    table.attrs["dir"] = str(root)
    return table
