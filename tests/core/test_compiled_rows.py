"""compile_over_rows: one compilation serves every row count above one, tuned for a fixed row
count, so a call's kernels depend neither on the calls before it nor on the first call's size
(plain ``torch.compile`` specialises its first compilation to the first call's rows)."""

import torch
from torch._dynamo.testing import CompileCounter

from dapo_core.compiled_rows import compile_over_rows


def _row_sums(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum(-1)


def _compilations(compile_fn, rows=(4, 3, 7, 4)) -> int:
    torch._dynamo.reset()
    counter = CompileCounter()
    f = compile_fn(_row_sums, counter)
    w = torch.arange(5.0)
    for n in rows:
        x = torch.ones(n, 5)
        torch.testing.assert_close(f(x, w.expand(n, 5)), torch.full((n,), 10.0))
    return counter.frame_count


def test_rows_are_symbolic_from_the_first_call():
    assert _compilations(lambda fn, b: compile_over_rows(fn, 64, backend=b)) == 1
    # the behaviour it replaces: a fixed-size compilation first, a symbolic one at the second call
    assert _compilations(lambda fn, b: torch.compile(fn, dynamic=None, backend=b)) == 2
    # one row is compiled apart, wherever it comes
    assert _compilations(lambda fn, b: compile_over_rows(fn, 64, backend=b), (1, 4, 1, 3)) == 2


def test_the_kernels_are_tuned_for_the_hint_not_the_first_call():
    """What the compiler sees as the rows' size (the hint it tunes reductions to) is the fixed
    hint, whatever the first call's rows; the other dimension stays a constant."""
    seen = []

    def backend(gm, example_inputs):
        for node in gm.graph.find_nodes(op="placeholder"):
            value = node.meta["example_value"]
            if isinstance(value, torch.Tensor):  # the rows' size is a placeholder too
                seen.append((value.shape[0].node.hint, value.shape[1]))
        return gm.forward

    for first in (3, 9):
        torch._dynamo.reset()
        seen.clear()
        f = compile_over_rows(_row_sums, 256, backend=backend)
        f(torch.ones(first, 5), torch.ones(first, 5))
        assert seen == [(256, 5), (256, 5)]
