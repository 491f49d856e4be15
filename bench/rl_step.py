"""RL step time: our DAPO loop against TRL's GRPOTrainer, measured side by side in one session.

Equal work on both sides:
- the same Hugging Face model directory (the embedded tiny Qwen2, random init, so it rarely emits
  EOS) and the same synthetic prompts;
- P prompts x G samples x exactly L completion tokens (``min_new_tokens = L`` on both sides);
- the same reward: a deterministic pseudo-random +/-1 per completion, so every group is mixed and
  every sample goes through forward and backward on both sides (our loop skips zero-advantage
  samples, which would otherwise be unequal work);
- one gradient update per rollout, no reference model (TRL beta=0), so neither side needs an
  old-log-prob or reference forward pass; token-level loss (TRL loss_type="dapo");
- the same torch thread count.

Runs are interleaved (ours, TRL, ours, TRL, ...), each run's first step dropped as warm-up, and
medians of the remaining step times and their ratio are printed. TRL is a benchmark-only extra:
``pip install -e '.[bench]'``.

    python -m bench.rl_step --shapes 16x8x16 8x8x64 --rounds 3 --steps 4
    python -m bench.rl_step --model qwen2.5-0.5b --shapes 8x8x512 --rounds 1 --steps 3   # CUDA

On CUDA both sides compute in bf16 (ours as training runs by default, TRL with ``bf16=True``)
and the target is 0.25 (0.5 on CPU).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

import bench
from bench import common
from dapo_core import metric_names as metric
from tasks.models.loading import load_policy
from tasks.params import load_params
from tasks.rollout.factory import make_generator
from tasks.rollout.graphs import DECODE_STEPS
from tasks.training.trainer import DAPOTrainer


def coin(text: str) -> bool:
    """Deterministic pseudo-random correctness: mixed groups without depending on the model."""
    return hashlib.blake2b(text.encode(), digest_size=1).digest()[0] % 2 == 0


def our_steps(
    model_dir: Path,
    problems,
    P: int,
    G: int,
    L: int,
    steps: int,
    split: list | None = None,
    extra: tuple[str, ...] = (),
) -> list[float]:
    """Seconds of each of ``steps`` training steps; ``split`` collects each step's (generation,
    loss inputs and update) seconds as the trainer logs them."""
    cuda = torch.cuda.is_available()
    cfg = load_params(
        overrides=[
            f"rollout.group_size={G}",
            f"rollout.max_response_len={L}",
            f"algo.cache_len={L // 4}",
            "algo.dynamic_sampling=false",  # TRL has none: one generation batch per step
            "algo.overlong_filtering=false",  # every sample is L tokens long (truncated)
            "algo.overlong_shaping=false",
            "train.max_stalled_steps=0",  # the coin reward parses no answer: no stall stop
            f"train.prompt_batch={P}",
            f"train.gen_batch={P}",
            f"train.mini_batch={P}",  # one update per rollout
            "train.micro_batch_tokens=1000000",  # one micro-batch, like TRL's single forward
            "rollout.max_prompt_len=256",
            # CUDA: the training default (bf16 weights, float32 master copies); CPU: fp32 as TRL
            f"model.dtype={'auto' if cuda else 'float32'}",
            *extra,
        ]
    )
    device = "cuda" if cuda else "cpu"
    model, tok = load_policy(str(model_dir), cfg.model.dtype, device)
    generator = make_generator(cfg, model, tok, str(model_dir))  # as training builds it
    generator.min_new_tokens = L
    trainer = DAPOTrainer(
        cfg, model, tok, generator, problems, reward_fn=lambda response, answer: coin(response)
    )
    # The coin reward parses no answer: each step would be warned about as one without signal.
    logging.getLogger("tasks.training.step_metrics").setLevel(logging.ERROR)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        result = trainer.train_step()
        common.sync(model.device)
        times.append(time.perf_counter() - t)
        if split is not None:
            split.append((result.metrics[metric.GEN_TIME], result.metrics[metric.TRAIN_TIME]))
    return times


def ours_split(model_dir: Path, problems, shapes, steps: int, decode_step: str = "default") -> None:
    """Our step alone, split into generation and training (loss inputs and update), medians of
    the steps after the first (``decode_step``: ``rollout.decode_step``)."""
    print(
        f"{'shape PxGxL':>12} {'step s':>8} {'generation s':>13} {'training s':>11} "
        f"{'gen/train':>10}"
    )
    for P, G, L in shapes:
        split: list[tuple[float, float]] = []
        # micro-batches as training runs them (not one, which matches TRL's single forward)
        extra = ("train.micro_batch_tokens=32768", f"rollout.decode_step={decode_step}")
        total = our_steps(model_dir, problems, P, G, L, steps, split, extra)[1:]
        gen = statistics.median(g for g, _ in split[1:])
        train = statistics.median(t for _, t in split[1:])
        print(
            f"{common.label(P, G, L):>12} {statistics.median(total):8.3f} {gen:13.3f} "
            f"{train:11.3f} {gen / train:10.2f}"
        )


def trl_steps(model_dir: Path, problems, P: int, G: int, L: int, steps: int) -> list[float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    _, tok = load_policy(str(model_dir), "float32")
    dataset = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": p.prompt}] for p in problems[: P * steps]]}
    )

    def reward(completions, **kwargs):
        return [1.0 if coin(c[0]["content"]) else -1.0 for c in completions]

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.t = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t)

    with tempfile.TemporaryDirectory() as d:
        args = GRPOConfig(
            output_dir=d,
            per_device_train_batch_size=P * G,
            num_generations=G,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            beta=0.0,
            loss_type="dapo",
            max_completion_length=L,
            generation_kwargs={"min_new_tokens": L},
            temperature=1.0,
            top_p=1.0,
            max_steps=steps,
            learning_rate=5e-4,
            logging_steps=10**6,
            save_strategy="no",
            report_to="none",
            use_cpu=not torch.cuda.is_available(),
            bf16=torch.cuda.is_available(),
            shuffle_dataset=False,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        timer = Timer()
        trainer = GRPOTrainer(
            model=str(model_dir),
            reward_funcs=[reward],
            args=args,
            train_dataset=dataset,
            processing_class=tok,
            callbacks=[timer],
        )
        trainer.train()
    return timer.times


def model_directory(name: str, root: Path) -> Path:
    """A saved model both sides load: the embedded tiny model, or a ``bench.mfu`` shape with
    random weights and the tiny tokenizer (saved in bf16)."""
    tiny = common.random_tiny_model(root / "tiny")
    if name == "tiny":
        return tiny
    from bench.mfu import build_model

    _, tok = load_policy(str(tiny))
    model = build_model(name, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out = root / name
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def trl_version() -> str:
    from importlib.metadata import version

    return version("trl")


def main(argv: list[str] | None = None) -> None:
    ap = common.parser(__doc__)
    ap.add_argument(
        "--rounds", type=common.positive_int, default=3, help="interleaved rounds per shape"
    )
    ap.add_argument(
        "--steps", type=common.positive_int, default=4, help="steps per run (the first is dropped)"
    )
    ap.add_argument(
        "--model",
        choices=["tiny", "qwen2.5-0.5b"],
        default="tiny",
        help="qwen2.5-0.5b: its shape, random weights (CUDA)",
    )
    ap.add_argument(
        "--ours-only",
        action="store_true",
        help="no TRL: our step split into generation and training",
    )
    ap.add_argument(
        "--decode-step",
        choices=list(DECODE_STEPS),
        default="default",
        help="with --ours-only: rollout.decode_step (CUDA)",
    )
    args = common.parse(ap, argv)
    if args.ours_only:
        with tempfile.TemporaryDirectory() as d:
            model_dir = model_directory(args.model, Path(d))
            ours_split(model_dir, common.problems(), args.shapes, args.steps, args.decode_step)
        return
    if importlib.util.find_spec("trl") is None:
        ap.exit(2, "bench.rl_step needs TRL, a benchmark-only extra: pip install -e '.[bench]'\n")
    train = common.problems()
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else "cpu"
    target = 0.25 if cuda else 0.5
    print(
        f"RL step against TRL {trl_version()}: {args.model} on {device}, torch "
        f"{torch.__version__}, {args.threads} thread(s), {args.rounds} interleaved rounds of "
        f"{args.steps} steps (first dropped)"
    )
    print(
        f"{'shape PxGxL':>12} {'ours s/step':>12} {'TRL s/step':>11} {'ours/TRL':>9}  "
        f"target <= {target}"
    )
    with tempfile.TemporaryDirectory() as d:
        model_dir = model_directory(args.model, Path(d))
        for P, G, L in args.shapes:
            ours, trl = [], []
            for _ in range(args.rounds):
                ours += our_steps(model_dir, train, P, G, L, args.steps)[1:]
                trl += trl_steps(model_dir, train, P, G, L, args.steps)[1:]
            o, t = statistics.median(ours), statistics.median(trl)
            verdict = "PASS" if o / t <= target else "FAIL"
            print(f"{common.label(P, G, L):>12} {o:12.3f} {t:11.3f} {o / t:9.2f}  {verdict}")


if __name__ == "__main__":
    bench.run(main)
