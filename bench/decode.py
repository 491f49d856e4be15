"""One decode step of the CUDA-graph sampler: each way of computing it, and where its time goes.

    python -m bench.decode                       # CUDA: Qwen2.5-0.5B's shape, B = 64 and 512
    python -m bench.decode --batches 64 --variants lean default --profile default

The decoder (``tasks.rollout.graphs.StaticDecoder``) decodes ``--new`` positions after a prompt
of ``--prompt`` positions, its window growing as a rollout's does, once to capture its graphs and
once timed (CUDA events around the whole rollout): ms per step is the second over ``--new``.
Sampling (``tasks.rollout.sampling``: ``exact``, ``flat`` and ``blocked``, eager and compiled) is
timed apart on the step's (B, V) logits, on CUDA replayed from a graph as in a rollout, at top-p
1 and at each ``--top-p`` (evaluation's 0.7: the sort's nucleus against the blocked sampler's
floor), and the exact sampler's kernels profiled by operator.
Variants (``DecodeOptions``): ``lean`` (the step before fused kernels: six attention kernels, three
q/k/v and two gate/up products per layer, nothing compiled), ``fused`` (q/k/v and gate/up one
product each), ``sdpa`` (and attention one kernel), ``default`` (and the pointwise work compiled),
``compiled-matmul`` (compiled, with the six-kernel attention), ``static-shapes`` (``default``
compiled for each batch size), ``flex`` (``default`` with FlexAttention's decoding kernel, one
window whose unwritten blocks it skips), ``flex-static`` (both) and ``flex-static-autotune``
(``flex-static`` with Inductor's max-autotune choosing each product's kernel).

``--profile``: one eager step per batch under ``torch.profiler``, each kernel attributed to the
operator that launched it, grouped into the step's parts, each against its floor: the bytes it
must move (weights, the key/value window, the logits) over the device's copy bandwidth, measured
here. The graph's overhead is the replayed step's time less its kernels' time.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

import bench
from bench import common
from bench.common import positive_int, sync
from bench.mfu import SHAPES, build_model
from tasks.rollout import sampling
from tasks.rollout.graphs import DECODE_STEPS, LEAN_OPTIONS, DecodeOptions, StaticDecoder
from tasks.rollout.sampling import (
    block_log_masses,
    nucleus_floor,
    sample_blocked,
    sample_flat,
    sample_next,
    sampler_for,
    tempered_probs,
)

VARIANTS = {
    "lean": LEAN_OPTIONS,
    "fused": DecodeOptions(attention="matmul", fuse=True, compiled=False),
    "sdpa": DecodeOptions(attention="sdpa", fuse=True, compiled=False),
    "compiled-matmul": DecodeOptions(attention="matmul", fuse=True, compiled=None),
    **DECODE_STEPS,  # rollout.decode_step's choices
}
PARTS = ("matrix products", "lm head", "attention", "kv writes", "pointwise", "sampling")


def elapsed_ms(fn, device) -> float:
    """Device milliseconds of ``fn()`` (CUDA events), or host ones off CUDA."""
    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - t)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def copy_bandwidth(device) -> float:
    """Bytes per second of a large device-to-device copy, bytes read plus bytes written."""
    if device.type != "cuda":
        return float("nan")
    a = torch.empty(1 << 28, dtype=torch.float32, device=device)  # 1 GiB
    b = torch.empty_like(a)
    b.copy_(a)
    ms = statistics.median(elapsed_ms(lambda: b.copy_(a), device) for _ in range(10))
    return 2 * a.numel() * a.element_size() / (ms / 1000)


def loaded_decoder(model, rows: int, prompt: int, new: int, options, capture: bool):
    """A decoder holding a random prefilled prompt cache for ``rows`` sequences."""
    dec = StaticDecoder(model, rows, prompt + new, capture, options)
    shape = (rows, dec.n_kv, prompt, dec.head_dim)
    dtype, device = model.dtype, model.device
    keys = [torch.randn(shape, dtype=dtype, device=device) for _ in dec.kv_buf]
    values = [torch.randn(shape, dtype=dtype, device=device) for _ in dec.kv_buf]
    mask = torch.ones(rows, prompt, dtype=torch.long, device=device)
    mask[: rows // 2, : prompt // 4] = 0  # left padding on half the rows
    dec.load(keys, values, mask)
    return dec


def rollout(dec, new: int, prompt: int, vocab: int) -> None:
    """``new`` decode steps, tokens fixed (the step's cost does not depend on them)."""
    rows = dec.rows
    tokens = torch.randint(vocab, (rows,), device=dec.tok.device)
    pos = torch.full((rows, 1), prompt, device=dec.tok.device)
    dec.length = prompt
    dec.cur.fill_(prompt)
    for _ in range(new):
        dec.step(tokens, pos)
        pos += 1


def first_call_s(model, rows: int, prompt: int, new: int, options) -> list[tuple[int, float]]:
    """Seconds of compilation and capture a rollout of ``rows`` sequences pays the first time at
    each batch size compaction takes it through (``rows``, half, ..., 1): each size's first
    rollout less its second. Compiled code is shared across sizes and decoders, so sizes after
    the first pay only what they compile anew (every one, with fixed sizes)."""
    cuda = model.device.type == "cuda"
    vocab, out = model.config.vocab_size, []
    while rows >= 1:
        dec = loaded_decoder(model, rows, prompt, new, options, capture=cuda)
        first, again = (
            elapsed_ms(lambda d=dec: rollout(d, new, prompt, vocab), model.device) for _ in range(2)
        )
        out.append((rows, (first - again) / 1000))
        rows //= 2
    return out


def step_ms(model, rows: int, prompt: int, new: int, options) -> float:
    """Median over two timed rollouts of ms per decode step, graphs captured beforehand."""
    cuda = model.device.type == "cuda"
    dec = loaded_decoder(model, rows, prompt, new, options, capture=cuda)
    vocab = model.config.vocab_size
    rollout(dec, new, prompt, vocab)  # captures every window's graph (compiles, if asked)
    runs = [elapsed_ms(lambda: rollout(dec, new, prompt, vocab), model.device) for _ in range(2)]
    return statistics.median(runs) / new


SAMPLER_TIMINGS = (
    "exact",
    "flat eager",
    "flat",
    "blocked eager",
    "blocked parts",
    "blocked parts x4",
    "blocked parts x16",
    "blocked whole",
)
"""The samplers ``sampling_ms`` can time: the three of ``tasks.rollout.sampling``, eager and as
CUDA compiles them."""


def sampling_ms(
    rows: int,
    vocab: int,
    device,
    dtype,
    top_p: float = 1.0,
    names: tuple[str, ...] = SAMPLER_TIMINGS,
) -> dict[str, float]:
    """ms of one sampling call on (rows, vocab) logits, temperature 1, for each sampler of
    ``names`` (below top-p 1 the flat sampler is the exact one: left out)."""
    logits = torch.randn(rows, vocab, device=device, dtype=dtype)
    u = torch.rand(rows, 1, device=device)
    makers = {
        "exact": lambda: sample_next,
        "flat eager": lambda: functools.partial(sample_flat, probs_fn=tempered_probs),
        "flat": lambda: sampler_for("flat", device),
        "blocked eager": lambda: sample_blocked,
        # the two ways CUDA compiles it (sample_blocked_cuda: whole at top-p 1, parts below);
        # below top-p 1 also with the nucleus floor's search narrowed 4x or 16x a pass, not 2x
        "blocked parts": lambda: blocked_parts(sampling.NUCLEUS_BITS_PER_PASS),
        "blocked parts x4": lambda: blocked_parts(2),
        "blocked parts x16": lambda: blocked_parts(4),
        "blocked whole": lambda: sampling._compiled(sampling.sample_blocked_whole),
    }
    # below top-p 1 flat is exact; at top-p 1 there is no floor to search for
    skip = {"flat eager", "flat"} if top_p < 1.0 else {"blocked parts x4", "blocked parts x16"}
    fns = {k: makers[k]() for k in names if k not in skip}
    out = {}
    for name, fn in fns.items():
        call = functools.partial(fn, logits, 1.0, top_p, u)
        try:
            for _ in range(3):
                call()
            call = replayable(call, device) or call
            out[name] = statistics.median(elapsed_ms(call, device) for _ in range(20))
        except Exception as e:  # report, and time the others
            print(f"  sampling {name} at B={rows}: failed: {type(e).__name__}: {e}")
            out[name] = float("nan")
    return out


def blocked_parts(bits_per_pass: int):
    """The blocked sampler as CUDA runs it below top-p 1 (block masses and nucleus floor compiled
    apart), the floor's search settling ``bits_per_pass`` key bits a pass."""
    floor = functools.partial(nucleus_floor, bits_per_pass=bits_per_pass)
    return functools.partial(
        sample_blocked,
        masses_fn=sampling._compiled(block_log_masses),
        floor_fn=sampling._compiled(floor),
    )


def replayable(fn, device):
    """On CUDA, ``fn`` recorded in a CUDA graph: its replay, whose time is the kernels' alone, as
    in a rollout (the sampler is recorded in the step's graph); None where it cannot be
    recorded (off CUDA, or a sampler that syncs with the host)."""
    if device.type != "cuda":
        return None
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception as e:
        print(f"  (not recorded in a graph, timed with its host calls: {type(e).__name__})")
        return None
    return graph.replay


def sampling_ops(rows: int, vocab: int, device, dtype, top: int = 8) -> list[tuple[str, float]]:
    """The ``exact`` sampler's operators by their kernels' ms (where its time goes)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    logits = torch.randn(rows, vocab, device=device, dtype=dtype)
    u = torch.rand(rows, 1, device=device)
    sample_next(logits, 1.0, 1.0, u)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sample_next(logits, 1.0, 1.0, u)
        sync(device)
    ops = [
        (e.key, e.self_device_time_total / 1000)
        for e in prof.key_averages()
        if e.key.startswith("aten::")  # operators, not their kernels listed again
    ]
    return sorted((o for o in ops if o[1] > 0), key=lambda o: -o[1])[:top]


def _part(op: str, dims: str, window: int, vocab: int) -> str:
    """Which part of the step an operator's kernels belong to (by operator name and shapes)."""
    if op.startswith(("triton", "Torch-Compiled", "CompiledFunction")):
        return "pointwise"
    if "attention" in op or op in ("aten::bmm", "aten::_softmax"):
        return "attention"
    if op in ("aten::index_copy_", "aten::index_fill_"):
        return "kv writes"
    if op in ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul"):
        return "lm head" if str(vocab) in dims else "matrix products"
    if f", {window}]" in dims:  # the six-kernel attention's scale, mask and cast
        return "attention"
    return "pointwise"


def _template_part(name: str) -> str:
    """A compiled template's part: max-autotune's matrix products (named after their operators,
    ``triton_tem_fused_addmm_0``, with the pointwise work fused into them) or FlexAttention's."""
    return "matrix products" if "mm" in name.removeprefix("triton_tem") else "attention"


def attribute(trace: list[dict], window: int, vocab: int) -> dict[str, float]:
    """Kernel microseconds per part: each kernel goes to the innermost operator around the
    runtime call that launched it (same thread), compiled ones to ``pointwise`` but the
    templates' (``_template_part``)."""
    kernels = [e for e in trace if e.get("cat") == "kernel"]
    launches = {
        e["args"].get("correlation"): e
        for e in trace
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "args" in e
    }
    ops: dict[object, list[dict]] = defaultdict(list)
    for e in trace:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            ops[e["tid"]].append(e)
    starts = {tid: [e["ts"] for e in sorted(v, key=lambda e: e["ts"])] for tid, v in ops.items()}
    ordered = {tid: sorted(v, key=lambda e: e["ts"]) for tid, v in ops.items()}
    out: dict[str, float] = defaultdict(float)
    for k in kernels:
        name = k["name"]
        launch = launches.get(k.get("args", {}).get("correlation"))
        part = _template_part(name) if name.startswith("triton_tem") else "pointwise"
        if not name.startswith("triton") and launch is not None:
            tid, ts = launch["tid"], launch["ts"]
            seq = ordered.get(tid, [])
            i = bisect.bisect_right(starts.get(tid, []), ts)
            inner = [e for e in seq[max(0, i - 200) : i] if e["ts"] + e.get("dur", 0) >= ts]
            if inner:
                op = max(inner, key=lambda e: e["ts"])
                dims = str(op.get("args", {}).get("Input Dims", ""))
                part = _part(op["name"], dims, window, vocab)
        out[part] += k.get("dur", 0.0)
    return out


def profile(model, rows: int, prompt: int, new: int, options, out: Path):
    """(kernel ms per part, the replayed step's ms, the window) of a step at the last window."""
    cuda = model.device.type == "cuda"
    dec = loaded_decoder(model, rows, prompt, new, options, capture=cuda)
    vocab, last = model.config.vocab_size, prompt + new - 1
    rollout(dec, new - 1, prompt, vocab)  # up to the last window, its graph captured
    tokens = torch.randint(vocab, (rows,), device=model.device)
    pos = torch.full((rows, 1), last, device=model.device)

    def last_step():
        dec.length = last
        dec.cur.fill_(last)
        return dec.step(tokens, pos)

    replay = statistics.median(elapsed_ms(last_step, model.device) for _ in range(20))
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with torch_profile(activities=acts, record_shapes=True) as prof:
        dec.cur.fill_(last)
        dec._run()  # the same step's kernels, launched one by one
        sync(model.device)
    prof.export_chrome_trace(str(out))
    trace = json.loads(out.read_text())["traceEvents"]
    window = dec._shape[1]
    parts = {k: v / 1000 for k, v in attribute(trace, window, vocab).items()}
    logits = last_step()
    with torch_profile(activities=acts) as prof:
        sampler_for("auto", model.device)(
            logits, 1.0, 1.0, torch.rand(rows, 1, device=model.device)
        )
        sync(model.device)
    # each kernel once, from the operator that launched it (key_averages lists both)
    parts["sampling"] = sum(k.duration for e in prof.events() for k in e.kernels) / 1000
    return parts, replay, window


def floors_ms(model, rows: int, window: int, bandwidth: float) -> dict[str, float]:
    """The least time each part can take: the bytes it must move over the copy bandwidth."""
    cfg, size = model.config, model.dtype.itemsize
    decoder = model.get_decoder()
    layer_weights = sum(p.numel() for p in decoder.layers.parameters()) * size
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    head_dim = getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * rows * cfg.num_key_value_heads * window * head_dim * size
    return {
        "matrix products": 1000 * layer_weights / bandwidth,
        "lm head": 1000 * (vocab * hidden + rows * vocab) * size / bandwidth,
        "attention": 1000 * kv / bandwidth,
        "kv writes": 0.0,
        "pointwise": 0.0,
        "sampling": 1000 * rows * vocab * size / bandwidth,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    ap.add_argument("--model", choices=list(SHAPES), default="qwen2.5-0.5b" if cuda else "tiny")
    ap.add_argument("--batches", nargs="+", type=positive_int, default=[64, 512])
    ap.add_argument("--prompt", type=positive_int, default=64, help="prompt positions")
    ap.add_argument("--new", type=positive_int, default=512, help="decoded positions")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--profile", nargs="*", choices=list(VARIANTS), default=[])
    ap.add_argument("--out", default=None, help="folder for the profiles' traces")
    ap.add_argument(
        "--top-p", nargs="*", type=common.top_p, default=[0.7], help="samplers timed at these too"
    )
    ap.add_argument(
        "--samplers",
        nargs="+",
        choices=[name.replace(" ", "-") for name in SAMPLER_TIMINGS],
        default=[name.replace(" ", "-") for name in SAMPLER_TIMINGS],
        help="the samplers timed (each compiled one compiles first: tens of seconds on a CPU)",
    )
    ap.add_argument(
        "--first-calls",
        action="store_true",
        help="only the compilation and capture each variant pays at each batch size (run each "
        "variant in a fresh process with an empty TORCHINDUCTOR_CACHE_DIR for a cold start)",
    )
    a = ap.parse_args(argv)
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build_model(a.model, device, dtype=dtype).eval().requires_grad_(False)
    vocab = model.config.vocab_size
    name = torch.cuda.get_device_name() if cuda else "cpu"
    bandwidth = copy_bandwidth(device)
    print(
        f"decode step: {a.model} ({dtype}) on {name}, torch {torch.__version__}; prompt "
        f"{a.prompt} + {a.new} new positions; copy bandwidth {bandwidth / 1e12:.2f} TB/s"
    )
    with torch.no_grad():
        if a.first_calls:
            for rows in a.batches:
                for v in a.variants:
                    costs = first_call_s(model, rows, a.prompt, a.new, VARIANTS[v])
                    each = ", ".join(f"B={r} {s:.1f}" for r, s in costs)
                    total = sum(s for _, s in costs)
                    print(f"  {v} from B={rows}: first calls {total:.1f} s in all ({each})")
            return
        results = {}
        for rows in a.batches:
            for v in a.variants:
                try:
                    results[rows, v] = step_ms(model, rows, a.prompt, a.new, VARIANTS[v])
                except Exception as e:  # a variant that cannot run here: the others still can
                    print(f"  B={rows} {v}: failed: {type(e).__name__}: {e}", flush=True)
                    continue
                print(f"  B={rows} {v}: {results[rows, v]:.3f} ms/step", flush=True)
        print(f"{'B':>5} {'variant':>16} {'ms/step':>8} {'vs lean':>8} {'tok/s':>9}")
        for (rows, v), ms in results.items():
            base = results.get((rows, "lean"))
            ratio = f"{ms / base:.2f}x" if base else "-"
            print(f"{rows:>5} {v:>16} {ms:8.3f} {ratio:>8} {rows * 1000 / ms:9.0f}")
        for top_p in dict.fromkeys((1.0, *a.top_p)):  # top-p 1 once
            names = tuple(name.replace("-", " ") for name in a.samplers)
            sampling = {r: sampling_ms(r, vocab, device, dtype, top_p, names) for r in a.batches}
            head = f"sampling ms, top-p {top_p}:"
            print(f"{'B':>5} {head:>27} " + " ".join(f"{k:>13}" for k in sampling[a.batches[0]]))
            for r, ms in sampling.items():
                print(f"{r:>5} {'':>27} " + " ".join(f"{v:13.3f}" for v in ms.values()))
        if cuda:
            rows = max(a.batches)
            ops = sampling_ops(rows, vocab, device, dtype)
            print(
                f"exact sampler at B={rows}, ms by operator: "
                + ", ".join(f"{k} {v:.3f}" for k, v in ops)
            )
        if not a.profile:
            return
        folder = Path(a.out or tempfile.mkdtemp())
        folder.mkdir(parents=True, exist_ok=True)
        for rows in a.batches:
            for v in a.profile:
                trace = folder / f"decode_{v}_{rows}.json"
                parts, replay, window = profile(model, rows, a.prompt, a.new, VARIANTS[v], trace)
                floors = floors_ms(model, rows, window, bandwidth)
                busy = sum(parts.get(p, 0.0) for p in PARTS if p != "sampling")
                print(
                    f"B={rows} {v}, a step at the last window ({window} positions): replayed "
                    f"{replay:.3f} ms, its kernels {busy:.3f} ms, so the graph adds "
                    f"{replay - busy:.3f} ms; sampling (auto) beside it"
                )
                print(f"  {'part':>16} {'ms':>7} {'floor ms':>9} {'x floor':>8}")
                for p in PARTS:
                    ms, floor = parts.get(p, 0.0), floors[p]
                    x = f"{ms / floor:.1f}" if floor else "-"
                    print(f"  {p:>16} {ms:7.3f} {floor:9.3f} {x:>8}")


if __name__ == "__main__":
    bench.run(main)
