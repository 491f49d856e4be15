"""Commands that run many trainings as Prefect flows: ``pipeline``, ``ablate``, ``compare``
and ``schedule`` (cron deployments)."""

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from dapo_core.ablation import (
    ABLATION_LADDER,
    ALGORITHM_PRESETS,
    apply_variant,
    split_sweep_overrides,
)
from dapo_core.config import ConfigError
from dapo_core.errors import PipelineError
from flows.commands.base import (
    VARIANTS_HELP,
    ConfigOpt,
    CurateOpt,
    EvalSetOpt,
    ParamsOpt,
    RunNameOpt,
    SetOpt,
    _check_eval_set,
    _flow_args,
    _load,
    _orchestration_env,
    _seeds,
    _server,
    _split,
    _working,
    app,
    console,
    user_errors,
)
from flows.report import report_ablation, report_comparison, report_pipeline


@app.command("pipeline")
@user_errors
def pipeline(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variant: Annotated[str | None, typer.Option(help=VARIANTS_HELP)] = None,
    run_name: RunNameOpt = None,
    eval_set: EvalSetOpt = None,
    max_steps: Annotated[
        int | None, typer.Option(help="Train at most this many more steps in this run.", min=1)
    ] = None,
    curate: CurateOpt = True,
) -> None:
    """Curate -> train -> evaluate as one Prefect flow, tracked in one MLflow run."""
    _orchestration_env()
    from flows.pipeline import pipeline_flow

    cfg = _load(params, config, set_, variant)  # a config error is reported before Prefect starts
    _check_eval_set(cfg, eval_set, run_name)  # and an unknown eval set before training
    with _server():
        out = pipeline_flow(
            **_flow_args(params, config, set_),
            variant=variant,
            run_name=run_name,
            eval_set=eval_set,
            max_steps=max_steps,
            curate=curate,
        )
    report_pipeline(out)


@app.command("ablate")
@user_errors
def ablate(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variants: Annotated[
        list[str] | None,
        typer.Option(
            "--variants",
            help=f"Variants to run, comma-separated or repeated (default: all of "
            f"{', '.join(ABLATION_LADDER)}); rungs alone run in Table 1 order, with an "
            f"algorithm ({', '.join(ALGORITHM_PRESETS)}) in the order given.",
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="The variant the others are compared with (default: the first given when an "
            "algorithm is among them; the rung before for the Table 1 ladder).",
        ),
    ] = None,
    seeds: Annotated[
        list[str] | None,
        typer.Option("--seeds", help="Training seeds, e.g. --seeds 0,1 (default: train.seed)."),
    ] = None,
    eval_set: EvalSetOpt = None,
    run_name: RunNameOpt = None,
    curate: CurateOpt = True,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Runs to train at once on this machine, each its own flow run picked up by a "
            "local Prefect worker (default: CPU cores / train.cpu_threads, 1 on a GPU; "
            "1 runs them one after another in this process).",
        ),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(
            help="Submit the runs to this Prefect work pool instead (PREFECT_API_URL set to a "
            "server your workers poll, e.g. on GPU nodes: `prefect worker start --pool NAME`).",
        ),
    ] = None,
) -> None:
    """The Table 1 ladder: train and evaluate each variant (per seed), each a Prefect flow run.

    One parent MLflow run holds a nested run per variant/seed, the ablation table (each rung
    against the one before, paired over seeds and problems), each switch's own signal, and a
    chart (ours and the paper's numbers in separate panels)."""
    _orchestration_env()
    from dapo_core.ablation import comparison_baseline, ordered_variants

    names = ordered_variants(_split(variants))
    baseline = comparison_baseline(names, baseline)
    seed_list = _seeds(seeds)
    base, tuned = split_sweep_overrides(names, set_ or [])
    cfg = _load(params, config, base)
    for name in names:  # each variant's config, checked before anything starts
        apply_variant(cfg, name, tuned[name])
    _check_eval_set(cfg, eval_set, run_name)
    from flows.ablate import ablate_flow  # imports Prefect, which makes .prefect/: after the checks
    from flows.stages import keep_sweep_settings

    if run_name:  # a continued sweep: refused now, not after its server and workers start
        keep_sweep_settings(cfg, tuned, run_name, record=False)

    args = {
        **_flow_args(params, config, set_),
        "variants": names,
        "baseline": baseline,
        "seeds": seed_list,
        "eval_set": eval_set,
        "run_name": run_name,
        "curate": curate,
    }
    runs = len(names) * len(seed_list or [cfg.train.seed])
    n = min(workers or _default_workers(cfg.train.cpu_threads), runs)
    if pool:
        from flows.serve import api_url

        if not api_url():
            raise ConfigError(
                "--pool needs a Prefect server the workers share: set PREFECT_API_URL "
                "(or use --workers N to start one here)"
            )
        table = ablate_flow(**args, pool=pool, progress=False)
    elif n > 1:
        from flows.cluster import LOCAL_POOL, local_cluster

        logs = Path(os.environ["PREFECT_HOME"]) / "logs"
        console.print(f"ablate: {runs} runs on {n} local workers (logs in {logs})")
        with local_cluster(n, logs) as url:
            console.print(f"ablate: flow runs at {url.removesuffix('/api')} while the sweep runs")
            table = ablate_flow(**args, pool=LOCAL_POOL, progress=False)
    else:
        with _server():
            table = ablate_flow(**args)
    report_ablation(table)


@app.command("compare")
@user_errors
def compare(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    methods: Annotated[
        list[str] | None,
        typer.Option(
            "--methods",
            help="Methods, comma-separated or repeated (default: ppo_rm,dpo,grpo,dapo): PPO "
            "against a reward model trained on mined pairs, offline DPO on those pairs, GRPO "
            "and DAPO on the rule-based reward.",
        ),
    ] = None,
    seeds: Annotated[
        list[str] | None,
        typer.Option("--seeds", help="Seeds, e.g. --seeds 0,1,2,3,4 (default: train.seed)."),
    ] = None,
    eval_set: EvalSetOpt = None,
    run_name: RunNameOpt = None,
    curate: CurateOpt = True,
) -> None:
    """Compare PPO against a learned reward, DPO, GRPO and DAPO from the same warm start over
    seeds: stability (seed spread, collapsed runs), update variance (gradient norm,
    advantages) and sample efficiency (held-out avg@k against responses generated and tokens
    trained on), under one MLflow parent run."""
    _orchestration_env()
    from dapo_core.comparison import check_methods, method_configs, split_methods_overrides

    names = check_methods(_split(methods, "--methods"))
    seed_list = _seeds(seeds)
    base, tuned = split_methods_overrides(set_ or [])
    cfg = _load(params, config, base)
    for s in seed_list or [cfg.train.seed]:  # every method's config, checked before anything
        method_configs(cfg, tuned, s)
    _check_eval_set(cfg, eval_set, run_name)
    from flows.compare import compare_flow  # imports Prefect, which makes .prefect/
    from flows.stages import keep_sweep_settings

    if run_name:  # a continued comparison: refused before its server starts
        keep_sweep_settings(cfg, tuned, run_name, record=False)
    with _server():
        table = compare_flow(
            **_flow_args(params, config, set_),
            methods=names,
            seeds=seed_list,
            eval_set=eval_set,
            run_name=run_name,
            curate=curate,
        )
    report_comparison(table)
    if table.attrs["failed"]:  # the others are in the table; the command still fails
        raise PipelineError(
            f"{len(table.attrs['failed'])} run(s) failed, first {table.attrs['failed'][0]}; "
            f"fix it and run the same command with --run-name {Path(table.attrs['dir']).name}"
        )


def _default_workers(cpu_threads: int) -> int:
    """Concurrent runs this machine can hold: one on a GPU (one device), else one per
    ``train.cpu_threads`` cores."""
    import torch

    if torch.cuda.is_available() or cpu_threads <= 0:  # 0: each run takes every core
        return 1
    return max(1, (os.cpu_count() or 1) // cpu_threads)


@app.command("schedule")
@user_errors
def schedule(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    train_cron: Annotated[
        str | None,
        typer.Option(help="Cron of the nightly train (default '0 2 * * *'; '' leaves it out)."),
    ] = None,
    ablate_cron: Annotated[
        str | None,
        typer.Option(help="Cron of the weekly ablate (default '0 4 * * 0'; '' leaves it out)."),
    ] = None,
    nightly_steps: Annotated[
        int | None, typer.Option(help="Steps per nightly train (default: until train.steps).")
    ] = None,
    run_name: Annotated[
        str, typer.Option(help="The run the nightly train continues (under train.out_dir).")
    ] = "nightly",
    variants: Annotated[
        list[str] | None, typer.Option("--variants", help="Variants of the weekly ablate.")
    ] = None,
    seeds: Annotated[
        list[str] | None, typer.Option("--seeds", help="Seeds of the weekly ablate, e.g. 0,1.")
    ] = None,
    timezone: Annotated[str, typer.Option(help="Time zone of the cron schedules.")] = "UTC",
    promote: Annotated[
        str | None,
        typer.Option(
            help="A registered model name: once the nightly run completes, its policy becomes "
            "models:/NAME@champion if its validation avg@k beats the champion's."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the deployments; register nothing.")
    ] = False,
) -> None:
    """Register and serve cron deployments: nightly train, weekly ablate (blocks).

    The nightly train continues one run from its latest checkpoint. Needs a Prefect server:
    `dapo server start`, or PREFECT_API_URL naming yours (see docs/guide/orchestration.md,
    "Schedules"); `--dry-run` only prints the deployments."""
    _orchestration_env()
    from flows.schedule import (
        NIGHTLY_TRAIN_CRON,
        WEEKLY_ABLATE_CRON,
        build_deployments,
        schedule_specs,
    )
    from flows.serve import api_url, serve_deployments

    _load(params, config, set_)
    specs = schedule_specs(
        NIGHTLY_TRAIN_CRON if train_cron is None else train_cron,
        WEEKLY_ABLATE_CRON if ablate_cron is None else ablate_cron,
        nightly_steps=nightly_steps,
        run_name=run_name,
        variants=_split(variants),
        seeds=_seeds(seeds),
        timezone=timezone,
        promote=promote,
        **_flow_args(params, config, set_),
    )
    if not specs:
        raise ConfigError("nothing to schedule: both --train-cron and --ablate-cron are empty")
    for s in specs:
        sys.stdout.write(
            f"{s.flow}/{s.name}  cron '{s.cron}' ({s.timezone})  {s.description}\n"
            f"    parameters: {json.dumps(s.parameters)}\n"
        )
    if dry_run:
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.server import running_server

    url = api_url() or running_server(Path(os.environ["PREFECT_HOME"]))
    if not url:
        raise PipelineError(
            "schedules need a running Prefect server (a temporary one creates no scheduled "
            "runs): start one with `dapo server start` (or set PREFECT_API_URL to yours) and "
            "run `dapo schedule` again"
        )
    console.print(
        f"serving {len(specs)} deployment(s) on {url}; `prefect deployment ls` lists them. "
        "Ctrl-C stops (and pauses their schedules)."
    )
    _working()
    # serving returns only when stopped: Ctrl-C, or SIGTERM (Prefect's runner exits 0 on it)
    cut_off: list[str] = []
    with temporary_settings(updates={PREFECT_API_URL: url}), contextlib.suppress(SystemExit):
        cut_off = serve_deployments(build_deployments(specs))
    for line in cut_off:
        console.print(line, markup=False, highlight=False)
    console.print(
        "[bold yellow]interrupted:[/] stopped serving; the schedules are paused until "
        "`dapo schedule` serves them again"
    )
    from tasks.signals import interrupted_status

    raise typer.Exit(interrupted_status())
