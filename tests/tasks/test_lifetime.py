"""Helpers end with the command that started them, however it ends (tasks/lifetime.py)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tasks import lifetime

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


@pytest.fixture(autouse=True)
def _nothing_left(tmp_path):
    """Whatever a test asserts, end what it started: every process with the test's directory on
    its command line (the command, its helper, the leaf); their reapers end once their pipes
    close. A failed assertion skips a test's own kill, and the processes would outlive the
    suite."""
    yield
    mark = str(tmp_path).encode()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:  # gone meanwhile
            continue


def _helper(leaf: str) -> str:
    """A helper that, like a Prefect worker, starts a process of its own (``leaf``, a flow run)
    in another session, then waits."""
    return (
        "import subprocess, sys, time\n"
        f"leaf = {textwrap.dedent(leaf)!r}\n"
        "subprocess.Popen([sys.executable, '-c', leaf, sys.argv[1]], start_new_session=True)\n"
        "while True:\n"
        "    time.sleep(0.1)\n"
    )


# Its flow run records how it ended when it is asked to stop.
HELPER = _helper(
    """
    import signal, sys, time
    from pathlib import Path
    def stop(*_):
        Path(sys.argv[1]).write_text("ended")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("leaf ready", flush=True)
    while True:
        time.sleep(0.1)
    """
)
# The command: starts the helper through tasks.lifetime, prints the pids, then waits to be killed.
COMMAND = textwrap.dedent(
    """
    import sys, time
    from tasks import lifetime
    helper = lifetime.start_helper([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    if sys.argv[3] == "release":
        lifetime.unwatch(helper.pid)
    print(helper.pid, flush=True)
    while True:
        time.sleep(0.1)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rpartition(")")[2].split()[0] != "Z"


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _start(tmp_path: Path, mode: str, helper: str = HELPER) -> tuple[subprocess.Popen, int, Path]:
    """The command, its helper's pid once the helper's own process runs, the leaf's record."""
    record = tmp_path / "leaf-ended"
    cmd = [sys.executable, "-c", COMMAND, helper, str(record), mode]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=root)
    # The helper's pid (the command's line) and "leaf ready" (the leaf's, once it handles
    # SIGTERM: a leaf signalled before would die without its record), in either order.
    lines = [proc.stdout.readline().strip() for _ in range(2)]
    assert "leaf ready" in lines, lines
    helper = int(next(line for line in lines if line.isdigit()))
    return proc, helper, record


def test_a_killed_command_takes_its_helper_and_what_the_helper_started_with_it(tmp_path):
    """SIGKILL of the command (no clean-up runs): the reaper stops the helper's own child,
    which sits in another session, first and with SIGTERM (it records how it ended), then the
    helper; nothing is left, the reaper included."""
    proc, helper, record = _start(tmp_path, "watch")
    leaf = lifetime.descendants([helper])[0]
    reaper = [p for p in lifetime.descendants([proc.pid]) if p not in (helper, leaf)]
    assert len(reaper) == 1
    proc.kill()
    proc.wait()
    assert _wait_for(lambda: not _alive(helper) and not _alive(leaf), 30)
    assert record.read_text() == "ended"  # asked to stop, not killed
    assert _wait_for(lambda: not any(map(_alive, reaper)), 10)


def test_a_helper_released_by_its_command_outlives_it(tmp_path):
    """What a command hands over on purpose (``dapo server start``'s server) is not stopped."""
    proc, helper, record = _start(tmp_path, "release")
    leaf = lifetime.descendants([helper])[0]
    try:
        proc.kill()
        proc.wait()
        time.sleep(2)
        assert _alive(helper) and _alive(leaf) and not record.exists()
    finally:
        for pid in (leaf, helper):
            os.kill(pid, signal.SIGKILL)


def test_a_pid_given_to_another_process_is_not_signalled():
    """The reaper knows a helper by its pid and start time: a recorded start time that is not
    the process's own (the pid was reused) leaves that process alone."""
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    other = subprocess.Popen(sleep, start_new_session=True)  # a helper leads its group
    try:
        assert lifetime.start_time(other.pid) is not None
        lifetime.reap({other.pid: "1"})
        assert other.poll() is None
        lifetime.reap({other.pid: lifetime.start_time(other.pid)})
        assert other.wait(timeout=15) == -signal.SIGTERM
    finally:
        other.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_a_forked_child_ends_with_the_process_that_forked_it(tmp_path):
    """The warm process's children: SIGKILL of the parent reaches the child as SIGTERM."""
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from pathlib import Path
        from tasks import lifetime
        parent = os.getpid()
        child = os.fork()
        if child == 0:
            def stop(*_):
                Path(sys.argv[1]).write_text("ended")
                os._exit(0)
            signal.signal(signal.SIGTERM, stop)
            assert lifetime.die_with_parent(parent)
            print(os.getpid(), flush=True)
            while True:
                time.sleep(0.1)
        while True:
            time.sleep(0.1)
        """
    )
    record = tmp_path / "child-ended"
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-c", script, str(record)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=root)
    child = int(proc.stdout.readline())
    proc.kill()
    proc.wait()
    assert _wait_for(lambda: not _alive(child), 30)
    assert record.read_text() == "ended"


WORDS = textwrap.dedent(
    """
    import sys, time
    from tasks import lifetime
    for name in ("kept", "taken"):
        script = f"from pathlib import Path; Path({sys.argv[1]!r}, {name!r}).write_text('said')"
        lifetime.last_words(name, [sys.executable, "-c", script])
    lifetime.take_back("taken")
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
    """
)


def test_last_words_are_said_once_the_command_is_killed_unless_taken_back(tmp_path):
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-c", WORDS, str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=root)
    assert proc.stdout.readline().strip() == "ready"
    assert not (tmp_path / "kept").exists()  # not while the command lives
    proc.kill()  # no handler, no atexit: only the closed pipe tells the reaper
    proc.wait()
    assert _wait_for(lambda: (tmp_path / "kept").exists(), 30)
    assert not (tmp_path / "taken").exists()


# A helper whose own process (a sweep's flow run, say) keeps a record through its own reaper:
# it leaves last words and has no SIGTERM handler, so only those words can end its record.
HELPER_WITH_WORDS = _helper(
    """
    import sys, time
    from tasks import lifetime
    script = f"from pathlib import Path; Path({sys.argv[1]!r}).write_text('said')"
    lifetime.last_words("record", [sys.executable, "-c", script])
    print("leaf ready", flush=True)
    while True:
        time.sleep(0.1)
    """
)


def test_a_reaper_below_a_helper_is_left_to_say_its_words(tmp_path):
    """The command's reaper stops what its helpers started, but not their own reapers: killed
    with its process, a flow run's reaper still ends the flow run's records."""
    proc, helper, record = _start(tmp_path, "watch", HELPER_WITH_WORDS)

    def leaf_and_its_reaper() -> list[int]:
        below = lifetime.descendants([helper])
        return below if len(below) == 2 and sum(map(lifetime.is_reaper, below)) == 1 else []

    # a hang guard: once seen a moment after "leaf ready" on a loaded machine, not at once
    assert _wait_for(leaf_and_its_reaper, 30), lifetime.descendants([helper])
    below = leaf_and_its_reaper()
    proc.kill()
    proc.wait()
    assert _wait_for(lambda: record.exists(), 30)
    assert _wait_for(lambda: not any(map(_alive, [helper, *below])), 30)
