"""The ``ablate`` flow: DAPO's Table 1 ladder, each variant trained and evaluated (over seeds).

One parent MLflow run (experiment ``<prefix>-ablate``) holds one nested run per variant and seed
(training and its final evaluation in the same child run). The parent logs the ablation table in
the paper's Table 1 order -- variant, avg@k with its 95% CI, steps, wall time, and the paper's AIME
2024 number beside ours -- as ``ablation/table.md`` and ``ablation/table.csv``, and a bar chart
``ablation/table.png``. The same files are written to the sweep's directory.

With several seeds, avg@k is the mean over seeds and the CI is a bootstrap over problems of the
seed-averaged per-problem accuracy. A variant that fails is reported in the table (status) and the
others still run; the flow then fails, naming the failed variants.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from prefect import flow

from dapo_core.ablation import ABLATION_LADDER, PAPER_TABLE1_AIME24, apply_variant
from dapo_core.config import ConfigError
from dapo_core.config_loader import resolve
from dapo_core.errors import PipelineError, TrainingInterrupted
from dapo_core.metrics import bootstrap_ci
from flows.pipeline import default_run_name, load_config, run_dir_for
from tasks.data.task import curate_task
from tasks.evaluation.task import evaluate_task
from tasks.orchestration import run_logger
from tasks.rundir import RunDir
from tasks.training.task import train_task

TABLE_COLUMNS = [
    "variant",
    "seeds",
    "avg_at_k",
    "ci_low",
    "ci_high",
    "avg_at_k_seed_std",
    "steps",
    "train_wall_s",
    "eval_wall_s",
    "paper_aime24",
    "status",
]


def ordered_variants(variants: list[str] | None) -> list[str]:
    """The requested variants in the paper's Table 1 order (all of them by default)."""
    if not variants:
        return list(ABLATION_LADDER)
    unknown = [v for v in variants if v not in ABLATION_LADDER]
    if unknown:
        raise ConfigError(f"unknown variant(s) {unknown}; choose from {list(ABLATION_LADDER)}")
    return [v for v in ABLATION_LADDER if v in variants]


def slug(variant: str) -> str:
    """A variant name fit for paths and metric names (``+clip_higher`` -> ``clip_higher``)."""
    return variant.lstrip("+")


def ablation_table(results: list[dict[str, Any]], cfg: Any) -> pd.DataFrame:
    """One row per variant from per-(variant, seed) results, in Table 1 order."""
    rows = []
    for variant in ABLATION_LADDER:
        mine = [r for r in results if r["variant"] == variant]
        if not mine:
            continue
        ok = [r for r in mine if r["status"] == "ok"]
        row: dict[str, Any] = {
            "variant": variant,
            "seeds": ",".join(str(r["seed"]) for r in mine),
            "paper_aime24": PAPER_TABLE1_AIME24[variant],
            "status": "ok" if len(ok) == len(mine) else "; ".join(r["status"] for r in mine),
        }
        if ok:
            avgs = [r["metrics"]["eval/avg_at_k"] for r in ok]
            if len(ok) == 1:
                low = ok[0]["metrics"]["eval/avg_at_k_ci_low"]
                high = ok[0]["metrics"]["eval/avg_at_k_ci_high"]
            else:  # bootstrap over problems of the seed-averaged per-problem accuracy
                acc = np.mean([r["per_problem"]["accuracy"].to_numpy() for r in ok], axis=0)
                low, high = bootstrap_ci(acc, cfg.eval.bootstrap_samples, seed=cfg.eval.seed)
            row.update(
                avg_at_k=float(np.mean(avgs)),
                ci_low=float(low),
                ci_high=float(high),
                avg_at_k_seed_std=float(np.std(avgs, ddof=1)) if len(avgs) > 1 else float("nan"),
                steps=int(np.mean([r["steps"] for r in ok])),
                train_wall_s=float(np.mean([r["train_wall_s"] for r in ok])),
                eval_wall_s=float(np.mean([r["eval_wall_s"] for r in ok])),
            )
        rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


@flow(name="ablate")
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
) -> pd.DataFrame:
    """Train and evaluate each Table 1 variant (cumulative switches) for each seed."""
    from tasks.tracking.plots import ablation_chart, save_figures
    from tasks.tracking.provenance import run_tags
    from tasks.tracking.tracker import Tracker, markdown_table

    log = run_logger()
    cfg = load_config(params, config, overrides)
    names = ordered_variants(variants)
    seeds = list(seeds) if seeds else [cfg.train.seed]
    if curate:
        curate_task(cfg)
    name = run_name or default_run_name("ablate")
    root = run_dir_for(cfg, name)
    parent = Tracker(cfg, "ablate")
    parent.start_or_resume(
        RunDir(root),
        name,
        run_tags(cfg, "ablate", variant="ladder", variants=",".join(names), seeds=seeds),
    )
    parent.log_params(
        {"ablate.variants": ",".join(names), "ablate.seeds": ",".join(map(str, seeds))}
    )
    results: list[dict[str, Any]] = []
    for variant in names:
        for seed in seeds:
            vcfg = apply_variant(resolve(cfg.to_dict(), overrides=[f"train.seed={seed}"]), variant)
            res: dict[str, Any] = {"variant": variant, "seed": seed}
            try:
                label = f"{variant} seed{seed}"
                trained = train_task.with_options(task_run_name=f"train {label}")(
                    vcfg,
                    str(root / slug(variant) / f"seed{seed}"),
                    kind="ablate",
                    run_name=label,
                    variant=variant,
                    parent_run_id=parent.run_id,
                    progress=progress,
                )
                evaluated = evaluate_task.with_options(task_run_name=f"evaluate {label}")(
                    vcfg,
                    trained.model_path,
                    eval_set,
                    kind="ablate",
                    run_id=trained.mlflow_run_id,
                    step=trained.steps,
                    run_dir=trained.run_dir,
                    progress=progress,
                )
            except TrainingInterrupted:  # Ctrl-C stops the sweep, not just this variant
                parent.end("KILLED")
                raise
            except Exception as e:  # noqa: BLE001 - one failed variant does not stop the sweep
                log.error("ablate: %s seed %d failed: %s", variant, seed, e)
                res["status"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
                results.append(res)
                continue
            res.update(
                status="ok",
                metrics=evaluated.metrics,
                per_problem=evaluated.per_problem,
                steps=trained.steps,
                train_wall_s=trained.wall_time_s,
                eval_wall_s=evaluated.wall_time_s,
                run_id=trained.mlflow_run_id,
            )
            results.append(res)
            parent.log_metrics(
                {f"avg_at_k/{slug(variant)}/seed{seed}": evaluated.metrics["eval/avg_at_k"]}, 0
            )
    table = ablation_table(results, cfg)
    # One series over the ladder (step = the rung's index in Table 1), so the parent run charts
    # the whole ladder as one line with its CI band, rather than one bar chart per variant.
    for row in table.itertuples(index=False):
        if row.status == "ok":
            rung = list(ABLATION_LADDER).index(row.variant)
            ladder = {"avg_at_k": row.avg_at_k, "ci_low": row.ci_low, "ci_high": row.ci_high}
            parent.log_metrics({f"ladder/{k}": v for k, v in ladder.items()}, rung)
            parent.log_metrics({f"avg_at_k/{slug(row.variant)}": row.avg_at_k}, 0)
    parent.log_table(table.to_dict("records"), "ablation/table.json")  # a table in the UI
    figure = ablation_chart(table[table["status"] == "ok"])
    root.mkdir(parents=True, exist_ok=True)
    table.to_csv(root / "ablation.csv", index=False)
    (root / "ablation.md").write_text(markdown_table(table))
    save_figures({"ablation.png": figure}, root)
    parent.log_frame(table, "ablation/table.csv")
    parent.log_frame(table, "ablation/table.md")
    parent.log_figure(figure, "ablation/table.png")
    failed = [f"{r['variant']} seed {r['seed']}" for r in results if r["status"] != "ok"]
    parent.end("FAILED" if failed else "FINISHED")
    log.info("ablate: table written to %s and to MLflow run %s", root, parent.run_id)
    if failed:
        raise PipelineError(f"ablation variants failed: {', '.join(failed)} (see the table)")
    return table
