"""Commands that read the MLflow store: ``ui`` (the MLflow UI on it) and ``reproduce`` (a
tracked run again from its logged config)."""

import contextlib
import os
import sys
from typing import Annotated, Any

import typer
from rich.markup import escape

from dapo_core import metric_names as metric
from dapo_core.errors import PipelineError
from flows.commands.base import (
    ConfigOpt,
    ParamsOpt,
    RunNameOpt,
    SetOpt,
    _load,
    _orchestration_env,
    _server,
    app,
    console,
    user_errors,
)


@app.command("ui")
@user_errors
def ui(
    port: Annotated[int, typer.Option(help="Port of the UI.", min=1, max=65535)] = 5000,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    print_only: Annotated[
        bool, typer.Option("--print-only", help="Print the mlflow command; start nothing.")
    ] = False,
) -> None:
    """Start the MLflow UI on the project's tracking store and print its URL."""
    _orchestration_env()
    import shlex

    from tasks.tracking.store import (
        STORE_DIR,
        mlflow_env,
        refuse_missing_store,
        sqlite_path,
        tracking_uri,
        ui_command,
    )
    from tasks.tracking.ui_host import exec_host

    cfg = _load(params, config, set_)
    uri = tracking_uri(cfg)
    if uri.startswith(("http://", "https://")):  # `mlflow ui` serves a database, not a server
        raise PipelineError(f"{uri} is an MLflow server: its UI is at that address already")
    db = sqlite_path(uri)
    if db != STORE_DIR / "mlflow.db":  # the project's own store is made on first use
        try:
            refuse_missing_store(uri)  # a mistyped path: no new empty store made and served
        except LookupError as e:
            raise PipelineError(str(e)) from None
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    cmd = ui_command(uri, port, host)
    if not print_only:
        _check_bindable(host, port)  # before its URL is printed as if it were served
    if not _loopback(host):
        console.print(
            f"[bold yellow]warning:[/] the MLflow UI has no authentication: on {host}, anyone who "
            f"can reach port {port} of this machine can read, change and delete every run. Keep "
            "the default --host "
            "127.0.0.1 (reach it through an SSH tunnel), or turn on MLflow's basic auth: run the "
            "command `dapo ui --print-only` prints with `--app-name basic-auth` added and "
            "MLFLOW_AUTH_ADMIN_PASSWORD set (the admin's password on first start)"
        )
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"  # IPv6: [::1]
    sys.stdout.write(f"{base}\n")
    sys.stdout.flush()
    for name, url in _experiment_links(uri, cfg, base).items():
        console.print(f"{name}: {url}", highlight=False)
    if print_only:
        sys.stdout.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
        return
    console.print(f"MLflow UI on store {uri}: starting (it says when it is ready)")
    exec_host(base, cmd, mlflow_env())  # this process, lighter: it holds nothing while it waits


@app.command("register")
@user_errors
def register(
    ref: Annotated[
        str, typer.Argument(help="A run id (its policy), a model id (m-...) or a models:/ URI.")
    ],
    name: Annotated[str, typer.Option(help="The registered model's name.")] = "dapo-policy",
    alias: Annotated[str, typer.Option(help="The alias moved to the new version.")] = "champion",
    params: ParamsOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """Put a run's policy in the MLflow Model Registry under NAME, with ALIAS on the new
    version, so that `dapo evaluate --model models:/NAME@ALIAS` and
    `-S model.name_or_path=models:/NAME@ALIAS` load it."""
    from tasks.tracking.registry import register as register_model
    from tasks.tracking.store import tracking_uri

    done = register_model(ref, name, alias, tracking_uri(_load(params, config, set_)))
    what = "registered" if done.new else "already registered, as"
    console.print(
        f"{what} {done.name} version {done.version} ({done.model_id}, {done.path}); "
        f"{done.uri} names it",
        highlight=False,
        markup=False,
    )


def _experiment_links(uri: str, cfg: Any, served_at: str) -> dict[str, str]:
    """The project's experiments in the training view, on the address ``dapo ui`` serves (none
    before the store exists: MLflow would create it)."""
    from tasks.tracking.store import experiment_urls, sqlite_path

    db = sqlite_path(uri)
    if db is None or not db.exists():  # a server store has its own UI; no store yet: nothing
        return {}
    try:
        return experiment_urls(cfg, uri, ui=served_at)
    except Exception:  # noqa: BLE001 - a store we cannot read: the UI will say why
        return {}


def _check_bindable(host: str, port: int) -> None:
    """One line for a --host this machine cannot listen on (a name that does not resolve,
    another machine's address) or a --port something already listens on."""
    import socket

    try:
        family, kind, _, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM
        )[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as e:  # socket.gaierror too
        raise PipelineError(
            f"cannot serve the UI on {host}:{port} ({e.strerror or e}): give --host an address "
            "of this machine (127.0.0.1, or 0.0.0.0 for every interface) and a free --port"
        ) from None


def _loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (localhost, 127.x, ::1)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


@app.command("reproduce")
@user_errors
def reproduce(
    run_id: Annotated[str, typer.Argument(help="The MLflow run id to re-run.")],
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            help="Store holding the run, an MLflow tracking URI (default: "
            "MLFLOW_TRACKING_URI, else sqlite:///<repo>/mlflow/mlflow.db)."
        ),
    ] = None,
    run_name: RunNameOpt = None,
    check_only: Annotated[
        bool, typer.Option("--check-only", help="Compare data and code; re-run nothing.")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="A data or code difference is an error (exit 2).")
    ] = False,
) -> None:
    """Re-run a tracked MLflow run from its logged config.

    Warns when the run's data version (the dvc.lock md5) or git commit differ from this
    checkout's; `--check-only` compares and exits 1 on a difference."""
    _orchestration_env()
    from flows.reproduce import original_avg, reproduce_run
    from tasks.rundir import check_run_name

    check_run_name(run_name)  # before a server starts
    if tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri  # the new run goes to the same store
    # a check runs no flow: no Prefect server to start for it
    with contextlib.nullcontext() if check_only else _server():
        out = reproduce_run(
            run_id, tracking_uri, run_name=run_name, check_only=check_only, strict=strict
        )
    for w in out["mismatches"]:
        console.print(f"[bold yellow]warning:[/] {escape(str(w))}")
    for note in out["notes"]:
        console.print(f"[yellow]note:[/] {escape(str(note))}")
    if not out["mismatches"]:
        console.print("data version and code match the run's.")
    if check_only:
        raise typer.Exit(1 if out["mismatches"] else 0)
    before, result = original_avg(out["original"]), out["result"]
    after = None
    if isinstance(result, dict) and "evaluate" in result:
        after = result["evaluate"].metrics[metric.AVG_AT_K]
    elif hasattr(result, "metrics"):
        after = result.metrics[metric.AVG_AT_K]
    if before is not None and after is not None:
        console.print(f"avg@k: original {before:.4f}, reproduced {after:.4f}")
    console.print(f"[green]done[/]: re-ran {run_id} (config {escape(str(out['config_path']))})")
