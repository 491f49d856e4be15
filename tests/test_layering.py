"""The layers: ``flows -> tasks -> dapo_core``, never back, and no import cycle inside a layer.

Every import counts, function-local ones included: a cycle hidden inside a function is still a
cycle for a reader.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("dapo_core", "tasks", "flows")  # each may import only those before it
FORBIDDEN = ["prefect", "mlflow", "dvc", "vllm", "deepspeed", "transformers", "pandas", "yaml"]


def test_dapo_core_imports_no_orchestration():
    code = (
        "import sys, importlib, pkgutil, dapo_core\n"
        "for m in pkgutil.iter_modules(dapo_core.__path__):\n"
        "    importlib.import_module('dapo_core.' + m.name)\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"dapo_core pulled in: {out.stdout.strip()}"


# What dapo_core may import besides the standard library: the numerical stack, everywhere; and
# Math-Verify in the reward's equivalence alone. Judging whether an answer equals the ground
# truth is the reward's job (Eq. 7), so the judge sits with it rather than behind an adapter in
# tasks/ that training and evaluation would each have to call: Math-Verify is pure Python on
# sympy (no orchestration, no I/O), and the reward imports it lazily, only for a ground truth that
# is not an integer, so training on integer answers never loads it.
CORE_ALLOWED = {"numpy", "torch", "sympy"}
# And scipy's Student-t quantiles in the method comparison's intervals over a few seeds.
CORE_ALLOWED_IN = {"dapo_core.equivalence": {"math_verify"}, "dapo_core.comparison": {"scipy"}}


def _third_party_imports(path: Path) -> set[str]:
    """Top-level names of the non-stdlib, non-project modules a file imports (any scope)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - set(LAYERS)


def test_dapo_core_imports_only_its_allowed_libraries():
    extra = {
        name: sorted(_third_party_imports(path) - CORE_ALLOWED - CORE_ALLOWED_IN.get(name, set()))
        for name, path in _modules().items()
        if name.split(".")[0] == "dapo_core"
    }
    assert {name: libs for name, libs in extra.items() if libs} == {}


def _modules() -> dict[str, Path]:
    """``{"tasks.training.run": path, ...}`` for every module of the three layers."""
    out = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules a file imports (``from pkg import mod`` resolves to ``pkg.mod``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in modules else node.module)
    return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_layers_import_only_downwards():
    graph = _graph()
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = [
        f"{a} imports {b}"
        for a, targets in graph.items()
        for b in targets
        if rank[b.split(".")[0]] > rank[a.split(".")[0]]
    ]
    assert not upward, upward


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# Inside tasks/: (a folder, one it must not import). Sampling serves training and evaluation (a
# process's world size, which both read, is tasks.runtime's); the preference trainers (reward
# model, DPO) build on training, and RL against a reward model reads it from tasks.models.
BELOW = [("tasks.rollout", "tasks.training"), ("tasks.training", "tasks.preferences")]


@pytest.mark.parametrize(("lower", "upper"), BELOW)
def test_folders_inside_tasks_import_only_downwards(lower, upper):
    upward = [
        f"{a} imports {b}"
        for a, targets in _graph().items()
        if a.startswith(lower)
        for b in targets
        if b.startswith(upper)
    ]
    assert not upward, upward


MAX_MODULE_LINES = 450  # a module a newcomer reads in one sitting


def test_every_module_of_the_layers_reads_in_one_sitting():
    long = {
        str(path.relative_to(ROOT)): n
        for layer in LAYERS
        for path in (ROOT / layer).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these by what they do (at most {MAX_MODULE_LINES} lines): {long}"
