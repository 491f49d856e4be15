"""The hand-written RMSNorm backward against transformers' module, value for value."""

import pytest
import torch
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from tasks.training.kernels import install_rms_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers(dtype):
    torch.manual_seed(0)
    ref = Qwen2RMSNorm(48, eps=1e-6).to(dtype)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(48))
    fast = Qwen2RMSNorm(48, eps=1e-6).to(dtype)
    fast.load_state_dict(ref.state_dict())
    holder = torch.nn.Sequential(fast)
    assert install_rms_norm(holder) == 1

    x = torch.randn(3, 5, 48, dtype=dtype) * 3
    grad = torch.randn(3, 5, 48, dtype=dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ref(xa), fast(xb)
    ya.backward(grad)
    yb.backward(grad)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(yb, ya, **tol)
    torch.testing.assert_close(xb.grad, xa.grad, **tol)
    torch.testing.assert_close(fast.weight.grad, ref.weight.grad, **tol)
    assert yb.dtype == ya.dtype and xb.grad.dtype == dtype


def test_only_known_norm_classes_are_changed():
    class OtherRMSNorm(torch.nn.Module):  # e.g. Gemma's (1 + weight) scaling
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return x * (1 + self.weight)

    model = torch.nn.Sequential(OtherRMSNorm(), Qwen2RMSNorm(4))
    assert install_rms_norm(model) == 1
    x = torch.ones(2, 4)
    assert torch.equal(model[0](x), x)  # untouched


def test_cpu_sdpa_matches_transformers_sdpa(tiny_cfg):
    """Grouped-query attention broadcast by the kernel: same logits and gradients as transformers'
    SDPA path (which repeats the key/value heads), with left padding and without a mask."""
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.training.kernels import CPU_SDPA, use_cpu_sdpa

    path = resolve_model_path(tiny_cfg)
    ref, _ = load_policy(path, "float32")
    fast, _ = load_policy(path, "float32")
    assert ref.config.num_key_value_heads < ref.config.num_attention_heads  # really grouped
    assert use_cpu_sdpa(fast) and fast.config._attn_implementation == CPU_SDPA
    torch.manual_seed(0)
    ids = torch.randint(3, 300, (3, 12))
    attn = torch.ones_like(ids)
    attn[0, :4] = 0
    for mask in (attn, None):
        a = ref(input_ids=ids, attention_mask=mask).logits
        b = fast(input_ids=ids, attention_mask=mask).logits
        real = attn.bool() if mask is not None else torch.ones_like(attn, dtype=torch.bool)
        torch.testing.assert_close(b[real], a[real], rtol=1e-5, atol=1e-5)
        a[real].sum().backward()
        b[real].sum().backward()
    for pa, pb in zip(ref.parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-4, atol=1e-5)
