"""Train-step MFU: model FLOPs utilisation of our DAPO gradient update on a random-init Qwen2.

Measured: ``PolicyUpdater.update(samples)``, one gradient update as training runs it (forward,
whole sequences under compiled layers, else each prompt once for its G samples; response
log-probs, the loss, backward, AdamW step; with a critic, its update too)
on P prompts x G samples of exactly L response tokens, random ids, advantages +/-1 so that every
sample carries loss. One eager update (counted) and two warm-up updates (they compile, under
``model.compile``), then the median of ``--steps`` timed ones.

FLOPs are counted once by ``torch.utils.flop_counter.FlopCounterMode`` around the eager
update (matmuls and attention, forward and backward; the optimizer and elementwise ops are not
counted). As a check, the analytic estimate is printed (H hidden, V vocabulary, n layers, N
non-embedding matmul weights):

    6 N T + 6 H V R + 12 n H sum(q_len * kv_len) + 2 n H sum(q_len * kv_len) + 2 H V R_ckpt

T: tokens fed to the decoder (each micro-batch's distinct prompt tokens, plus L - 1 per sample: the
last response token predicts nothing and is not fed); R = P G L positions projected onto the
vocabulary (only response positions are); the attention sum covers each sequence's full q x kv
rectangle, as torch's counter does (it ignores causal masking); the fourth term is the fused
attention backward recomputing the scores; R_ckpt: head rows recomputed in backward
(``dapo_core.logprobs`` checkpoints a micro-batch with more rows than one chunk). The causally
masked half of the rectangle and the recomputes are not model FLOPs in the strict (PaLM)
sense (counting them would flatter MFU; both figures are printed), so MFU is computed from model
FLOPs 6 N T + 6 H V R + half the attention sum: MFU = model FLOPs / median seconds / peak dense
bf16 FLOP/s. The counted figure is printed beside it.

    python -m bench.mfu    # CUDA: qwen2.5-0.5b, P=8 G=8 L=1024, bf16; CPU: tiny, P=4 G=4 L=32
    python -m bench.mfu --shape tiny -P 2 -G 8 -L 64 --steps 10 --peak-tflops 312

Attention is counted by this module's own formulas (``ATTENTION_FLOPS``), which broadcast grouped
key/value heads to the query heads as the kernels do: torch's counter asserted on grouped-query
shapes (14 query against 2 key/value heads) before torch 2.13, and it has no formula for the CPU
fused kernel.

The update's time split (forward, backward, optimizer) comes from separate updates with a device
synchronisation around each backward and optimizer step (so the median above is not perturbed);
the forward share is the rest (forward passes, packing, the loss).

This project's CI machines have no GPU: only the tiny CPU smoke run (tests/tasks/test_bench_mfu.py)
is exercised there; the CPU prints achieved FLOP/s only, as MFU needs a peak (--peak-tflops).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import types

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

import bench
import tasks.training.forward
from bench.common import positive_float, positive_int, sync
from dapo_core.ablation import apply_variant
from dapo_core.problem import Problem
from tasks.params import load_params
from tasks.runtime import configure_torch
from tasks.training.batches import sample_padding_fraction
from tasks.training.compiled import MODES, whole_sequences
from tasks.training.trainer import DAPOTrainer, Sample

aten = torch.ops.aten
TARGET_MFU = 0.45
STAGES = ("forward", "backward", "optimizer")
FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
FIELDS += ("num_key_value_heads", "vocab_size", "rope_theta", "max_position_embeddings")
SHAPES = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936, 1e6, 32768),  # its config.json, 494M params
    "tiny": (128, 256, 2, 4, 2, 384, 1e4, 32768),  # the embedded CPU model's shape
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, 1e5, 8192),  # its config.json (Llama), 135M
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 151936, 1e6, 32768),  # its config.json, 1.54B
}
LLAMA_SHAPES = ("smollm2-135m",)
# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s. NVIDIA's datasheets print the sparse
# figure, twice these: H100 SXM 1,979 (132 SMs x 1.83 GHz x 4096 FLOP/clock = 989.4 dense), H200
# SXM the same, H100 PCIe 1,513; A100 312 dense; L40S 362.05 dense; A10 125 dense (A10G is AWS's
# A10 variant, absent from the datasheets: pass --peak-tflops if you know its figure). The first
# listed substring found in the device name wins, so the PCIe H100 precedes the SXM one.
PEAK_TFLOPS = {"H100 PCIe": 756.5, "H100": 989.4, "H200": 989.4}
PEAK_TFLOPS |= {"A100": 312.0, "L40S": 362.05, "A10G": 125.0}


def model_config(shape: str) -> Qwen2Config | LlamaConfig:
    family = LlamaConfig if shape in LLAMA_SHAPES else Qwen2Config
    return family(**dict(zip(FIELDS, SHAPES[shape], strict=True)), tie_word_embeddings=True)


def build_model(shape: str, device: torch.device, seed: int = 0, dtype: torch.dtype | None = None):
    """Random weights, built on the device (no download), with SDPA attention; ``dtype``
    defaults to bf16 on CUDA, fp32 on CPU."""
    cuda = device.type == "cuda"
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(
            model_config(shape),
            dtype=dtype or (torch.bfloat16 if cuda else torch.float32),
            attn_implementation="sdpa",  # ATTENTION_FLOPS counts every fused kernel
        )


def sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Forward attention FLOPs, scores and weighted values, key/value heads broadcast to the
    query's (grouped-query attention): 2 b h_q s_q s_k (d_q + d_v)."""
    b, h_q, s_q, d_q = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * h_q * s_q * s_k * (d_q + d_v)


def sdpa_backward_flops(grad_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    """Backward: the scores recomputed (d_q), grad of the scores and of V (d_v each), grads of Q
    and K (d_q each): 2 b h_q s_q s_k (3 d_q + 2 d_v), key/value heads broadcast as forward."""
    b, h_q, s_q, d_q = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * h_q * s_q * s_k * (3 * d_q + 2 * d_v)


# Every fused attention kernel the update can dispatch to; their leading arguments are
# (query, key, value) forward and (grad_out, query, key, value) backward.
_FORWARD = ("efficient_attention", "flash_attention", "cudnn_attention", "flash_attention_for_cpu")
ATTENTION_FLOPS = {
    getattr(aten, f"_scaled_dot_product_{k}{suffix}"): formula
    for k in _FORWARD
    for suffix, formula in (("", sdpa_flops), ("_backward", sdpa_backward_flops))
    if hasattr(aten, f"_scaled_dot_product_{k}{suffix}")
}


def peak_tflops(device_name: str) -> float | None:
    name = device_name.upper()
    return next((v for key, v in PEAK_TFLOPS.items() if key.upper() in name), None)


def make_samples(P: int, G: int, L: int, prompt_len: int, vocab: int, seed: int) -> list[Sample]:
    """P distinct random prompts, each shared by G samples of exactly L random response tokens;
    advantages alternate +1/-1 so no sample is skipped as zero-loss."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(1, vocab, (n,), generator=gen).tolist()  # 0 is the pad id

    samples = []
    for _ in range(P):
        prompt = ids(prompt_len)
        for j in range(G):
            samples.append(Sample(prompt + ids(L), prompt_len, 1.0 - 2.0 * (j % 2), keep=True))
    return samples


def make_trainer(
    model, P: int, G: int, L: int, budget: int, compile_: str = "auto", variant: str = "dapo"
) -> DAPOTrainer:
    """One update per call over the whole batch, no filtering or shaping (which need rollouts)."""
    overrides = [f"rollout.group_size={G}", f"rollout.max_response_len={L}"]
    overrides += [f"algo.cache_len={L // 4}", f"train.micro_batch_tokens={budget}"]
    overrides += [f"train.{k}={P}" for k in ("prompt_batch", "gen_batch", "mini_batch")]
    overrides += [f"algo.{k}=false" for k in ("dynamic_sampling", "overlong_filtering")]
    overrides += ["algo.overlong_shaping=false", f"model.compile={compile_}"]
    if model.device.type == "cuda":
        overrides.append("model.dtype=bfloat16")  # bf16 autocast, as training runs
    cfg = apply_variant(load_params(overrides=overrides), variant)
    problems = [Problem("bench", "1+1", "2", "1+1", "bench")]  # never drawn: no rollouts here
    tokenizer = types.SimpleNamespace(pad_token_id=0)  # all that _update reads
    return DAPOTrainer(cfg, model, tokenizer, None, problems)


def one_update(trainer: DAPOTrainer, samples: list[Sample]):
    """The policy's update, then the critic's over the same samples when the algorithm has one
    (PPO), as a training step runs them."""
    out = trainer.updater.update(samples)
    if trainer.critic:
        trainer.updater.critic_update(samples)
    return out


def analytic_flops(
    config,
    prompt_len: int,
    L: int,
    prompt_passes: int,
    n_samples: int,
    recomputed_rows: int = 0,
    whole: bool = False,
) -> dict[str, float]:
    """The formula of the module docstring, term by term, plus their total. ``whole``: each
    sample ran as one sequence (its prompt once per sample, ``prompt_passes`` == samples), so
    its attention rectangle is (prompt + fed)^2."""
    H, V, n = config.hidden_size, config.vocab_size, config.num_hidden_layers
    kv = config.num_key_value_heads * H // config.num_attention_heads
    N = n * (2 * H * H + 2 * H * kv + 3 * H * config.intermediate_size)  # q, o; k, v; MLP
    fed = L if whole else L - 1  # whole sequences feed the last token too
    q_kv = prompt_passes * prompt_len**2 + n_samples * fed * (prompt_len + fed)  # sum q_len*kv_len
    if whole:
        q_kv = n_samples * (prompt_len + fed) ** 2
    terms = {
        "dense": 6 * N * (prompt_passes * prompt_len + n_samples * fed),
        "head": 6 * H * V * n_samples * L,
        "attention": 12 * n * H * q_kv,
        "attention_recompute": 2 * n * H * q_kv,
        "head_recompute": 2 * H * V * recomputed_rows,
    }
    return {**terms, "total": sum(terms.values())}


def measure(
    model,
    P: int,
    G: int,
    L: int,
    prompt_len: int,
    budget: int,
    steps: int,
    warmup: int = 2,
    profile: bool = False,
    trace: str | None = None,
    compile_: str = "auto",
    variant: str = "dapo",
) -> dict:
    """Counted and analytic FLOPs of one update, and the median seconds of ``steps`` updates."""
    device, config = model.device, model.config
    cuda = device.type == "cuda"
    samples = make_samples(P, G, L, prompt_len, config.vocab_size, seed=0)
    trainer = make_trainer(model, P, G, L, budget, compile_, variant)
    if trainer.critic:  # PPO: the critic's update is part of the step; it needs its targets
        samples = [
            dataclasses.replace(s, old_values=torch.zeros(L), returns=torch.full((L,), s.advantage))
            for s in samples
        ]
    # The analytic count follows the trainer's own packing: a group split across micro-batches
    # runs its prompt once per micro-batch; the chunk is the one _forward_logprobs uses.
    batches = trainer.updater.micro_batches(samples)
    chunk = max(256, tasks.training.forward.LOGITS_BUDGET // config.vocab_size)
    whole = whole_sequences(model)
    passes = sum(len({tuple(s.input_ids[: s.prompt_len]) for s in b}) for b in batches)
    passes = len(samples) if whole else passes
    recomputed = sum(len(b) * L for b in batches if len(b) * L > chunk)
    if cuda and tasks.training.forward.FUSED_HEAD:  # backward recomputes every row's logits...
        recomputed = len(samples) * L  # ...unless the forward kept them (known after it ran)
    counter = FlopCounterMode(display=False, custom_mapping=ATTENTION_FLOPS)
    # Counted eagerly (the compiled update does the same arithmetic; the counter is a dispatch
    # mode that compiled graphs would bypass); the compiled warm-ups compile.
    with torch.compiler.set_stance("force_eager"), counter:
        outs = [one_update(trainer, samples)]  # the first warm-up update, counted
    if trainer.updater.forward.logits_kept:  # the fused head kept its logits: no recompute
        recomputed = 0
    analytic = analytic_flops(config, prompt_len, L, passes, len(samples), recomputed, whole)
    sync(device)
    t0 = time.perf_counter()
    outs += [one_update(trainer, samples) for _ in range(warmup)]
    sync(device)
    warmup_s = time.perf_counter() - t0
    if cuda:  # the peak over timed updates (weights and AdamW state, allocated, count too)
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        outs.append(one_update(trainer, samples))
        sync(device)
        times.append(time.perf_counter() - t0)
    split = time_split(trainer, samples, steps)
    if profile or trace:
        print_profile(trainer, samples, trace=trace)
    median, flops = statistics.median(times), counter.get_total_flops()
    tokens = passes * prompt_len + len(samples) * (L if whole else L - 1)
    return {
        "flops": flops,
        "analytic": analytic,
        "median_s": median,
        "tflops": flops / median / 1e12,
        # Model FLOPs in the strict (PaLM) sense: no recompute, causal half of the attention.
        "model_tflops": (analytic["dense"] + analytic["head"] + analytic["attention"] / 2)
        / median
        / 1e12,
        "tokens_per_s": tokens / median,
        "loss_tokens_per_s": len(samples) * L / median,
        "micro_batches": len(batches),
        "padding_frac": sample_padding_fraction(batches),
        "split": split,
        "warmup_s": warmup_s,
        "applied": all(o.applied and o.tokens == len(samples) * L for o in outs),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        # cudaFree of cached blocks to satisfy an allocation: each synchronises the device
        "alloc_retries": torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if cuda else 0,
    }


def time_split(trainer: DAPOTrainer, samples: list[Sample], steps: int) -> dict[str, float]:
    """Median seconds of an update's backward passes, its optimizer step and the rest (forward
    passes, packing, the loss), from ``steps`` more updates with the device synchronised around
    each backward and optimizer call."""
    device, engine = trainer.device, trainer.engine
    spent: dict[str, float] = {}

    def timed(fn, key):
        def run(*args, **kwargs):
            sync(device)
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            sync(device)
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0
            return out

        return run

    backward, step = engine.backward, engine.step
    engine.backward, engine.step = timed(backward, "backward"), timed(step, "optimizer")
    rows: list[dict[str, float]] = []
    try:
        for _ in range(steps):
            spent.clear()
            sync(device)
            t0 = time.perf_counter()
            one_update(trainer, samples)
            sync(device)
            total = time.perf_counter() - t0
            rows.append({**spent, "forward": total - sum(spent.values()), "total": total})
    finally:
        engine.backward, engine.step = backward, step
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def print_profile(
    trainer: DAPOTrainer, samples: list[Sample], rows: int = 25, trace: str | None = None
) -> None:
    """The kernels of one update by device time (self time on CPU), from torch.profiler; with
    ``trace``, its timeline as a Chrome trace (chrome://tracing, Perfetto) at that path."""
    from torch.profiler import ProfilerActivity, profile

    cuda = trainer.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        one_update(trainer, samples)
        sync(trainer.device)
    if trace:
        prof.export_chrome_trace(trace)
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))


def _flop(x: float) -> str:
    return f"{x / 1e12:.4g} TFLOP" if x >= 1e12 else f"{x / 1e9:.4g} GFLOP"


def _parser(cuda: bool) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="qwen2.5-0.5b" if cuda else "tiny")
    ap.add_argument("--prompts", "-P", type=positive_int, default=8 if cuda else 4)
    ap.add_argument("--group-size", "-G", type=positive_int, default=8 if cuda else 4)
    ap.add_argument("--response-len", "-L", type=positive_int, default=1024 if cuda else 32)
    ap.add_argument("--prompt-len", type=positive_int, default=128 if cuda else 16)
    ap.add_argument("--micro-batch-tokens", type=positive_int, default=16384 if cuda else 4096)
    ap.add_argument("--steps", type=positive_int, default=5)
    ap.add_argument("--peak-tflops", type=positive_float, default=None, help="overrides the table")
    ap.add_argument(
        "--weights",
        choices=["bfloat16", "float32"],
        default=None,
        help="parameter dtype (default: bfloat16 on CUDA, float32 on CPU); CUDA computes in "
        "bf16 under autocast either way",
    )
    ap.add_argument(
        "--compile", choices=MODES, default="auto", help="model.compile (auto: as training)"
    )
    ap.add_argument(
        "--variant",
        default="dapo",
        help="an algorithm preset (dapo variants); with a critic (ppo) its update is timed too",
    )
    ap.add_argument(
        "--checkpointing", action="store_true", help="activation checkpointing (whole sequences)"
    )
    ap.add_argument(
        "--head",
        choices=["fused", "chunked"],
        default="fused",
        help="the output layer on CUDA: fused (dapo_core.logprobs.linear_logprobs) or the "
        "checkpointed module call per chunk (CPU always runs that)",
    )
    ap.add_argument(
        "--profile", action="store_true", help="print the top kernels of one update (profiler)"
    )
    ap.add_argument("--trace", help="write one profiled update's timeline (Chrome trace JSON) here")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch's host threads, as train.cpu_threads sets them in training (0: one per core)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    cuda = torch.cuda.is_available()
    a = _parser(cuda).parse_args(argv)
    configure_torch(a.threads)
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    model = build_model(a.shape, device, dtype=a.weights and getattr(torch, a.weights))
    if a.checkpointing:
        model.activation_checkpointing_enable()
    tasks.training.forward.FUSED_HEAD = a.head == "fused"
    P, G, L = a.prompts, a.group_size, a.response_len
    print(
        f"{a.shape} on {name}, torch {torch.__version__}, {model.dtype}, "
        f"compile {a.compile}, {a.variant}"
    )
    print(f"P={P} prompts x G={G} samples, prompt {a.prompt_len} + response {L} tokens, ", end="")
    r = measure(
        model,
        P,
        G,
        L,
        a.prompt_len,
        a.micro_batch_tokens,
        a.steps,
        profile=a.profile,
        trace=a.trace,
        compile_=a.compile,
        variant=a.variant,
    )
    _report(r, a, name)


def _report(r: dict, a: argparse.Namespace, name: str) -> None:
    """The measurement's lines, ending with the MFU against the device's peak and the target."""
    an = r["analytic"]
    print(
        f"{r['micro_batches']} micro-batch(es) of <= {a.micro_batch_tokens} tokens, "
        f"{r['padding_frac']:.1%} of fed tokens padding"
    )
    print(
        f"update: median {r['median_s']:.4f} s over {a.steps} steps "
        f"(after 1 eager counted + 2 warm-up updates: {r['warmup_s']:.1f} s)"
    )
    sp = r["split"]
    print(
        "  split (synchronised updates): "
        + ", ".join(f"{k} {sp[k]:.4f} s ({sp[k] / sp['total']:.0%})" for k in STAGES)
    )
    print(f"FLOPs per update: counted {_flop(r['flops'])}, analytic {_flop(an.pop('total'))}")
    print("  analytic terms: " + ", ".join(f"{k} {_flop(v)}" for k, v in an.items()))
    print(f"tokens/s: {r['tokens_per_s']:.0f} fed, {r['loss_tokens_per_s']:.0f} trained (loss)")
    if r["peak_mem_gib"] is not None:
        print(
            f"peak GPU memory: {r['peak_mem_gib']:.2f} GiB "
            f"({r['alloc_retries']} allocator retries, each a device sync)"
        )
    if not r["applied"]:
        print("WARNING: an update was skipped (non-finite) or trained fewer tokens than expected")
    print(f"achieved: {r['tflops']:.4g} TFLOP/s counted, {r['model_tflops']:.4g} model TFLOP/s")
    peak = a.peak_tflops or peak_tflops(name)
    if peak is None:
        print(f"peak unknown for {name!r}: MFU needs --peak-tflops; target MFU >= {TARGET_MFU:.0%}")
        return
    mfu = r["model_tflops"] / peak  # the strict figure: counted FLOPs (recomputes) flatter it
    verdict = "PASS" if mfu >= TARGET_MFU else "FAIL"
    print(f"MFU {mfu:.1%} of a {peak} TFLOP/s peak; target MFU >= {TARGET_MFU:.0%}: {verdict}")


if __name__ == "__main__":
    bench.run(main)
