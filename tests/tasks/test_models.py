"""The embedded model directory: tokenizer round trip, loading errors, rollout invariants."""

import pytest
import torch

from tasks.models import ModelNotFound, chat_prompt, load_policy, resolve_model_path
from tasks.rollout import HFGenerator, split_response


def test_tokenizer_round_trip_through_from_pretrained(tiny_cfg, tmp_path):
    from transformers import AutoTokenizer

    path = resolve_model_path(tiny_cfg)
    tok = AutoTokenizer.from_pretrained(path)
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "Compute 12 + 7.\nAnswer:  19 with  two spaces\tand a tab"
    assert tok(text)["input_ids"] == again(text)["input_ids"]
    assert again.decode(again(text)["input_ids"]) == text  # spaces survive (byte-level vocab)
    assert chat_prompt(tok, "hi") == chat_prompt(again, "hi")
    assert chat_prompt(tok, "hi").endswith("assistant\n")


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFound, match="no config.json"):
        load_policy(str(tmp_path / "nope"))


def test_split_response():
    assert split_response([5, 6, 2, 0, 0], {2}, 0) == ([5, 6, 2], True)
    assert split_response([5, 6, 7], {2}, 0) == ([5, 6, 7], False)


def test_generator_shapes_and_truncation(tiny_cfg):
    model, tok = load_policy(resolve_model_path(tiny_cfg))
    gen = HFGenerator(model, tok, max_prompt_len=8)
    torch.manual_seed(0)
    prompts = [chat_prompt(tok, "Compute 1 + 2."), chat_prompt(tok, "Compute 3 + 4.")]
    out = gen.generate(prompts, n=3, temperature=1.0, top_p=1.0, max_new_tokens=5)
    assert len(out.response_ids) == 6 and len(out.texts) == 6
    assert out.prompts_truncated == 2 and all(len(p) == 8 for p in out.prompt_ids)
    for ids, fin in zip(out.response_ids, out.finished, strict=True):
        assert 1 <= len(ids) <= 5
        assert fin == (ids[-1] == tok.eos_token_id)


def test_sampling_logprobs_equal_the_trainers_forward(tiny_cfg, tmp_path):
    """On-policy: the rollout's log-probs (prompt prefilled once, KV cache shared by the G samples,
    left padding) equal what the trainer computes for the same tokens (right padding)."""
    from dapo_core.config import resolve
    from tasks.train import training_problems
    from tasks.trainer import DAPOTrainer, Sample

    cfg = resolve(tiny_cfg.to_dict(), overrides=["rollout.temperature=0.7"])
    model, tok = load_policy(resolve_model_path(cfg))
    gen = HFGenerator(model, tok, max_prompt_len=64)
    trainer = DAPOTrainer(cfg, model, tok, gen, training_problems(cfg), tmp_path)
    torch.manual_seed(0)
    prompts = [chat_prompt(tok, "Compute 1 + 2."), chat_prompt(tok, "Compute 10 + 20 + 3 + 4.")]
    out = gen.generate(prompts, n=3, temperature=0.7, top_p=0.9, max_new_tokens=6)
    for i, (resp, lps) in enumerate(zip(out.response_ids, gen.last_logprobs, strict=True)):
        prompt = out.prompt_ids[i // 3]
        with torch.no_grad():
            logp, _, _ = trainer._forward_logprobs([Sample(prompt + resp, len(prompt), 1.0, True)])
        torch.testing.assert_close(logp[0], torch.tensor(lps), rtol=1e-4, atol=1e-4)
