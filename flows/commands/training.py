"""Commands that train, sample or evaluate one model: ``train``, ``preflight``, ``evaluate``,
``curate`` and ``demo``."""

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from dapo_core.config import ConfigError
from dapo_core.errors import TrainingInterrupted
from flows.commands.base import (
    VARIANTS_HELP,
    ConfigOpt,
    ParamsOpt,
    SetOpt,
    _check_eval_set,
    _flow_args,
    _load,
    _orchestration_env,
    _server,
    app,
    console,
    run_stage,
    user_errors,
)
from flows.report import mlflow_link, trained


@app.command("train")
@user_errors
def train(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    variant: Annotated[str | None, typer.Option(help=VARIANTS_HELP)] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="Run directory (default: train.out_dir/<timestamp>).")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue the run in this directory from its last checkpoint."),
    ] = None,
    track: Annotated[
        bool | None,
        typer.Option(
            "--track/--no-track",
            help="Log the run to MLflow (one process; under a multi-rank launcher the run writes "
            "metrics.jsonl only: use `dapo pipeline` for a tracked multi-GPU run). Default: "
            "tracked, and with --resume as the run began.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Train the policy with DAPO (or a Table 1 variant) on the configured data."""
    _orchestration_env()
    track = _resumed_tracking(resume) if track is None else track
    from flows.stages import train_on_ranks
    from tasks.runtime import env_world_size

    if resume is not None:  # the run's own config; the flow continues it
        from tasks.rundir import RunDir

        if config or set_ or variant:  # they would be ignored: say so rather than drop them
            raise ConfigError(
                "--resume continues a run with its own config (exact resume), so -c, -S and "
                "--variant cannot change it; drop them, or start a new run with --run-dir"
            )
        params, config, set_, variant = resume / "config.json", None, None, None
        RunDir(resume).refuse_model_dir()  # its config.json is a model's
        if not params.exists():
            raise FileNotFoundError(f"{resume} is not a run directory (no config.json)")
    target = resume or run_dir
    if env_world_size() > 1:  # a multi-rank launcher: no flow run per rank (see train_on_ranks)
        cfg = _load(params, config, set_, variant)
        if target is None:  # each rank would name its own from its clock, a second apart
            raise ConfigError(
                "under a multi-rank launcher every rank writes the same run directory: name it "
                "with --run-dir (e.g. --run-dir runs/my-run)"
            )
        result = train_on_ranks(cfg, str(target), resume=resume is not None)
        if result.history:  # rank 0 reports
            _report_training(result.steps, result.wall_time_s, result.history[-1], target, None)
        return
    _load(params, config, set_, variant)  # a config error is reported before Prefect starts
    # The one writer of the run directory, before Prefect or MLflow start: a second process
    # on a live run is refused in one line (the flow and the task hold it again, re-entrantly).
    with _run_dir_writer(target), _server(direct=True):
        summary = run_stage(
            "train",
            **_flow_args(params, config, set_),
            variant=variant,
            run_dir=str(target.resolve()) if target else None,
            resume=resume is not None,
            track=track,
        )
    _report_training(
        summary.steps,
        summary.wall_time_s,
        summary.last_metrics,
        summary.model_path,
        summary.mlflow_run_id,
        summary.mlflow_url,
        summary.resumed_from,
    )


def _check_out_dirs(**options: Path | None) -> None:
    """One line, before any work, for an output directory option that cannot be written."""
    from tasks.durable import unwritable

    for name, folder in options.items():
        if folder is not None and (why := unwritable(folder)):
            flag = "--" + name.replace("_", "-")
            raise FileExistsError(f"{flag} {folder}: {why}; give a directory for the results")


def _resumed_tracking(resume: Path | None) -> bool:
    """Track unless this continues a run that began with --no-track (said in a note)."""
    from tasks.rundir import RunDir

    if resume is None or not RunDir(resume).untracked():
        return True
    console.print("note: continuing untracked, as the run began (--track logs it to MLflow)")
    return False


def _run_dir_writer(target: Path | None):
    """Hold ``target`` as its one writer (nothing when the flow picks a new directory)."""

    from tasks.rundir import RunDir

    return RunDir(target.resolve()).writer() if target else contextlib.nullcontext()


def _report_training(
    steps: int,
    wall: float,
    last: dict,
    model: Any,
    run_id: str | None,
    url: str | None = None,
    resumed_from: int = 0,
) -> None:
    tracking = f"; {mlflow_link(run_id, url)}" if run_id else ""
    console.print(
        f"[green]done[/]: {trained(steps, resumed_from, wall)}, "
        f"last sampled accuracy {last.get('train/acc_mean', float('nan')):.3f}; "
        f"model in {model}{tracking}"
    )


@app.command("preflight")
@user_errors
def preflight(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    prompts: Annotated[
        int | None,
        typer.Option(help="Training prompts to sample (default: train.preflight_prompts).", min=1),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option("--strict", help="Too few groups of mixed correctness is an error (exit 2)."),
    ] = False,
) -> None:
    """Before training: sample the policy on a few training prompts and report whether DAPO has
    anything to learn from (mixed groups, parseable answers, truncation)."""
    _orchestration_env()
    from tasks.training.preflight import describe

    _load(params, config, set_)
    with _server(direct=True):
        args = _flow_args(params, config, set_)
        # strict is judged below, once the report is out (the stage would raise before it)
        result = run_stage("preflight", **args, prompts=prompts, strict=False, said=False)
    report = Console(soft_wrap=True)  # the command's result: stdout (`> report.txt` keeps it)
    report.print(describe(result), markup=False, highlight=False)
    for row in result.samples[:3]:
        report.print(f"  answer {row['answer']}: {row['response'][-120:]!r}", markup=False)
    if result.problem and strict:
        from tasks.training.preflight import NothingToLearn

        raise NothingToLearn(f"preflight: {result.problem}")
    if result.problem:
        report.print(f"[bold yellow]warning:[/] {escape(result.problem)}")
    else:
        report.print("[green]ok[/]: enough groups of mixed correctness to learn from")


@app.command("evaluate")
@user_errors
def evaluate(
    model: Annotated[
        str | None,
        typer.Option(
            help="Model directory, hub id or models:/NAME@ALIAS (default: model.name_or_path)."
        ),
    ] = None,
    eval_set: Annotated[
        str | None,
        typer.Option(help="synthetic-test, a name from data.eval_sets, or a parquet/jsonl path."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Write metrics.json, per_problem.csv and samples.json here."),
    ] = None,
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    track: Annotated[
        bool, typer.Option("--track/--no-track", help="Log the evaluation to MLflow.")
    ] = True,
) -> None:
    """Evaluate a model: avg@n, pass@k, maj@n and a 95% CI over problems (paper: AIME avg@32)."""
    _orchestration_env()
    from rich.table import Table

    cfg = _load(params, config, set_)
    _check_eval_set(cfg, eval_set)
    _check_out_dirs(out=out)  # refused now, not after the work
    with _server(direct=True):
        args = _flow_args(params, config, set_)
        try:
            result = run_stage("evaluate", **args, model=model, eval_set=eval_set, track=track)
        except TrainingInterrupted as e:  # nothing is kept: say how to start over
            raise TrainingInterrupted(f"{e}; run the same command to evaluate again") from None
    name = result.eval_set
    run_note = f"; MLflow run {result.mlflow_run_id}" if result.mlflow_run_id else ""
    table = Table(
        title=f"{name}: {len(result.per_problem)} problems x {cfg.eval.n_samples} samples"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in result.metrics.items():  # counts (problems, samples) as whole numbers
        table.add_row(k, f"{v:.0f}" if k in ("eval/num_problems", "eval/n_samples") else f"{v:.4f}")
    for k, how in result.scoring.items():  # how answers were read and judged
        table.add_row(k, how)
    Console().print(table)
    if out:
        from tasks.durable import replace_atomically

        out.mkdir(parents=True, exist_ok=True)
        report = json.dumps({**result.metrics, **result.scoring}, indent=2)
        replace_atomically(out / "metrics.json", lambda tmp: tmp.write_text(report))
        replace_atomically(
            out / "per_problem.csv", lambda tmp: result.per_problem.to_csv(tmp, index=False)
        )
        samples = json.dumps(result.samples, indent=1, default=str)  # the MLflow run's table
        replace_atomically(out / "samples.json", lambda tmp: tmp.write_text(samples))
        wrote = ", ".join(str(out / f) for f in ("metrics.json", "per_problem.csv", "samples.json"))
        console.print(f"wrote {wrote}{run_note}", markup=False, highlight=False)
    elif run_note:
        console.print(run_note.lstrip("; "))


@app.command("curate")
@user_errors
def curate(
    source: Annotated[
        str | None,
        typer.Option(
            help="A parquet/jsonl file, a Hugging Face dataset id, synthetic:arith or "
            "synthetic:chain (default: data.source)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default: data.out_dir).")
    ] = None,
    eval_set: Annotated[
        list[str] | None,
        typer.Option(
            "--eval-set",
            help="Eval set to prepare and decontaminate against, repeatable: NAME=PATH_OR_ID, "
            "a name from data.eval_sets, or a path/hub id (default: all of data.eval_sets).",
        ),
    ] = None,
    eval_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where prepared eval sets go (default: data/eval, read by evaluate; OUT/eval "
            "with --out, so that --out writes nothing in the repository)."
        ),
    ] = None,
    step: Annotated[
        str, typer.Option(help="all, eval (only the eval sets) or train (only the source).")
    ] = "all",
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Curate training data into integer-answer form and prepare the eval sets (DAPO 3.5).

    Writes OUT/train.parquet, val.parquet, rejected.parquet and report.json, and
    data/eval/<name>.parquet with manifest.json. `dvc repro` runs this as two stages."""
    from tasks.data.curate import curate as run_curate
    from tasks.data.curate import parse_eval_set_args

    cfg = _load(params, config, set_)
    _check_out_dirs(out=out, eval_dir=eval_dir)
    sets = parse_eval_set_args(eval_set, cfg) if eval_set else None
    summary = run_curate(
        cfg,
        source=source,
        out=out.resolve() if out else None,
        eval_sets=sets,
        eval_dir=eval_dir.resolve() if eval_dir else None,
        step=step,
    )
    for name, entry in summary.eval_manifest.items():
        if entry["status"] == "ready":
            console.print(f"eval set {name}: {entry['problems']} problems")
        else:
            console.print(f"eval set {name}: [yellow]unavailable[/] (see manifest.json)")
    if summary.eval_manifest:
        console.print(f"eval sets in {summary.eval_dir}")
    r = summary.report
    if r is not None:
        dropped = ", ".join(f"{k} {v}" for k, v in r["dropped"].items()) or "none"
        console.print(
            f"[green]curated[/] {r['source']}: kept {r['kept']} of {r['input_rows']} rows "
            f"(train {r['train']}, val {r['val']}; {r['converted']['total']} answers converted "
            f"to integer form); dropped: {dropped}; wrote {summary.out_dir}"
        )


@app.command("demo")
@user_errors
def demo() -> None:
    """The embedded default end to end (what `make demo` runs)."""
    _orchestration_env()
    from flows.demo import run_demo

    with _server():
        run_demo()
