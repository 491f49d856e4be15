"""Generation throughput of the HF rollout backend against transformers ``generate``, in one run.

All sides sample P prompts x G completions of exactly L new tokens (EOS suppressed before L) from
the same model, with temperature 1 and top-p 1 (``--top-p`` for another):
- ours: ``tasks.rollout.generators.HFGenerator``. Each prompt is prefilled once, its KV cache is
  shared by its G samples, keys and values are written in place, and the lean decode step is used
  (``tasks.rollout.decode``);
- generate: ``model.generate(num_return_sequences=G, do_sample=True, min_new_tokens=L)``, which
  prefills each prompt G times and runs the generic forward every step, with its dynamic cache;
- static: the same with ``cache_implementation="static"``; on CUDA transformers compiles the
  decode step and replays it as a CUDA graph (the first call, dropped as warm-up, compiles).

Runs are interleaved, the first of each side is dropped as warm-up, and the medians of generated
tokens per second and of milliseconds per generated position (the call's time / L, prefill
included) are printed, with each baseline's time over ours.

On CUDA ours decodes with CUDA graphs (``tasks.rollout.graphs``); the ``eager`` side is the same
sampler with ``graphs=False`` (the lean step launched kernel by kernel), the ``lean`` side the
graphs over the step as it was before fused kernels (``LEAN_OPTIONS``, the ``exact`` sampler), the
``stepwise`` side ours with the sampler run step by step beside the graphs (``flat``) instead of
recorded in them (``blocked``), the ``sorted`` side ours with the ``exact`` sampler recorded in
them (at ``--top-p`` below 1: the nucleus by a sort over the vocabulary, where ours finds its
floor by bisection); ``static-shapes``, ``flex``, ``flex-static`` and ``flex-static-autotune``
are ours with that step (``bench.decode``'s variants).

Models (``--model``): ``tiny``, the embedded Qwen2 with random weights (fp32); ``qwen2.5-0.5b``,
Qwen2.5-0.5B's shape with random weights and its 151,936-token vocabulary, and
``smollm2-135m``, SmolLM2-135M's Llama shape (bf16 on CUDA; the tiny tokenizer writes the
prompts, whose ids the large vocabularies contain).

    python -m bench.generation --shapes 16x8x16 8x8x64 --repeats 5
    python -m bench.generation --model qwen2.5-0.5b --shapes 8x8x512 64x8x512   # CUDA: B=64, 512
    python -m bench.generation --model smollm2-135m --shapes 200x8x96 --sides eager  # evaluation
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from pathlib import Path

import torch

import bench
from bench import common
from bench.mfu import SHAPES, build_model
from tasks.models.loading import chat_prompt, load_policy
from tasks.rollout.generators import HFGenerator
from tasks.rollout.graphs import DECODE_STEPS, LEAN_OPTIONS

STEPS = tuple(k for k in DECODE_STEPS if k != "default")  # ours with another rollout.decode_step
SIDES = ("ours", "sorted", *STEPS, "stepwise", "lean", "eager", "generate", "static")
GRAPH_SIDES = ("sorted", *STEPS, "stepwise", "lean", "eager")  # differ from ours only on CUDA


def sampler(model, tok, L: int, graphs: bool | None = None, **kwargs) -> HFGenerator:
    """Our sampler, forced to L tokens per sample (``graphs`` and ``kwargs``: ``HFGenerator``)."""
    return HFGenerator(model, tok, max_prompt_len=256, min_new_tokens=L, graphs=graphs, **kwargs)


def ours(
    model,
    tok,
    prompts: list[str],
    G: int,
    L: int,
    gen: HFGenerator | None = None,
    top_p: float = 1.0,
) -> float:
    """Seconds to sample len(prompts) x G completions of exactly L tokens with our sampler
    (``gen``, kept across calls, or a new one)."""
    gen = gen or sampler(model, tok, L)
    common.sync(model.device)
    t = time.perf_counter()
    out = gen.generate(prompts, G, temperature=1.0, top_p=top_p, max_new_tokens=L)
    common.sync(model.device)
    elapsed = time.perf_counter() - t
    # Equal work: L decode positions per sample (a sample can still come back shorter: trailing
    # pad tokens that a random model happens to draw are stripped from a truncated response).
    assert max(len(r) for r in out.response_ids) == L
    return elapsed


@torch.no_grad()
def baseline(
    model, tok, prompts: list[str], G: int, L: int, cache: str | None = None, top_p: float = 1.0
) -> float:
    """Seconds for transformers ``generate`` to do the same (``cache``: cache_implementation)."""
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    batch = batch.to(model.device)
    common.sync(model.device)
    t = time.perf_counter()
    out = model.generate(
        **batch,
        do_sample=True,
        num_return_sequences=G,
        max_new_tokens=L,
        min_new_tokens=L,
        temperature=1.0,
        top_p=top_p,
        top_k=0,
        pad_token_id=tok.pad_token_id,
        cache_implementation=cache,
    )
    common.sync(model.device)
    elapsed = time.perf_counter() - t
    assert out.shape[1] - batch["input_ids"].shape[1] == L
    return elapsed


def bench_shape(
    model, tok, problems, P: int, G: int, L: int, repeats: int, sides=SIDES, top_p: float = 1.0
) -> dict[str, float]:
    """Median seconds of each side (interleaved, first run dropped), and derived figures."""
    prompts = [chat_prompt(tok, p.prompt) for p in problems[:P]]
    # One generator per side for the whole shape, as training keeps one: CUDA graphs are
    # captured in the dropped first run and replayed after.
    gens = {
        "ours": sampler(model, tok, L),
        "sorted": sampler(model, tok, L, sampler="exact"),
        "stepwise": sampler(model, tok, L, sampler="flat", draw_in_graphs=False),
        "lean": sampler(
            model, tok, L, decode_options=LEAN_OPTIONS, sampler="exact", draw_in_graphs=False
        ),
        "eager": sampler(model, tok, L, graphs=False),
        **{k: sampler(model, tok, L, decode_options=DECODE_STEPS[k]) for k in STEPS},
    }
    runs = {
        k: functools.partial(ours, model, tok, prompts, G, L, g, top_p) for k, g in gens.items()
    }
    runs["generate"] = lambda: baseline(model, tok, prompts, G, L, top_p=top_p)
    runs["static"] = lambda: baseline(model, tok, prompts, G, L, cache="static", top_p=top_p)
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(repeats + 1):
        for k in sides:
            times[k].append(runs[k]())
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    out = {f"{k}_tps": P * G * L / med[k] for k in sides}
    out |= {f"{k}_ms": 1000 * med[k] / L for k in sides}
    out |= {f"{k}_s": med[k] for k in sides}
    out |= {f"{k}_first_s": times[k][0] for k in sides}
    out |= {f"{k}_over_ours": med[k] / med["ours"] for k in sides}
    return out


def profile_call(model, tok, problems, P: int, G: int, L: int, top_p: float, path: str) -> None:
    """One call of our sampler (after a warm-up call) under torch.profiler, as a Chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    prompts = [chat_prompt(tok, p.prompt) for p in problems[:P]]
    gen = sampler(model, tok, L)
    ours(model, tok, prompts, G, L, gen, top_p)
    activities = [ProfilerActivity.CPU]
    if model.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        ours(model, tok, prompts, G, L, gen, top_p)
    prof.export_chrome_trace(path)
    print(f"trace of one call at {common.label(P, G, L)}: {path}")


def load_model(name: str, tokenizer_dir: Path):
    """(model, tokenizer) on CUDA when there is one: the embedded tiny model, or a random model of
    a ``bench.mfu`` shape with the tiny tokenizer."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tok = load_policy(str(common.random_tiny_model(tokenizer_dir)))
    if name != "tiny":
        model = build_model(name, device)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
    return model.to(device).eval(), tok


def main(argv: list[str] | None = None) -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--repeats", type=common.positive_int, default=5)
    ap.add_argument(
        "--model", choices=["tiny", *(k for k in SHAPES if k != "tiny")], default="tiny"
    )
    ap.add_argument(
        "--top-p", type=common.top_p, default=1.0, help="nucleus sampling (evaluation uses 0.7)"
    )
    ap.add_argument(
        "--sides",
        nargs="*",
        choices=SIDES[1:],
        default=None,
        help="baselines besides ours (default: all; eager only on CUDA, where ours uses graphs)",
    )
    ap.add_argument(
        "--trace",
        default=None,
        help="after the table, profile one call of ours at the last shape into this Chrome "
        "trace (read it with python -m bench.gaps)",
    )
    args = common.parse(ap, argv)
    train = common.problems()
    with tempfile.TemporaryDirectory() as d:
        model, tok = load_model(args.model, Path(d) / "m")
        cuda = model.device.type == "cuda"
        device = torch.cuda.get_device_name() if cuda else "cpu"
        others = args.sides
        if others is None:
            others = [k for k in SIDES[1:] if cuda or k not in GRAPH_SIDES]
        sides = ("ours", *others)
        print(
            f"generation: {args.model} ({model.dtype}) on {device}, torch {torch.__version__}, "
            f"{args.threads} thread(s), top-p {args.top_p}, medians of {args.repeats} "
            "interleaved runs"
        )
        head = ("shape PxGxL", "ours tok/s", "ours s", "first s", "ms/pos: ours", *others)
        widths = (12, 11, 8, 8, 13, *(14,) * len(others))
        print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
        for P, G, L in args.shapes:
            r = bench_shape(model, tok, train, P, G, L, args.repeats, sides, args.top_p)
            base = [f"{r[f'{k}_ms']:.2f} ({r[f'{k}_over_ours']:.2f}x)" for k in others]
            print(
                f"{common.label(P, G, L):>12} {r['ours_tps']:11.0f} {r['ours_s']:8.3f} "
                f"{r['ours_first_s']:8.3f} {r['ours_ms']:13.2f} "
                + " ".join(f"{b:>14}" for b in base)
            )
        if args.trace:
            profile_call(model, tok, train, *args.shapes[-1], args.top_p, args.trace)
    print("(ours s: one call's median seconds, first s: the first call's, CUDA graphs captured;")
    print(" x: that side's time over ours; above 1, ours is faster)")


if __name__ == "__main__":
    bench.run(main)
