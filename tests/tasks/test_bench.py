"""Benchmark helpers do equal work and count what they claim (timings are not asserted here)."""

import pytest

from bench import dynamic_sampling, generation
from dapo_core.synthetic import arith_problems
from tasks.models.loading import load_policy
from tasks.models.resolve import resolve_model_path


def test_generation_sides_produce_the_same_number_of_tokens(tiny_cfg):
    model, tok = load_policy(resolve_model_path(tiny_cfg))
    train, _ = arith_problems(1, 20, 0, 9, 2)
    prompts = [p.prompt for p in train[:3]]
    # Each side asserts exactly L tokens per sample; its time must then be positive and finite.
    sides = (generation.ours, generation.baseline)
    times = [side(model, tok, prompts, 2, 5) for side in sides]
    times.append(generation.baseline(model, tok, prompts, 2, 5, cache="static"))
    assert all(0 < t < float("inf") for t in times)


def test_generation_of_the_large_shape_uses_the_tiny_tokenizer_ids(tmp_path, monkeypatch):
    """The 0.5B shape is built with the tiny tokenizer's special ids, so EOS suppression and
    padding mean the same on every side (shrunk here: the same code path, a CPU-sized model)."""
    from bench import mfu

    monkeypatch.setitem(mfu.SHAPES, "small", (64, 128, 2, 4, 2, 1000, 1e4, 4096))
    model, tok = generation.load_model("small", tmp_path / "m")
    assert model.config.vocab_size == 1000 > len(tok)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    t = generation.ours(model, tok, ["Compute 1 + 2."], 2, 4)
    assert 0 < t < float("inf")


@pytest.mark.slow
@pytest.mark.parametrize("sized", [False, True])
def test_dynamic_sampling_waste_accounting(sized):
    overrides = [
        "train.prompt_batch=16",
        "train.gen_batch=24",
        f"algo.size_gen_batches={str(sized).lower()}",
    ]
    r = dynamic_sampling.measure(2, overrides)
    if not sized:
        assert r["groups_generated"] % 24 == 0 and r["groups_generated"] >= 2 * 24  # whole batches
    assert r["groups_trained"] <= 2 * 16
    # From an empty carry nothing is trained that was not kept: waste >= 1 (1 is the bound).
    assert r["waste"] >= 1.0 - 1e-9
    assert r["bound"] == pytest.approx(1 / r["kept_frac"])


def test_bench_shapes_parse_and_bad_ones_are_usage_errors(capsys):
    from bench import common

    ap = common.parser("a bench\n")
    assert common.parse(ap, ["--shapes", "16x8x16", "2X3x4"]).shapes == [(16, 8, 16), (2, 3, 4)]
    assert ap.parse_args([]).shapes == [(16, 8, 16), (8, 8, 64)]
    for bad in ("16x8", "16x0x4", "axbxc"):
        with pytest.raises(SystemExit) as e:
            ap.parse_args(["--shapes", bad])
        assert e.value.code == 2 and "is not PxGxL" in capsys.readouterr().err


def test_bench_numbers_out_of_range_are_usage_errors(capsys):
    """--top-p 1.5 used to run, and time a sampler no run would ever use."""
    from bench import common

    ap = common.parser("a bench\n")
    ap.add_argument("--top-p", type=common.top_p, default=1.0)
    ap.add_argument("--rate", type=common.positive_float, default=1.0)
    assert ap.parse_args(["--top-p", "0.7", "--rate", "3.35"]).top_p == 0.7
    assert ap.parse_args(["--top-p", "1"]).top_p == 1.0
    for option, bad in [("--top-p", "1.5"), ("--top-p", "0"), ("--rate", "-1"), ("--rate", "nan")]:
        with pytest.raises(SystemExit) as e:
            ap.parse_args([option, bad])
        assert e.value.code == 2 and bad in capsys.readouterr().err


def test_a_benchmark_interrupted_exits_130_with_one_line(capsys):
    import bench

    def interrupted() -> None:
        print("figure 1: 3.0 ms")
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        bench.run(interrupted)
    out = capsys.readouterr()
    assert e.value.code == 130 and out.out == "figure 1: 3.0 ms\n"  # what was measured stands
    assert out.err.startswith("interrupted:") and out.err.count("\n") == 1
    for returned, code in [(None, 0), (0, 0), (1, 1)]:  # a benchmark's own verdict passes through
        with pytest.raises(SystemExit) as e:
            bench.run(lambda returned=returned: returned)
        assert e.value.code == code


def test_every_benchmark_entry_point_goes_through_bench_run():
    """A module run as ``python -m bench.NAME`` ends a Ctrl-C without a traceback."""
    import ast
    from pathlib import Path

    import bench

    for path in sorted(Path(bench.__file__).parent.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                assert "bench.run(" in ast.unparse(node), path.name


def test_ladder_check_reads_the_results_tables_and_judges_by_their_ci(capsys):
    """bench.ladder_check finds the whole chain ladder of docs/results.md and its algorithm
    table, and counts a published value outside the sweep's CI as a miss."""
    import pandas as pd

    from bench import ladder_check
    from dapo_core.ablation import ABLATION_LADDER, ALGORITHM_PRESETS

    ladder = ladder_check.results_table("ladder")
    assert list(ladder) == list(ABLATION_LADDER) and all(0 < v < 1 for v in ladder.values())
    algorithms = ladder_check.results_table("algorithms")
    assert list(algorithms)[0] == "dapo" and set(algorithms) <= set(ALGORITHM_PRESETS)
    assert len(algorithms) >= 8
    grpo = ladder["grpo"]
    inside = pd.DataFrame(
        [{"variant": "grpo", "avg_at_k": grpo, "ci_low": grpo - 0.01, "ci_high": grpo + 0.01}]
    )
    outside = inside.assign(ci_low=grpo + 0.001)
    assert ladder_check.compare(inside, ladder) == 0
    assert ladder_check.compare(outside, ladder) == 1
    assert "NO" in capsys.readouterr().out


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ladder_check_interrupts_its_sweep_once_and_waits_for_its_clean_up(tmp_path):
    """Ctrl-C to the check passes one SIGINT to the sweep and waits for its clean-up (before,
    subprocess.run SIGKILLed it after 0.25 s, stranding its server and workers)."""
    import subprocess
    import sys

    from bench import ladder_check

    marker = tmp_path / "cleaned"
    code = (
        "import signal, sys, time\n"
        "def bye(*a):\n"
        "    time.sleep(1.0)\n"  # a clean-up that takes a while
        f"    open({str(marker)!r}, 'a').write('x')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGINT, bye)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    ladder_check.stop(child)
    assert child.returncode == 0 and marker.read_text() == "x"


def test_ladder_check_sweep_dies_with_the_check(tmp_path):
    """SIGKILL of the check (an OOM kill, a scheduler's) ends its sweep too (parent-death
    signal), instead of leaving it training headless."""
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import subprocess, sys\n"
        "from bench.ladder_check import _die_with_parent\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
        "                     start_new_session=True, preexec_fn=_die_with_parent)\n"
        "print(c.pid, flush=True)\n"
        "c.wait()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    assert _alive(pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 60  # a hang guard: the kernel ends it with its parent
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_across_starts_says_which_differences_hold_from_every_start():
    import pandas as pd

    from bench.across_starts import score_rows

    def table(delta_b, clear_b, delta_c, clear_c):
        return pd.DataFrame(
            [
                {"variant": "a", "avg_at_k": 0.5, "delta": None, "distinguishable": False},
                {"variant": "b", "avg_at_k": 0.6, "delta": delta_b, "distinguishable": clear_b},
                {"variant": "c", "avg_at_k": 0.4, "delta": delta_c, "distinguishable": clear_c},
            ]
        )

    rows = score_rows([table(0.1, True, -0.05, True), table(0.2, True, 0.01, False)])
    assert rows[0] == "| `a` | 0.500 / 0.500 | | |"
    assert rows[1].endswith("| +0.100 / +0.200 | **+ from every start** |")
    assert rows[2].endswith("| -0.050 / +0.010 | flips with the start |")
    some = score_rows([table(0.1, True, -0.01, False), table(0.1, False, 0.02, False)])
    assert some[1].endswith("same sign (+), clear of 0 from 1 of 2 |")
    assert some[2].endswith("CI spans 0 from every start |")


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("COMPATIBLE", "this machine computes the same bits"),
        ("AVX2@GenuineIntel", "other draws"),
        ("AVX2@HygonGenuine", "the release records none for this machine's kernels"),
        (None, "(unpinned)"),
    ],
)
def test_ladder_check_expects_the_tables_bits_only_under_their_rounding(
    monkeypatch, capsys, tmp_path, key, said
):
    """The tables are those of one rounding (MKL's COMPATIBLE branch): a machine reproducing
    the reference run of another (an Intel one under MKL's AVX2 branch) does not compute the
    tables' values."""
    import flows.models
    from bench import ladder_check

    recorded = {"COMPATIBLE": "sha256:c", "AVX2@GenuineIntel": "sha256:i"}
    got = recorded.get(key, "sha256:h")
    check = flows.models.ReferenceCheck("tiny-chain", key, recorded, got, {})
    monkeypatch.setattr(flows.models, "check_reference", lambda cfg, scratch: check)
    ladder_check.reference(tmp_path)
    out = capsys.readouterr().out
    assert said in out
    assert ("same bits" in out) == (key == "COMPATIBLE")
    if key == "COMPATIBLE":  # the algorithms' table is AMD's, under MKL's AVX2 branch
        ladder_check.reference(tmp_path, "algorithms")
        out = capsys.readouterr().out
        assert "same bits" not in out and "AuthenticAMD CPU computes them with MKL_CBWR=AVX2" in out


def test_ladder_check_stopped_by_sigterm_exits_143_as_a_dapo_command_does():
    import signal

    from bench import ladder_check
    from tasks import signals

    signals.forget_interrupts()
    try:
        with pytest.raises(KeyboardInterrupt):
            ladder_check._terminate(signal.SIGTERM, None)
        assert signals.interrupted_status() == 143
        signals.note_interrupt(signal.SIGINT)  # a second signal does not change what stopped it
        assert signals.interrupted_status() == 143
    finally:
        signals.forget_interrupts()
    assert signals.interrupted_status() == 130  # a KeyboardInterrupt no handler saw: Ctrl-C's
