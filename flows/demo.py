"""The demo that `make demo` runs: the pipeline, then a short Table 1 ablation (embedded default).

0. the DVC data stages (``dvc repro``), so that ``dvc status`` is clean afterwards (the pipeline
   itself skips them for the synthetic source, whose problems it generates);
1. ``dapo pipeline``: from the shipped tiny model (``checkpoints/tiny-arith``), DAPO
   training with validation every ``eval.every_n_steps`` steps, and the final evaluation, all in one
   MLflow run of the ``dapo-pipeline`` experiment;
2. ``dapo ablate`` with fewer steps per variant: the paper's ladder (naive GRPO -> ... -> DAPO), a
   parent MLflow run with one child per variant, and the ablation table beside the paper's numbers.

It ends by printing where to look.
"""

from __future__ import annotations

import time

from rich.console import Console

ABLATION_STEPS = 20  # per variant: a short ladder that still shows the rungs apart


def run_demo() -> None:
    from flows.ablate import ablate_flow
    from flows.pipeline import curate_flow, pipeline_flow
    from flows.report import report_ablation, report_pipeline
    from flows.stages import run_dir_for
    from tasks.params import load_params
    from tasks.tracking.store import experiment_name, experiment_urls

    console = Console()
    t0 = time.perf_counter()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cfg = load_params()
    pipeline_run, ablate_run = f"demo-pipeline-{stamp}", f"demo-ablate-{stamp}"

    console.rule("0/2  the DVC data stages (dvc repro): eval sets and the curated task")
    curate_flow(stages=["eval_sets", "curate"])  # the pipeline skips them for a synthetic source

    console.rule("1/2  dapo pipeline: curate -> train -> evaluate (embedded default)")
    report_pipeline(pipeline_flow(run_name=pipeline_run))

    console.rule(f"2/2  dapo ablate: the Table 1 ladder, {ABLATION_STEPS} steps per variant")
    overrides = [f"train.steps={ABLATION_STEPS}", "eval.every_n_steps=0"]
    again = " ".join(f"-S {o}" for o in overrides)
    table = ablate_flow(
        overrides=overrides,
        run_name=ablate_run,
        curate=False,  # step 0 ran the data stages
        # `dapo demo` has no --run-name: a stopped ladder is finished by the command it ran
        resume_with=f".venv/bin/dapo ablate {again} --no-curate --run-name {ablate_run}",
    )
    report_ablation(table)

    console.rule("where to look")
    console.print(f"training run:     {run_dir_for(cfg, pipeline_run)} (metrics.jsonl, final/)")
    console.print(f"ablation table:   {run_dir_for(cfg, ablate_run) / 'ablation.md'} (and .csv)")
    console.print("MLflow UI:        .venv/bin/dapo ui, then open")
    pipelines = experiment_urls(cfg).get(experiment_name(cfg, "pipeline"))
    for what, url in (
        ("the pipeline runs", pipelines),
        ("the ablation", table.attrs["mlflow_view"]),
    ):
        if url:
            console.print(f"                  {what}: {url}", highlight=False, soft_wrap=True)
    console.print("Prefect UI:       PREFECT_HOME=.prefect .venv/bin/prefect server start")
    console.print("                  -> http://127.0.0.1:4200 (this project's flow runs)")
    console.print(f"demo finished in {time.perf_counter() - t0:.0f}s")
