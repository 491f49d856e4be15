"""A Prefect global concurrency limit that training runs share (issue 45, item 4): with one slot,
two runs never train at once; a limit the server lacks is one line that says how to make it."""

import threading
import time

import pytest
from prefect import flow

from dapo_core.config_loader import resolve
from dapo_core.errors import PipelineError
from tasks.orchestration import concurrency_slot


def _limit(name: str, slots: int) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots))


def _two_runs(
    limit: str, inside, asks: list[float] | None = None
) -> list[tuple[float, float, float]]:
    """Two flow runs at once, each running ``inside()`` while it holds a slot of ``limit``:
    when each asked for its slot, got it, and let it go."""
    spans: list[tuple[float, float, float]] = []
    asks = [] if asks is None else asks

    @flow
    def holds_a_slot() -> None:
        asked = time.monotonic()
        asks.append(asked)
        with concurrency_slot(limit):
            got = time.monotonic()
            inside()
            spans.append((asked, got, time.monotonic()))

    runs = [threading.Thread(target=holds_a_slot) for _ in range(2)]
    for r in runs:
        r.start()
    for r in runs:
        r.join(timeout=180)
    assert len(spans) == 2, spans
    return sorted(spans, key=lambda s: s[1])


def test_one_slot_lets_one_run_train_at_a_time_and_two_let_both(flows_env):
    _limit("gpu-one", 1)
    _limit("gpu-two", 2)
    asks: list[float] = []

    def until_both_asked() -> None:  # the first holds its slot until the second has asked
        deadline = time.monotonic() + 120
        while len(asks) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)

    (_, _, first_done), (asked, got, _) = _two_runs("gpu-one", until_both_asked, asks)
    assert asked < first_done  # the second asked while the first held the slot ...
    assert got >= first_done  # ... and got it only once the first let it go
    # with two slots both hold one at once: each waits inside for the other (else it times out)
    both = threading.Barrier(2)
    _two_runs("gpu-two", lambda: both.wait(timeout=120))


def test_a_limit_the_server_lacks_stops_training_in_one_line(flows_env, flow_cfg, tmp_path):
    from tasks.training.task import train_task

    cfg = resolve(flow_cfg.to_dict(), overrides=["train.concurrency_limit=no-such-limit"])

    @flow
    def train() -> None:
        train_task.fn(cfg, str(tmp_path / "run"), progress=False, track=False)

    with pytest.raises(PipelineError, match="prefect gcl create no-such-limit --limit 1"):
        train()
    assert not (tmp_path / "run" / "final").exists()


def test_without_a_flow_run_there_is_no_slot_to_take_and_it_says_so(caplog):
    ran = []
    with concurrency_slot("gpu"):
        ran.append(True)
    assert ran and "no Prefect server to hold its slots" in caplog.text


def test_ctrl_c_while_waiting_for_a_slot_ends_the_run_killed_and_takes_no_slot(
    flows_env, flow_cfg, tmp_path, monkeypatch
):
    """Ctrl-C while a training run waits for its slot (another holds the only one): the run's
    MLflow run ends KILLED, the flow run says it was interrupted, and the slot it waited for is
    not left taken: once the holder lets go, the next asker gets it (a slot taken by the
    abandoned request would stay held for its 300 s lease)."""
    import signal

    import prefect.concurrency.sync
    from prefect.concurrency.sync import concurrency

    from dapo_core.errors import TrainingInterrupted
    from tasks.tracking import store
    from tasks.training.task import train_task

    _limit("gpu-held", 1)
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with concurrency("gpu-held", occupy=1, strict=True):
            holding.set()
            release.wait(180)

    held = threading.Thread(target=holder)
    held.start()
    try:
        assert holding.wait(60)
        cfg = resolve(flow_cfg.to_dict(), overrides=["train.concurrency_limit=gpu-held"])
        main, asking, ended = threading.get_ident(), threading.Event(), threading.Event()

        def asks(*args, **kwargs):  # the training run asks for its slot (and waits)
            asking.set()
            return concurrency(*args, **kwargs)

        monkeypatch.setattr(prefect.concurrency.sync, "concurrency", asks)

        def interrupt_once_waiting() -> None:
            if asking.wait(120):
                time.sleep(1.0)  # into the wait the held slot makes
                if not ended.is_set():  # never into the test after the flow
                    signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, in the main thread

        @flow
        def waits_for_a_slot() -> None:
            try:
                train_task(cfg, str(tmp_path / "run"), run_name="slot-wait", progress=False)
            finally:
                ended.set()

        # Ctrl-C raises in the main thread, as in a command (whatever the worker had installed)
        before = signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Thread(target=interrupt_once_waiting, daemon=True).start()
        try:
            with pytest.raises((TrainingInterrupted, KeyboardInterrupt)):
                waits_for_a_slot()
        finally:
            signal.signal(signal.SIGINT, before)
    finally:
        release.set()
        held.join(timeout=60)
    (run,) = [r for r in store.search_runs(cfg, "train") if r["name"] == "slot-wait"]
    assert run["status"] == "KILLED"
    assert not (tmp_path / "run" / "final").exists()
    with concurrency("gpu-held", occupy=1, strict=True, timeout_seconds=60):
        pass  # the slot is free again
