"""The interrupt path's handlers (``tasks.signals``): a signal held until a write is over, one
ignored while a stop cleans up, and the handlers put back afterwards."""

import signal

from tasks.signals import deferred_signals, held_signals


def _recording(calls: list[int]):
    def handler(signum, frame):
        calls.append(signum)

    return handler


def test_held_signals_delivers_the_first_after_the_body_and_a_second_at_once():
    calls: list[int] = []
    before = signal.signal(signal.SIGINT, _recording(calls))
    try:
        with held_signals():
            signal.raise_signal(signal.SIGINT)
            assert calls == []  # held: the write is not cut
            signal.raise_signal(signal.SIGINT)
            assert calls == [signal.SIGINT]  # sent again: meant now
        assert calls == [signal.SIGINT, signal.SIGINT]  # the held one, after the body
        handler = signal.getsignal(signal.SIGINT)
        assert handler is not None and handler.__name__ == "handler"  # put back
    finally:
        signal.signal(signal.SIGINT, before)


def test_deferred_signals_ignores_an_interrupt_and_puts_the_handler_back():
    calls: list[int] = []
    before = signal.signal(signal.SIGTERM, _recording(calls))
    try:
        with deferred_signals():
            signal.raise_signal(signal.SIGTERM)
        assert calls == []
        signal.raise_signal(signal.SIGTERM)
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_collector_is_off_while_a_command_imports_and_on_once_its_work_begins():
    """``dapo``'s start-up (``flows.signals.until_work_begins``) turns the garbage collector off:
    the imports make no garbage, and collecting over them cost a sixth of their time; loading the
    config (``_working``) turns it on again, before any work."""
    import gc

    from flows.commands.base import _working
    from flows.signals import until_work_begins

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        until_work_begins()
        assert not gc.isenabled()
        _working()
        assert gc.isenabled()
    finally:
        gc.enable()
        for s, handler in handlers.items():
            signal.signal(s, handler)
