"""GPU paths (bf16 training, the vLLM backend): skipped cleanly where CUDA or vLLM is absent."""

import pytest
import torch

from dapo_core.config import resolve

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_bf16_training_step_on_gpu(tiny_cfg, tmp_path):
    from tasks.train import run_training

    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.steps=2", "model.dtype=bfloat16"])
    result = run_training(cfg, tmp_path, progress=False)
    assert result.steps == 2
    assert all(r["train/grad_norm"] == r["train/grad_norm"] for r in result.history)  # not NaN


@pytest.mark.gpu
@cuda
def test_vllm_backend_matches_interface(tiny_cfg):
    pytest.importorskip("vllm")
    from tasks.models import chat_prompt, load_policy, resolve_model_path
    from tasks.rollout import VLLMGenerator

    path = resolve_model_path(tiny_cfg)
    model, tok = load_policy(path, "float32", "cuda")
    gen = VLLMGenerator(path, tok, max_prompt_len=32, max_model_len=64)
    gen.sync_weights(model)
    out = gen.generate(
        [chat_prompt(tok, "Compute 1 + 2.")], n=4, temperature=1.0, top_p=1.0, max_new_tokens=6
    )
    assert len(out.response_ids) == 4 and all(len(r) <= 6 for r in out.response_ids)


def test_vllm_backend_without_vllm_is_a_clear_error(tiny_cfg):
    try:
        import vllm  # noqa: F401
    except ImportError:
        from tasks.rollout import VLLMGenerator

        with pytest.raises(RuntimeError, match=r"pip install -e '\.\[gpu\]'"):
            VLLMGenerator("x", None, 8, 16)
    else:
        pytest.skip("vllm is installed")
