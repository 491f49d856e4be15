"""Model builds: one builder at a time, published whole, keyed on the code that builds them."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tasks.models import build
from tasks.models.build import BUILD_RECORD, code_digest, dir_digest, ensure_built, is_built


def _module(path: Path, source: str):
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_code_digest_sees_code_not_comments_or_docstrings(tmp_path):
    base = _module(tmp_path / "m1.py", 'def f(x):\n    """Doc."""\n    return x + 1\n')
    reworded = _module(
        tmp_path / "m2.py", 'def f(x):\n    """Other doc."""\n    # why\n    return (x + 1)\n'
    )
    changed = _module(tmp_path / "m3.py", 'def f(x):\n    """Doc."""\n    return x + 2\n')
    # the module name is part of the digest: compare as if each were the same module
    for m in (base, reworded, changed):
        m.__name__ = "m"
    assert code_digest(base) == code_digest(reworded)
    assert code_digest(base) != code_digest(changed)


def _count_build(into: Path, counter: str, pause: float = 0.0) -> None:
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(pause)
    into.mkdir()
    (into / "weights").write_text("w")


def _ensure(out: str, counter: str, pause: float) -> None:
    ensure_built(Path(out), {"v": 1}, lambda d: _count_build(d, counter, pause), "test model")


def test_two_processes_build_once_and_both_get_the_build(tmp_path):
    out, counter = tmp_path / "model", tmp_path / "builds.txt"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_ensure, args=(str(out), str(counter), 1.5)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(counter.read_text().split()) == 1  # one builder; the other waited and reused it
    assert is_built(out, {"v": 1}) and (out / "weights").read_text() == "w"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["builds.txt", "model"]  # no lock file


def test_a_failed_build_leaves_nothing_and_the_old_build_stays(tmp_path):
    out, counter = tmp_path / "model", tmp_path / "builds.txt"
    _ensure(str(out), str(counter), 0.0)

    def broken(into: Path) -> None:
        into.mkdir()
        (into / "half").write_text("x")
        raise KeyboardInterrupt  # as Ctrl-C mid-build

    with pytest.raises(KeyboardInterrupt):
        ensure_built(out, {"v": 2}, broken, "test model")
    assert is_built(out, {"v": 1})  # the complete build is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["builds.txt", "model"]
    # the first build into a folder not made yet (data/models/NAME): none is left made
    with pytest.raises(KeyboardInterrupt):
        ensure_built(tmp_path / "data" / "models" / "m", {"v": 1}, broken, "test model")
    assert not (tmp_path / "data").exists()


def test_a_waiter_whose_lock_file_was_removed_waits_on_the_new_one(tmp_path):
    """The holder removes the lock file as it lets go; a process that was waiting on the removed
    file must not take it for the lock while a newcomer holds the file now at its path."""
    out = tmp_path / "model"
    lock = tmp_path / ".model.lock"
    first = lock.open("a+")
    fcntl.flock(first, fcntl.LOCK_EX)
    entered = threading.Event()

    def waiter() -> None:
        with build.build_lock(out, "test model"):
            entered.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    time.sleep(0.5)  # the waiter is blocked on the first file
    lock.unlink()
    second = lock.open("a+")  # a newcomer takes the file now at the path
    fcntl.flock(second, fcntl.LOCK_EX)
    fcntl.flock(first, fcntl.LOCK_UN)
    first.close()
    assert not entered.wait(1.0)  # it woke on the removed file and now waits on the new one
    fcntl.flock(second, fcntl.LOCK_UN)
    second.close()
    assert entered.wait(10)
    thread.join(10)
    assert not lock.exists()


def test_a_killed_builder_neither_blocks_nor_leaves_its_staging(tmp_path, caplog):
    """The kernel drops a dead process's flock; its staging directory is cleared by the next."""
    out, counter = tmp_path / "model", tmp_path / "builds.txt"
    code = (
        "import sys, time; from pathlib import Path; from tasks.models.build import ensure_built\n"
        "def b(d):\n    d.mkdir(); (d / 'part').write_text('x'); print('building', flush=True)\n"
        "    time.sleep(600)\n"
        f"ensure_built(Path({str(out)!r}), {{'v': 1}}, b, 'test')\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"building"
    assert list(tmp_path.glob(".model.build-*"))  # it was building when killed
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    with caplog.at_level(logging.WARNING, logger=build.log.name):
        _ensure(str(out), str(counter), 0.0)
    assert not [r for r in caplog.records if "waiting for" in r.getMessage()]  # lock was free
    assert is_built(out, {"v": 1}) and not list(tmp_path.glob(".model.build-*"))


def test_a_build_of_other_code_is_rebuilt_and_the_record_holds_the_digest(tmp_path):
    out, counter = tmp_path / "model", tmp_path / "builds.txt"
    ensure_built(out, {"code": "aaaa"}, lambda d: _count_build(d, str(counter)), "m")
    ensure_built(out, {"code": "aaaa"}, lambda d: _count_build(d, str(counter)), "m")
    ensure_built(out, {"code": "bbbb"}, lambda d: _count_build(d, str(counter)), "m")
    assert len(counter.read_text().split()) == 2
    record = json.loads((out / BUILD_RECORD).read_text())
    assert record["spec"] == {"code": "bbbb"} and record["digest"] == dir_digest(out)


def test_embedded_model_build_is_keyed_on_its_code_and_libraries(tiny_cfg, monkeypatch):
    from dapo_core.config_loader import resolve
    from tasks.models import tiny

    spec = tiny.build_spec(tiny_cfg)
    assert spec["code"] == code_digest(*tiny.BUILD_MODULES) and spec["libraries"]["torch"]
    rl_seed = resolve(tiny_cfg.to_dict(), overrides=[f"train.seed={tiny_cfg.train.seed + 7}"])
    assert tiny.build_spec(rl_seed) == spec  # the RL seed does not change the starting model
    build_seed = resolve(tiny_cfg.to_dict(), overrides=[f"tiny.seed={tiny_cfg.tiny.seed + 7}"])
    assert tiny.build_spec(build_seed) != spec  # the build's own seed does
    monkeypatch.setattr(build, "LIBRARIES", ("torch", "no-such-library"))
    assert tiny.build_spec(tiny_cfg)["libraries"]["no-such-library"] == "absent"


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() != "AVX2", reason="needs the portable pins (AVX2)"
)
def test_a_build_is_not_rebuilt_for_another_cpu_maker_where_the_bits_do_not_depend_on_it(
    tiny_cfg, monkeypatch
):
    """Under the portable pins (runtime.rounding COMPATIBLE) Intel and AMD CPUs build the same
    bytes, so a build directory moved between them is current; under MKL's AVX2 branch the
    maker is part of runtime.rounding, and so of the spec."""
    from tasks import determinism
    from tasks.models import tiny

    monkeypatch.setattr(determinism, "cpu_vendor", lambda: "GenuineIntel")
    intel = tiny.build_spec(tiny_cfg)
    monkeypatch.setattr(determinism, "cpu_vendor", lambda: "AuthenticAMD")
    assert tiny.build_spec(tiny_cfg) == intel
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    amd_avx2 = tiny.build_spec(tiny_cfg)
    monkeypatch.setattr(determinism, "cpu_vendor", lambda: "GenuineIntel")
    assert tiny.build_spec(tiny_cfg) != amd_avx2


def test_dir_digest_reads_contents_and_says_when_it_does_not(tmp_path, monkeypatch):
    (tmp_path / "a").write_text("one")
    first = dir_digest(tmp_path)
    (tmp_path / BUILD_RECORD).write_text("{}")  # the record is not part of what was built
    assert dir_digest(tmp_path) == first and first.startswith("sha256:")
    (tmp_path / "a").write_text("two")
    assert dir_digest(tmp_path) != first
    monkeypatch.setattr(build, "HASH_LIMIT_BYTES", 1)
    assert dir_digest(tmp_path).startswith("size:")


@pytest.mark.parametrize("kind", ["a directory of the user's", "a file"])
def test_a_build_never_replaces_what_it_did_not_build(tmp_path, kind):
    """`dapo model build -S tiny.path=DIR` on a directory holding the user's files deleted them."""
    from dapo_core.errors import PipelineError

    out, counter = tmp_path / "model", tmp_path / "builds.txt"
    if kind == "a file":
        out.write_text("notes")
    else:
        out.mkdir()
        (out / "important.txt").write_text("notes")
    with pytest.raises(PipelineError, match="is not a model directory the project built"):
        _ensure(str(out), str(counter), 0.0)
    kept = out if kind == "a file" else out / "important.txt"
    assert kept.read_text() == "notes" and not counter.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    out.unlink() if kind == "a file" else None
    (tmp_path / "empty").mkdir()  # an empty directory holds nothing to lose: built into
    _ensure(str(tmp_path / "empty"), str(counter), 0.0)
    assert is_built(tmp_path / "empty", {"v": 1})
