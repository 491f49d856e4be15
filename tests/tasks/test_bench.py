"""Benchmark helpers do equal work and count what they claim (timings are not asserted here)."""

import pytest

from bench import dynamic_sampling, generation
from dapo_core.synthetic import arith_problems
from tasks.models import load_policy, resolve_model_path


def test_generation_sides_produce_the_same_number_of_tokens(tiny_cfg):
    model, tok = load_policy(resolve_model_path(tiny_cfg))
    train, _ = arith_problems(1, 20, 0, 9, 2)
    prompts = [p.prompt for p in train[:3]]
    # Each side asserts exactly L tokens per sample; tokens/s must then be positive and finite.
    for side in (generation.ours, generation.baseline):
        tps = side(model, tok, prompts, 2, 5)
        assert 0 < tps < float("inf")


@pytest.mark.slow
@pytest.mark.parametrize("sized", [False, True])
def test_dynamic_sampling_waste_accounting(sized):
    overrides = [
        "train.prompt_batch=16",
        "train.gen_batch=24",
        f"algo.size_gen_batches={str(sized).lower()}",
    ]
    r = dynamic_sampling.measure(2, overrides)
    if not sized:
        assert r["groups_generated"] % 24 == 0 and r["groups_generated"] >= 2 * 24  # whole batches
    assert r["groups_trained"] <= 2 * 16
    # From an empty carry nothing is trained that was not kept: waste >= 1 (1 is the bound).
    assert r["waste"] >= 1.0 - 1e-9
    assert r["bound"] == pytest.approx(1 / r["kept_frac"])
