"""A reward model's score of a response, for the trainer that fits it (``reward_model.py``) and
for RL against it (``rollout.reward: model``). It sits with the models, below training and the
preference trainers both: the RL trainer reads a reward model without importing how one is
trained.

r(x, y) is a one-output sequence-classification head at the last token of the chat prompt
followed by the response (transformers' ``AutoModelForSequenceClassification``: the directory
loads in TRL or OpenRLHF as is). ``reward_input`` is the one way a (prompt, response) becomes the
model's input, in training and in RL alike: the head must read the same kind of last token in
both (scored from the sampler's ids, which end in EOS, the reward model trained on texts ranked
the policy's groups at chance).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dapo_core.errors import PipelineError
from tasks.models.loading import REWARD_MODEL_RECORD

RECORD = REWARD_MODEL_RECORD  # what the directory was trained from, and how well it ranks


def reward_input(tokenizer, prompt: str, response: str, max_len: int) -> list[int]:
    """The ids the reward model reads: the chat prompt followed by the response text (as
    decoded, without special tokens), cut to the last ``max_len`` tokens (the response's end,
    where the reward is read, is kept)."""
    from tasks.models.loading import chat_prompt

    text = chat_prompt(tokenizer, prompt) + response
    return tokenizer(text, add_special_tokens=False)["input_ids"][-max_len:]


def rewards(model, seqs: list[list[int]], pad: int) -> torch.Tensor:
    """(n,) r(x, y) of right-padded sequences: the head at each one's last token."""
    dev = next(model.parameters()).device
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=dev)
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=dev)
    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
    last = torch.tensor([len(s) - 1 for s in seqs], device=dev)
    return model.score(hidden[torch.arange(len(seqs), device=dev), last]).squeeze(-1).float()


def load_reward_model(path: str, device: str):
    """A model directory under a one-output head (a fresh one for a policy, the trained one
    for a reward model directory), and its tokenizer."""
    from transformers import AutoModelForSequenceClassification

    from tasks.models.loading import explained_load_errors, load_tokenizer, transformers_quietly

    hf = transformers_quietly()
    level = hf.logging.get_verbosity()
    hf.logging.set_verbosity_error()  # a policy's new head is expected: no "MISSING" report
    try:  # (a load that fails still raises)
        with explained_load_errors(path):
            tokenizer = load_tokenizer(path)
            model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, dtype=torch.float32
            ).to(device)
    finally:
        hf.logging.set_verbosity(level)
    model.config.pad_token_id = tokenizer.pad_token_id  # transformers reads the last non-pad
    return model, tokenizer


def reward_model_record(path: str | Path) -> dict:
    """The record a trained reward model directory carries; a one-line error otherwise."""
    path = Path(path).expanduser()
    p = path / RECORD
    if not path.exists():
        raise PipelineError(
            f"no such reward model directory: {path}; train one with `dapo reward-model train`"
        )
    if not p.exists():
        raise PipelineError(
            f"{path} is not a reward model directory (no {RECORD}); train one with "
            "`dapo reward-model train`"
        )
    return json.loads(p.read_text())


class LearnedReward:
    """``reward(problem prompt, response texts) -> scores``: a trained reward model scoring the
    policy's responses during RL (``rollout.reward: model``), read as in its training
    (``reward_input``). Its tokenizer must be the policy's: a reward model is a judge of the
    responses of the policy it was trained from."""

    def __init__(self, path: str, tokenizer, device, max_len: int):
        path = str(Path(path).expanduser())
        reward_model_record(path)  # a one-line error for a directory that is not one
        self.model, own = load_reward_model(path, str(device))
        if own.get_vocab() != tokenizer.get_vocab():
            raise PipelineError(
                f"rollout.reward_model {path}: its tokenizer is not the policy's, so it was "
                "trained on another model's responses; train it from this policy (`dapo "
                "reward-model train` with the same model.name_or_path)"
            )
        self.model.eval().requires_grad_(False)
        self.tokenizer, self.max_len = own, max_len

    @torch.no_grad()
    def __call__(self, prompt: str, responses: list[str]) -> list[float]:
        seqs = [reward_input(self.tokenizer, prompt, r, self.max_len) for r in responses]
        return rewards(self.model, seqs, self.tokenizer.pad_token_id).tolist()
