"""compile_over_rows: one compilation serves every row count, so a call's kernels do not depend
on the calls before it (plain ``torch.compile`` specialises its first compilation to the first
call's rows)."""

import torch
from torch._dynamo.testing import CompileCounter

from dapo_core.compiled_rows import compile_over_rows


def _row_sums(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum(-1)


def _compilations(compile_fn) -> int:
    torch._dynamo.reset()
    counter = CompileCounter()
    f = compile_fn(_row_sums, counter)
    w = torch.arange(5.0)
    for rows in (4, 3, 7, 4):
        x = torch.ones(rows, 5)
        torch.testing.assert_close(f(x, w.expand(rows, 5)), torch.full((rows,), 10.0))
    return counter.frame_count


def test_rows_are_symbolic_from_the_first_call():
    assert _compilations(lambda fn, b: compile_over_rows(fn, backend=b)) == 1
    # the behaviour it replaces: a fixed-size compilation first, a symbolic one at the second call
    assert _compilations(lambda fn, b: torch.compile(fn, dynamic=None, backend=b)) == 2
