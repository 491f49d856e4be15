"""bench.mfu on CPU: its samples, its peak table, its FLOP accounting (grouped-query attention
included) and one tiny measurement."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

import tasks.training.forward
from bench.mfu import (
    ATTENTION_FLOPS,
    analytic_flops,
    build_model,
    make_samples,
    measure,
    model_config,
    peak_tflops,
    sdpa_backward_flops,
    sdpa_flops,
)


def test_make_samples_groups_share_one_prompt_and_responses_have_length_L():
    P, G, L, prompt_len, vocab = 3, 4, 5, 7, 50
    samples = make_samples(P, G, L, prompt_len, vocab, seed=0)
    assert len(samples) == P * G
    prompts = [tuple(s.input_ids[: s.prompt_len]) for s in samples]
    for g in range(P):
        assert len(set(prompts[g * G : (g + 1) * G])) == 1
    assert len(set(prompts)) == P  # P distinct prompts
    assert all(s.prompt_len == prompt_len and len(s.input_ids) == prompt_len + L for s in samples)
    assert all(0 < t < vocab for s in samples for t in s.input_ids)  # never the pad id 0
    assert all(s.keep for s in samples)
    assert [s.advantage for s in samples[:G]] == [1.0, -1.0, 1.0, -1.0]  # all carry loss


def test_peak_tflops_table():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_tflops("NVIDIA H200") == 989.4
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("NVIDIA A10G") == 125.0
    assert peak_tflops("NVIDIA GeForce RTX 4090") is None


def test_qwen_shape_matches_the_published_model():
    config = model_config("qwen2.5-0.5b")
    with torch.device("meta"):  # shapes only, no memory
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == 494_032_768  # Qwen2.5-0.5B, tied
    # The analytic N (non-embedding matmul weights) is the decoder's Linear weights.
    linear = sum(
        m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)
    )
    assert analytic_flops(config, 0, 2, 0, 1)["dense"] == 6 * linear  # one fed token


@pytest.mark.parametrize(
    "budget, recompute",
    [
        (60, False),  # 2 samples per micro-batch: each prompt runs in 2 micro-batches
        (4096, True),  # one micro-batch of 288 rows > the 256-row chunk: head checkpointed
    ],
)
def test_measure_tiny_on_cpu_counts_the_analytic_flops_and_trains(monkeypatch, budget, recompute):
    if recompute:  # the smallest chunk (256 rows), as the CUDA default's 151k vocabulary gets
        monkeypatch.setattr(tasks.training.forward, "LOGITS_BUDGET", 1)
    torch.set_num_threads(1)
    model = build_model("tiny", torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    r = measure(model, P=3, G=4, L=24, prompt_len=6, budget=budget, steps=1)
    analytic = r["analytic"]
    assert (r["micro_batches"] > 1) == (not recompute)
    assert (analytic["head_recompute"] > 0) == recompute
    # Exact on CPU (matmuls and the fused attention); 1% leaves room for harmless changes.
    assert r["flops"] == pytest.approx(analytic["total"], rel=0.01)
    assert math.isfinite(r["tflops"]) and r["tflops"] > 0
    assert r["applied"]  # no update skipped, every response token trained
    assert r["padding_frac"] == 0.0  # every response has length L
    split = r["split"]
    assert all(split[k] > 0 for k in ("forward", "backward", "optimizer"))
    assert split["forward"] + split["backward"] + split["optimizer"] == pytest.approx(
        split["total"]
    )
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []


def test_attention_flops_broadcast_grouped_key_value_heads():
    """Qwen2.5-0.5B's 14 query heads against 2 key/value heads (torch's own counter asserted on
    these shapes before 2.13): counted as 14 heads of scores and weighted values."""
    b, s_q, s_k, d = 2, 5, 7, 64
    q, kv = (b, 14, s_q, d), (b, 2, s_k, d)
    assert sdpa_flops(q, kv, kv) == 2 * (2 * b * 14 * s_q * s_k * d)  # QK^T and PV
    assert sdpa_backward_flops(q, q, kv, kv) == 5 * (2 * b * 14 * s_q * s_k * d)  # 5 matmuls


@pytest.mark.parametrize("masked", [False, True])
def test_the_counter_sees_the_cpu_fused_kernel_with_grouped_heads(masked):
    q = torch.randn(2, 6, 5, 8, requires_grad=True)
    k, v = (torch.randn(2, 2, 7, 8, requires_grad=True) for _ in range(2))
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool) if masked else None
    counter = FlopCounterMode(display=False, custom_mapping=ATTENTION_FLOPS)
    with counter:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).sum().backward()
    rectangle = 2 * 6 * 5 * 7  # b h_q s_q s_k
    assert counter.get_total_flops() == 2 * rectangle * (8 + 8) + 2 * rectangle * (3 * 8 + 2 * 8)
