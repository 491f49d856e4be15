"""Shared fixtures: a very small embedded model built once per session into a temp directory,
and empty Prefect and MLflow stores migrated once per run for tests that need a fresh one.

The suite runs on pytest-xdist's workers (``make test``: ``-n auto``); a session fixture is
made once per worker, except the empty stores, which the workers share through a file lock.
"""

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.determinism import pin_kernels

pin_kernels()  # as every `dapo` command does, before torch is imported
import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["DAPO_WARM"] = "0"  # no test command runs in a developer's warm process
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per worker: the workers are the parallelism. Torch's default (one per core)
    # in each of three workers on 2 cores has threads waiting on each other at every barrier.
    torch.set_num_threads(1)


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores (at most ``--maxprocesses``). Many tests wait
    on what they started (a server coming up, a child process importing torch), so a third
    worker on 2 cores keeps them busy (docs/testing.md has what it gained)."""
    return (os.cpu_count() or 1) + 1


def pytest_collection_modifyitems(items):
    """The slow tests first (stable otherwise): the workers start the long ones early and fill
    the end of the run with the many short ones, instead of waiting on one long test last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _interrupt_handlers_put_back():
    """Fail a test that leaves Ctrl-C's or SIGTERM's handler changed (and put it back): the
    tests after it in the same worker would run under it, and a test that sends itself Ctrl-C
    would find it ignored or held."""
    import signal

    signals = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.getsignal(s) for s in signals}
    yield
    changed = {s: signal.getsignal(s) for s in signals if signal.getsignal(s) is not before[s]}
    for s in changed:
        signal.signal(s, before[s])
    assert not changed, f"the test left these signal handlers in place: {changed}"


TINY_OVERRIDES = [
    "synthetic.max_operand=9",
    "synthetic.num_train=60",
    "synthetic.num_test=20",
    "data.val_size=8",
    "tiny.vocab_size=300",
    "tiny.hidden_size=32",
    "tiny.intermediate_size=64",
    "tiny.num_layers=1",
    "tiny.num_heads=2",
    "tiny.num_kv_heads=1",
    "tiny.warm_start_steps=30",
    "tiny.warm_start_target=0",  # all 30 steps: no validation sampling in the fixture
    "tiny.warm_start_batch=16",
    "rollout.group_size=4",
    "rollout.max_response_len=6",
    "algo.cache_len=2",
    "train.prompt_batch=4",
    "train.gen_batch=4",
    "train.mini_batch=2",
    "train.micro_batch_tokens=64",
    "train.lr=0.01",
    "train.warmup_steps=2",
    "train.checkpoint_every=0",
]


@pytest.fixture(scope="session")
def tiny_cfg(tmp_path_factory):
    """A config whose embedded model is built (with a short warm start) in a temp dir."""
    from tasks.models.resolve import resolve_model_path
    from tasks.params import load_params

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tiny") / "model"
    cfg = load_params(overrides=[*TINY_OVERRIDES, f"tiny.path={path}"])
    resolve_model_path(cfg)
    return cfg


def _run_wide_dir(tmp_path_factory) -> Path:
    """A directory every xdist worker of this run sees (the parent of their own temp roots)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def empty_stores(tmp_path_factory) -> Path:
    """A migrated, empty Prefect database (``prefect.db``) and MLflow store (``mlflow.db``).

    A new store migrates its schema on first use: about 9 s for Prefect's, 1-2 s for MLflow's
    on 2 cores. Tests that need a fresh store copy these instead (``prefect_home``,
    ``fresh_mlflow_uri``); what is tested is the same, an empty store at the schema's head.
    """
    root = _run_wide_dir(tmp_path_factory) / "empty-stores"
    root.mkdir(exist_ok=True)
    with (root / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker migrates; the others wait for it
        if not (root / "ready").exists():
            env = {**os.environ, "PREFECT_HOME": str(root / "prefect")}
            env.pop("PREFECT_API_URL", None)
            cmd = [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"]
            subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)
            from mlflow.tracking import MlflowClient

            MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}").search_experiments()
            (root / "ready").touch()
    return root


@pytest.fixture
def seed_prefect_home(empty_stores):
    """``seed(home)``: make ``home`` a Prefect home whose database is already migrated."""

    def seed(home: Path) -> Path:
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(empty_stores / "prefect" / "prefect.db", home / "prefect.db")
        return home

    return seed


@pytest.fixture
def prefect_home(tmp_path, seed_prefect_home) -> Path:
    """``tmp_path / "prefect"``, a fresh Prefect home with a migrated database."""
    return seed_prefect_home(tmp_path / "prefect")


@pytest.fixture
def fresh_mlflow_uri(tmp_path, empty_stores) -> str:
    """The URI of a fresh, empty MLflow store in ``tmp_path`` (``mlflow.db``)."""
    db = tmp_path / "mlflow.db"
    shutil.copyfile(empty_stores / "mlflow.db", db)
    return f"sqlite:///{db}"
