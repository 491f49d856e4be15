"""The embedded default model: a tiny Qwen2 built from a config, with its own tokenizer.

The tiny model is a Qwen2-architecture network with a byte-level BPE tokenizer trained on the
synthetic corpus, saved as an ordinary model directory: the trainer and evaluator load it with
``from_pretrained`` exactly as they load Qwen2.5-7B. The vocabulary is byte-level (space as ``Ġ``)
with Qwen2's pre-tokenization, because transformers rebuilds a ``Qwen2Tokenizer`` for any
``model_type: qwen2`` directory; a save/reload round trip is then identical (tests check it).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch

from dapo_core import answers, curation, deadline, equivalence, extraction, reward, synthetic
from dapo_core.config import Config, TinyModelConfig
from dapo_core.curation import apply_template
from dapo_core.problem import Problem
from dapo_core.synthetic import solution
from tasks.data import splits as data_splits
from tasks.data.splits import splits
from tasks.data.version import problems_digest
from tasks.determinism import MAKER_INDEPENDENT_MKL
from tasks.models import loading, shipped, warm_start
from tasks.models.build import code_digest, ensure_built, library_versions
from tasks.models.loading import save_model_dir, transformers_quietly
from tasks.params import repo_path
from tasks.runtime import kernel_tags

log = logging.getLogger(__name__)

# The eval settings a warm start's stopping rule samples with (tasks.models.warm_start).
STOP_RULE_EVAL_KEYS = (
    "n_samples",
    "temperature",
    "top_p",
    "max_response_len",
    "seed",
    "answer_format",
)

TINY = "tiny"
PAD, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen2's pre-tokenizer split pattern (digits one by one, words with their leading space).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(corpus: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``corpus``, with a ChatML chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    PreTrainedTokenizerFast = transformers_quietly().PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE
    )


def build_tiny_model(tiny: TinyModelConfig, train: list[Problem], out_dir: Path, seed: int) -> Path:
    """Build (untrained) the tiny Qwen2 and its tokenizer into ``out_dir``, atomically."""
    transformers = transformers_quietly()
    Qwen2Config, Qwen2ForCausalLM = transformers.Qwen2Config, transformers.Qwen2ForCausalLM

    # The tokenizer must see the chat roles, the DAPO template and the answers.
    # (plus the DAPO template, so curated problems tokenize sensibly too).
    corpus = [f"user\n{p.prompt}\nassistant\n{solution(p)}" for p in train]
    corpus.append(apply_template(""))
    tokenizer = build_tokenizer(corpus, tiny.vocab_size)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return save_model_dir(Qwen2ForCausalLM(config), tokenizer, out_dir)


def build_settings(cfg: Config) -> dict:
    """The settings that say which embedded model a config asks for (seed included; not where
    it goes, nor whether a shipped one may serve)."""
    raw = cfg.to_dict()
    tiny = {k: v for k, v in raw["tiny"].items() if k not in ("path", "shipped")}
    settings = {
        "tiny": tiny,
        "synthetic": raw["synthetic"],
        "source": cfg.data.source,
        "val_size": cfg.data.val_size,
    }
    if cfg.tiny.warm_start_target > 0:  # the stopping rule samples as evaluation does
        settings["eval"] = {k: raw["eval"][k] for k in STOP_RULE_EVAL_KEYS}
    return settings


def shipped_key(cfg: Config) -> dict:
    """What a shipped checkpoint must have been built for to serve ``cfg``: the same settings,
    and the same training split (a generator changed since would have it trained on problems
    that are now validation or test)."""
    return {**build_settings(cfg), "train_digest": problems_digest(splits(cfg).train)}


def build_spec(cfg: Config) -> dict:
    """Everything the embedded model's build depends on: a directory built from anything else
    is stale (another task, another split, other build code or libraries) and is rebuilt."""
    return {
        **build_settings(cfg),
        "code": code_digest(*BUILD_MODULES),
        "libraries": library_versions(),
        "kernels": _kernels_that_round(),
    }


def _kernels_that_round() -> dict[str, str]:
    """The kernel tags a build depends on: another kernel level rounds, and so builds,
    differently; the CPU's maker too, unless MKL's branch computes alike on every maker's CPU
    (``runtime.rounding`` ``COMPATIBLE``, the portable pins)."""
    tags = kernel_tags()
    if tags["runtime.rounding"] == MAKER_INDEPENDENT_MKL:
        tags.pop("runtime.cpu_vendor")
    return tags


def ensure_tiny_model(cfg: Config) -> Path:
    """The embedded model's directory, built (tokenizer, random init, supervised warm start) on
    first use, and again whenever what it was built from changed (``tasks.models.build``: one
    builder at a time, published whole).

    The tokenizer and the warm start see the training split only (``tasks.data.splits``): a
    validation or test problem learned here would inflate every later score on it."""
    if cfg.tiny.shipped:
        checkpoint = shipped.find(shipped_key(cfg))
        if checkpoint is not None:
            return checkpoint
    return build_tiny(cfg)


def build_tiny(cfg: Config) -> Path:
    """The embedded model built into ``tiny.path`` (or reused from an earlier build of the same
    spec there), whether or not a checkpoint ships for it."""
    t = cfg.tiny

    def build(into: Path) -> dict:
        data = splits(cfg)
        build_tiny_model(t, data.train, into, t.seed)
        stop = None
        if t.warm_start_target > 0 and t.warm_start_steps > 0:  # 0 steps: nothing to check
            score = warm_start.validation_score(cfg, data.val)
            every, window = t.warm_start_eval_every, t.warm_start_window
            stop = warm_start.StopRule(t.warm_start_target, every, score, window)
        steps, lr, batch = t.warm_start_steps, t.warm_start_lr, t.warm_start_batch
        result = warm_start.warm_start(into, data.train, steps, lr, batch, t.seed, stop)
        if stop and not result.landed(stop):
            log.warning(
                "embedded model: the warm start ended at validation avg@k %.3f after %d steps, "
                "outside tiny.warm_start_target %.3f (window %.3f); raise "
                "tiny.warm_start_steps to reach it",
                result.checks[-1][1],
                result.steps,
                stop.target,
                stop.window,
            )
        return {"warm_start": result.record()}

    return ensure_built(repo_path(t.path), build_spec(cfg), build, "embedded model")


# The code a build runs: a change to any of these changes what is built (code_digest). The
# reward and its answer parser are in it: the warm start stops by a validation score they compute.
BUILD_MODULES = (sys.modules[__name__], warm_start, loading, synthetic, curation, data_splits)
BUILD_MODULES += (reward, extraction, equivalence, deadline, answers)
