"""The RL step's floors: the least time generation and the update can take, by arithmetic.

No model runs: a model shape (``bench.mfu.SHAPES``), P prompts x G samples x L response tokens
after a prompt of ``--prompt`` tokens, and a device's figures.

- Generation is bound by memory: each of the L - 1 decode steps after the prefill reads every
  weight once (the layers and the output layer; the embedding only its B rows), the key/value
  window of every sequence (2 x layers x kv heads x head dim values a position) and the (B, V)
  logits twice (written by the output layer, read by the sampler), B = P x G. The floor is those
  bytes over ``--bandwidth`` (default: the H100 SXM datasheet's 3.35 TB/s; a large copy reaches
  about 2.96 TB/s there). The prefill, compute-bound and a few milliseconds, is left out.
- The update is bound by arithmetic: ``bench.mfu``'s model FLOPs (6 N T + 6 H V R + the causal half
  of attention) over ``--peak-tflops`` (H100 SXM dense bf16), and over that peak times ``--mfu``
  (what ``bench.mfu`` measured: the update as it runs).

    python -m bench.floors --shapes 8x8x512 8x8x2048 1x16x8192
    python -m bench.floors --shapes 64x8x512 --bandwidth 4.8 --mfu 0.45   # H200's memory

If the generation floor exceeds the update's time, no decode kernel makes generation cheaper than
the update at that shape on one GPU: only overlapping them (rollouts in their own process, or
another GPU) or more sequences a step (a larger decode batch reads the weights for more tokens).
"""

from __future__ import annotations

import argparse

import bench
from bench import common
from bench.mfu import SHAPES, analytic_flops, model_config


def generation_bytes(config, rows: int, prompt: int, L: int, size: int = 2) -> dict[str, float]:
    """Bytes the L - 1 decode steps of ``rows`` sequences must move, by part (module docstring)."""
    H, V, n = config.hidden_size, config.vocab_size, config.num_hidden_layers
    head_dim = H // config.num_attention_heads
    kv_heads = config.num_key_value_heads
    layer = 2 * H * H + 2 * H * kv_heads * head_dim + 3 * H * config.intermediate_size  # matrices
    layer += 2 * H  # two norms' weights
    if getattr(config, "attention_bias", True) and config.model_type == "qwen2":
        layer += H + 2 * kv_heads * head_dim  # Qwen2's q, k, v biases
    steps = L - 1
    # step t (1 .. L - 1) attends over prompt + t positions
    positions = steps * prompt + steps * (steps + 1) // 2
    return {
        "weights": steps * (n * layer + H + V * H) * size,  # layers, final norm, output layer
        "key/value": rows * positions * 2 * n * kv_heads * head_dim * size,
        "logits": steps * 2 * rows * V * size,
    }


def update_flops(config, P: int, G: int, prompt: int, L: int) -> float:
    """The update's model FLOPs (``bench.mfu``): dense, output layer, the causal half of
    attention; each prompt fed once for its G samples."""
    terms = analytic_flops(config, prompt, L, prompt_passes=P, n_samples=P * G)
    return terms["dense"] + terms["head"] + terms["attention"] / 2


def floors(shape: str, P: int, G: int, L: int, prompt: int, bandwidth: float, peak: float, mfu):
    """Seconds: the generation floor by part and in all, the update at peak and at ``mfu``."""
    config = model_config(shape)
    parts = generation_bytes(config, P * G, prompt, L)
    out = {k: v / bandwidth for k, v in parts.items()}
    out["generation"] = sum(out.values())
    flops = update_flops(config, P, G, prompt, L)
    out["update at peak"] = flops / peak
    out["update at MFU"] = flops / (peak * mfu)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument(
        "--shapes", nargs="+", type=common.shape, default=[(8, 8, 512), (8, 8, 2048), (1, 16, 8192)]
    )
    ap.add_argument("--prompt", type=common.positive_int, default=128, help="prompt tokens")
    number = common.positive_float
    ap.add_argument("--bandwidth", type=number, default=3.35, help="memory TB/s (H100 SXM)")
    ap.add_argument("--peak-tflops", type=number, default=989.4, help="dense bf16 (H100 SXM)")
    ap.add_argument("--mfu", type=number, default=0.405, help="the update's measured MFU")
    a = ap.parse_args(argv)
    print(
        f"floors: {a.model}, prompt {a.prompt}, bf16; memory {a.bandwidth} TB/s, "
        f"{a.peak_tflops} TFLOP/s dense, update at {a.mfu:.1%} MFU (seconds)"
    )
    head = ("P x G x L", "weights", "key/value", "logits", "generation", "update", "at MFU")
    print(" ".join(f"{h:>11}" for h in head) + "  generation / update at MFU")
    for P, G, L in a.shapes:
        f = floors(a.model, P, G, L, a.prompt, a.bandwidth * 1e12, a.peak_tflops * 1e12, a.mfu)
        cells = [f[k] for k in ("weights", "key/value", "logits", "generation")]
        cells += [f["update at peak"], f["update at MFU"]]
        ratio = f["generation"] / f["update at MFU"]
        print(
            f"{common.label(P, G, L):>11} "
            + " ".join(f"{c:11.3f}" for c in cells)
            + f"  {ratio:.2f}"
        )


if __name__ == "__main__":
    bench.run(main)
