import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.floors import floors, generation_bytes, main
from bench.mfu import model_config


@pytest.mark.parametrize("shape", ["tiny", "qwen2.5-0.5b", "smollm2-135m"])
def test_a_decode_step_reads_every_weight_once(shape):
    """The weights a step reads are the model's parameters (the tied embedding counted once, as
    the output layer's): counted from the config, against the model transformers builds."""
    config = model_config(shape)
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    assert generation_bytes(config, rows=1, prompt=0, L=2)["weights"] == 2 * params


def test_key_value_and_logit_bytes_by_hand():
    """Two sequences, a 3-token prompt, 3 response tokens: two decode steps attend over 4 and 5
    positions (9), each position holding a key and a value per layer and kv head; each step
    writes and reads (2, V) bf16 logits."""
    config = model_config("tiny")  # 2 layers, 2 kv heads, head dim 128 / 4 = 32, V = 384
    found = generation_bytes(config, rows=2, prompt=3, L=3)
    assert found["key/value"] == 2 * 9 * (2 * 2 * 2 * 32) * 2
    assert found["logits"] == 2 * (2 * 2 * 384) * 2


def test_floors_add_up_and_the_update_scales_with_its_utilisation(capsys):
    f = floors("tiny", 2, 4, 16, 8, bandwidth=1e9, peak=1e12, mfu=0.25)
    assert f["generation"] == pytest.approx(f["weights"] + f["key/value"] + f["logits"])
    assert f["update at MFU"] == pytest.approx(4 * f["update at peak"])
    longer = floors("tiny", 2, 4, 32, 8, bandwidth=1e9, peak=1e12, mfu=0.25)
    assert longer["key/value"] > 2 * f["key/value"]  # the window grows with the response
    main(
        ["--model", "tiny", "--shapes", "2x4x16", "--prompt", "8", "--bandwidth", "0.001"]
        + ["--peak-tflops", "1", "--mfu", "0.25"]
    )
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[0] == "2x4x16" and float(row[-1]) == pytest.approx(
        f["generation"] / f["update at MFU"], rel=0.01
    )
