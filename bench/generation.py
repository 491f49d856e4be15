"""Generation throughput of the HF rollout backend against transformers ``generate``, in one run.

Both sides sample P prompts x G completions of exactly L new tokens (EOS suppressed before L) from
the same model (the embedded tiny Qwen2 with random weights), with temperature 1 and no top-p:
- ours: ``tasks.rollout.generators.HFGenerator``. Each prompt is prefilled once, its KV cache is
  shared by its G samples, keys and values are written in place, and the lean decode step is used
  (``tasks.rollout.decode``);
- baseline: ``model.generate(num_return_sequences=G, do_sample=True, min_new_tokens=L)``,
  which prefills each prompt G times and runs the generic forward every step.

Runs are interleaved (ours, baseline, ...), the first of each is dropped as warm-up, and the
medians of generated tokens per second are printed with their ratio.

    python -m bench.generation --shapes 16x8x16 8x8x64 --repeats 5
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench import common
from tasks.models.loading import chat_prompt, load_policy
from tasks.rollout.generators import HFGenerator


def ours(model, tok, prompts: list[str], G: int, L: int) -> float:
    gen = HFGenerator(model, tok, max_prompt_len=256, min_new_tokens=L)
    t = time.perf_counter()
    out = gen.generate(prompts, G, temperature=1.0, top_p=1.0, max_new_tokens=L)
    elapsed = time.perf_counter() - t
    # Equal work: L decode positions per sample (a sample can still come back shorter: trailing
    # pad tokens that a random model happens to draw are stripped from a truncated response).
    assert max(len(r) for r in out.response_ids) == L
    return len(prompts) * G * L / elapsed


@torch.no_grad()
def baseline(model, tok, prompts: list[str], G: int, L: int) -> float:
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    t = time.perf_counter()
    out = model.generate(
        **batch,
        do_sample=True,
        num_return_sequences=G,
        max_new_tokens=L,
        min_new_tokens=L,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=tok.pad_token_id,
    )
    elapsed = time.perf_counter() - t
    assert out.shape[1] - batch["input_ids"].shape[1] == L
    return len(prompts) * G * L / elapsed


def bench_shape(model, tok, problems, P: int, G: int, L: int, repeats: int) -> dict[str, float]:
    prompts = [chat_prompt(tok, p.prompt) for p in problems[:P]]
    a, b = [], []
    for _ in range(repeats + 1):
        a.append(ours(model, tok, prompts, G, L))
        b.append(baseline(model, tok, prompts, G, L))
    ours_tps, base_tps = statistics.median(a[1:]), statistics.median(b[1:])
    return {"ours_tps": ours_tps, "base_tps": base_tps, "speedup": ours_tps / base_tps}


def main(argv: list[str] | None = None) -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--repeats", type=common.positive_int, default=5)
    args = common.parse(ap, argv)
    train = common.problems()
    print(
        f"generation: torch {torch.__version__}, {args.threads} thread(s), medians of "
        f"{args.repeats} interleaved runs"
    )
    print(f"{'shape PxGxL':>12} {'ours tok/s':>11} {'generate tok/s':>15} {'speed-up':>9}")
    with tempfile.TemporaryDirectory() as d:
        model, tok = load_policy(str(common.random_tiny_model(Path(d) / "m")))
        model.eval()
        for P, G, L in args.shapes:
            r = bench_shape(model, tok, train, P, G, L, args.repeats)
            print(
                f"{common.label(P, G, L):>12} {r['ours_tps']:11.0f} {r['base_tps']:15.0f} "
                f"{r['speedup']:8.2f}x"
            )


if __name__ == "__main__":
    main()
