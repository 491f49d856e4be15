"""Tests for tasks/data/ (sources, eval sets, curate), `dapo curate` and the DVC stages.

Small fixtures with exact expected counts (tests/fixtures/curate/), the real files in
../shared/data when present (skipped otherwise), the CLI's errors, and `dvc repro` in a copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from dapo_core.config import ConfigError
from dapo_core.curation import apply_template
from dapo_core.curation_pass import problem_id
from dapo_core.errors import PipelineError
from flows.cli import app
from tasks.data import curate, eval_sets, sources
from tasks.data.version import data_version
from tasks.params import REPO_ROOT, load_params

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "curate"
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"  # ../shared/data
DAPO17K = DATA / "dapo-math-17k" / "dapo_math_17k.parquet"
AIME24_PARQUET = DATA / "aime-2024" / "aime-2024.parquet"
AIME24_JSONL = DATA / "aime-2024" / "test.jsonl"
AIME25_JSONL = DATA / "aime-2025" / "test.jsonl"
MATH500 = DATA / "math-500" / "test.jsonl"

DAPO_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
    ]
)


def needs(*paths: Path):
    missing = [str(p) for p in paths if not p.exists()]
    return pytest.mark.skipif(bool(missing), reason=f"real data not here: {missing}")


def cfg_with(*overrides: str):
    return load_params(overrides=list(overrides))


@pytest.fixture
def dapo_parquet(tmp_path) -> Path:
    """The DAPO-schema fixture (template, duplicates, a disagreement, a contaminated row and
    malformed rows) written as parquet with the released file's schema."""
    rows = json.loads((FIXTURES / "dapo_rows.json").read_text())
    path = tmp_path / "dapo_small.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=DAPO_SCHEMA), path)
    return path


def run_curate(tmp_path, source, *extra: str, eval_sets=None, step="all"):
    cfg = cfg_with("data.val_size=0", *extra)
    return curate.curate(
        cfg,
        source=str(source),
        out=tmp_path / "out",
        eval_sets=eval_sets if eval_sets is not None else {},
        eval_dir=tmp_path / "eval",
        step=step,
        progress=False,
    )


def read(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


# ---------------------------------------------------------------------------------------------
# Small fixtures, exact counts
# ---------------------------------------------------------------------------------------------


def test_dapo_fixture_counts_every_row(dapo_parquet, tmp_path):
    summary = run_curate(
        tmp_path, dapo_parquet, eval_sets={"small": str(FIXTURES / "eval_small.jsonl")}
    )
    r = summary.report
    assert r["input_rows"] == 17
    assert r["dropped"] == {
        "bad_prompt_structure": 2,
        "conflicting_answers": 2,
        "contaminated": 1,
        "duplicate": 2,
        "empty_answer": 1,
        "empty_problem": 1,
        "missing_answer": 2,
        "missing_problem": 1,
        "no_integer_form": 1,
    }
    assert r["kept"] == 4 and r["train"] == 4 and r["val"] == 0
    assert r["kept"] + sum(r["dropped"].values()) == r["input_rows"]
    assert r["conflicting_problems"] == 1
    assert r["converted"] == {"total": 1, "by_form": {"m/n": 1}}
    assert r["decontamination"]["eval_sets"] == {"small": 2}
    assert [m["source_row"] for m in r["decontamination"]["matches"]] == [5]

    train = read(tmp_path / "out" / "train.parquet")
    assert [t["source_row"] for t in train] == [0, 4, 13, 16]  # source order
    by_row = {t["source_row"]: t for t in train}
    assert by_row[0]["answer"] == "34" and by_row[0]["copies"] == 3
    assert by_row[4]["answer"] == "-3"
    assert by_row[16]["answer"] == "1000"
    frac = by_row[13]
    assert frac["answer"] == "7" and frac["original_answer"] == r"\frac{3}{4}"
    assert frac["problem"].endswith("Find $m+n$.") and "relatively prime" in frac["problem"]
    for t in train:
        assert "Solve the following" not in t["problem"]  # template stripped
        assert t["prompt"] == apply_template(t["problem"])
        assert t["source"] == "dapo_small.parquet" and len(t["id"]) == 16

    rejected = read(tmp_path / "out" / "rejected.parquet")
    # every dropped row except plain duplicates, each with a reason and a detail
    assert len(rejected) == sum(r["dropped"].values()) - r["dropped"]["duplicate"]
    reasons = {x["source_row"]: x["reason"] for x in rejected}
    assert reasons[2] == reasons[3] == "conflicting_answers"
    assert reasons[5] == "contaminated" and reasons[14] == "no_integer_form"
    assert reasons[7] == reasons[8] == "bad_prompt_structure"
    assert all(x["detail"] for x in rejected)


def test_plain_jsonl_with_malformed_rows_never_crashes(tmp_path):
    r = run_curate(tmp_path, FIXTURES / "plain_malformed.jsonl").report
    assert r["input_rows"] == 16  # the blank line is not a row
    assert r["dropped"] == {
        "answer_wrong_type": 4,
        "bad_prompt_structure": 1,
        "empty_problem": 1,
        "invalid_json": 1,
        "missing_answer": 1,
        "missing_problem": 1,
        "not_a_record": 1,
        "problem_wrong_type": 1,
    }
    assert r["kept"] == 5  # "0.5" is the exact fraction 1/2 (no rounding asked): m+n = 3
    train = read(tmp_path / "out" / "train.parquet")
    assert [t["answer"] for t in train] == ["5", "7", "12", "3", "3"]
    assert train[2]["problem"] == "Compute $6+6$ in the usual way."  # string prompt, stripped
    assert train[3]["answer_form"] == "m/n"
    rejected = read(tmp_path / "out" / "rejected.parquet")
    assert any(x["reason"] == "invalid_json" and "line 3" in x["detail"] for x in rejected)


def test_ids_and_outputs_are_stable_across_runs(dapo_parquet, tmp_path):
    def digest(d: Path) -> dict[str, str]:
        return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}

    run_curate(tmp_path / "a", dapo_parquet, "data.val_size=1")
    run_curate(tmp_path / "b", dapo_parquet, "data.val_size=1")
    assert digest(tmp_path / "a" / "out") == digest(tmp_path / "b" / "out")
    val = read(tmp_path / "a" / "out" / "val.parquet")
    train = read(tmp_path / "a" / "out" / "train.parquet")
    assert len(val) == 1 and len(train) == 4  # no eval sets here: the near-copy is kept
    assert not {v["id"] for v in val} & {t["id"] for t in train}
    # the id is a hash of the problem text: the same problem gets the same id from any file
    assert train[0]["id"] == problem_id(train[0]["problem"])


def test_val_size_too_large_is_a_clear_error(dapo_parquet, tmp_path):
    with pytest.raises(PipelineError, match="data.val_size"):
        run_curate(tmp_path, dapo_parquet, "data.val_size=5")


@pytest.mark.parametrize(
    "rows, says",
    [
        ('{"a": 1}\n{"a": 2}\n', "out of 2 rows: 2 missing_problem (row 0: no problem"),
        ('{"problem": "What is 1+1?", "answer": "x^2"}\n', "1 no_integer_form (row 0:"),
        ("", "has no rows"),
    ],
    ids=["no fields", "no integer answer", "empty"],
)
def test_a_source_with_nothing_to_keep_says_why_and_writes_nothing(tmp_path, rows, says):
    """It used to blame data.val_size, whatever the file's problem was."""
    source = tmp_path / "src.jsonl"
    source.write_text(rows)
    with pytest.raises(PipelineError, match=re.escape(says)) as e:
        run_curate(tmp_path, source, "data.val_size=4")
    assert "val_size" not in str(e.value) and not (tmp_path / "out").exists()


def test_an_empty_source_is_refused_before_any_eval_set_is_fetched(tmp_path, monkeypatch):
    """It used to prepare the eval sets first (a download each, warnings about the network)."""
    source = tmp_path / "src.jsonl"
    source.write_text("\n\n")
    fetched: list[object] = []
    monkeypatch.setattr(curate, "prepare_eval_sets", lambda *a, **k: fetched.append(a) or {})
    with pytest.raises(PipelineError, match="src.jsonl has no rows"):
        run_curate(tmp_path, source, eval_sets={"aime": "some/hub-id"})
    assert not fetched and not (tmp_path / "out").exists() and not (tmp_path / "eval").exists()


def test_synthetic_source(tmp_path):
    cfg = cfg_with("synthetic.num_train=40", "synthetic.num_test=10", "data.val_size=8")
    s = curate.curate(
        cfg, out=tmp_path / "out", eval_sets={}, eval_dir=tmp_path / "eval", progress=False
    )
    assert s.report["source"] == "synthetic:arith"
    assert s.report["input_rows"] == 40 and s.report["kept"] == 40
    assert (s.report["train"], s.report["val"]) == (32, 8)
    train = read(tmp_path / "out" / "train.parquet")
    assert train[0]["id"].startswith("arith-") and train[0]["prompt"] == train[0]["problem"]
    from tasks.data.tables import load_problems

    problems = load_problems(tmp_path / "out" / "train.parquet")
    assert problems[0].prompt.startswith("Compute") and problems[0].answer.isdigit()


def test_eval_set_from_dapo_parquet_and_zero_padded_jsonl(tmp_path):
    # 3 copies of each of 2 problems, raw problem in extra_info (the official AIME layout)
    raw = ["Find $a$ if $a + 1 = 24$ and $a$ is an integer.", "Find $b$ if $b - 1 = 8$ exactly."]
    rows = [
        {
            "prompt": [{"content": apply_template(raw[i % 2]), "role": "user"}],
            "reward_model": {"ground_truth": ["23", "9"][i % 2], "style": "rule"},
            "extra_info": {"index": i % 2, "raw_problem": raw[i % 2], "split": None},
        }
        for i in range(6)
    ]
    path = tmp_path / "aime-like.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    manifest = eval_sets.prepare_eval_sets(
        {"like": str(path), "small": str(FIXTURES / "eval_small.jsonl")},
        tmp_path / "eval",
        progress=False,
    )
    assert manifest["like"]["problems"] == 2 and manifest["like"]["dropped"] == {"duplicate": 4}
    like = read(tmp_path / "eval" / "like.parquet")
    assert [(x["problem"], x["answer"]) for x in like] == [(raw[0], "23"), (raw[1], "9")]
    small = read(tmp_path / "eval" / "small.parquet")
    assert [x["answer"] for x in small] == ["204", "23"]  # "023" canonicalized


def test_unavailable_eval_sets_are_listed_not_fatal(tmp_path):
    manifest = eval_sets.prepare_eval_sets(
        {
            "hub": "BytedTsinghua-SIA/AIME-2024",
            "gone": "data/raw/nothing-here.jsonl",
            "small": str(FIXTURES / "eval_small.jsonl"),
        },
        tmp_path / "eval",
        progress=False,
    )
    assert manifest["small"]["status"] == "ready"
    assert manifest["hub"]["status"] == manifest["gone"]["status"] == "unavailable"
    assert "Hugging Face Hub" in manifest["hub"]["reason"]
    assert "data.eval_sets.hub" in manifest["hub"]["reason"]
    on_disk = json.loads((tmp_path / "eval" / "manifest.json").read_text())["eval_sets"]
    assert on_disk == manifest
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == [
        "manifest.json",
        "small.parquet",
    ]
    # the training step then decontaminates against what the manifest holds, no retry
    ready, missing = eval_sets.eval_sets_for_decontamination(
        {"hub": "BytedTsinghua-SIA/AIME-2024", "small": str(FIXTURES / "eval_small.jsonl")},
        tmp_path / "eval",
    )
    assert list(ready) == ["small"] and list(missing) == ["hub"]
    # ... but a set required on the command line must be readable
    with pytest.raises(sources.SourceUnavailable):
        eval_sets.prepare_eval_sets(
            {"hub": "BytedTsinghua-SIA/AIME-2024"}, tmp_path / "e2", {"hub"}, progress=False
        )


def test_eval_set_names_and_source_kinds():
    assert eval_sets.eval_set_name("BytedTsinghua-SIA/AIME-2024") == "aime-2024"
    assert eval_sets.eval_set_name("/x/aime-2025/test.jsonl") == "aime-2025"
    assert eval_sets.eval_set_name("data/raw/math500.parquet") == "math500"
    assert sources.resolve_source("synthetic:arith").kind == "synthetic"
    assert sources.resolve_source("BytedTsinghua-SIA/DAPO-Math-17k").kind == "hub"
    assert sources.resolve_source(str(FIXTURES / "eval_small.jsonl")).kind == "file"
    assert sources.resolve_source("tests/fixtures/curate/eval_small.jsonl").kind == "file"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sources.resolve_source("data/raw/missing.parquet")
    with pytest.raises(ConfigError, match="unknown synthetic task"):
        sources.resolve_source("synthetic:calculus")


def test_evaluate_names_how_to_prepare_a_missing_eval_set(tmp_path, monkeypatch):
    from tasks.data.splits import eval_problems

    def fake_repo(p):
        return tmp_path / p

    monkeypatch.setattr(eval_sets, "repo_path", fake_repo)
    monkeypatch.setattr(sources, "repo_path", fake_repo)
    cfg = load_params()
    assert cfg.data.eval_sets["aime-2024"] == "BytedTsinghua-SIA/AIME-2024"
    with pytest.raises(FileNotFoundError) as err:
        eval_problems(cfg, "aime-2024")
    msg = str(err.value)
    assert "not prepared" in msg and "dvc repro" in msg and "data.eval_sets.aime-2024" in msg
    # a local file named in data.eval_sets works without a prepared copy
    local = cfg_with(f'data.eval_sets={{"small": "{FIXTURES / "eval_small.jsonl"}"}}')
    name, problems = eval_problems(local, "small")
    assert name == "small" and [p.answer for p in problems] == ["204", "23"]
    # the prepared copy is used when it was made from the same spec
    eval_sets.prepare_eval_sets(local.data.eval_sets, tmp_path / "data" / "eval", progress=False)
    assert len(eval_problems(local, "small")[1]) == 2


# ---------------------------------------------------------------------------------------------
# The CLI
# ---------------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_missing_source_file(tmp_path):
    out = runner.invoke(
        app,
        ["curate", "--source", str(tmp_path / "nope.parquet"), "--out", str(tmp_path / "o")]
        + ["--step", "train", "--eval-dir", str(tmp_path / "e")],
    )
    assert out.exit_code == 2
    assert "does not exist" in out.output and "--source PATH" in out.output


def test_cli_offline_hub_id(tmp_path):
    out = runner.invoke(
        app,
        ["curate", "--source", "BytedTsinghua-SIA/DAPO-Math-17k", "--out", str(tmp_path / "o")]
        + ["--eval-set", f"small={FIXTURES / 'eval_small.jsonl'}"]
        + ["--eval-dir", str(tmp_path / "e")],
    )
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())
    assert "Hugging Face Hub" in text and "--source PATH" in text and "data.source" in text
    assert not (tmp_path / "o").exists()


def test_cli_missing_explicit_eval_set(tmp_path):
    out = runner.invoke(
        app,
        ["curate", "--eval-set", str(tmp_path / "none.jsonl"), "--eval-dir", str(tmp_path / "e")]
        + ["--step", "eval"],
    )
    assert out.exit_code == 2 and "does not exist" in out.output


def test_cli_curates_a_fixture(dapo_parquet, tmp_path):
    out = runner.invoke(
        app,
        ["curate", "--source", str(dapo_parquet), "--out", str(tmp_path / "o")]
        + ["--eval-set", f"small={FIXTURES / 'eval_small.jsonl'}"]
        + ["--eval-dir", str(tmp_path / "e"), "-S", "data.val_size=1"],
    )
    assert out.exit_code == 0, out.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert (report["kept"], report["train"], report["val"]) == (4, 3, 1)
    assert (tmp_path / "e" / "small.parquet").exists()


# ---------------------------------------------------------------------------------------------
# The real data (../shared/data), skipped when absent
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@needs(DAPO17K, AIME24_PARQUET, AIME25_JSONL)
def test_real_dapo_math_17k(tmp_path):
    table = pq.read_table(DAPO17K)
    texts = [p[0]["content"] for p in table.column("prompt").to_pylist()]
    truths = [r["ground_truth"] for r in table.column("reward_model").to_pylist()]
    assert len(texts) == 17917  # the data README's facts, exact text
    assert len(set(texts)) == 17290 and len(set(zip(texts, truths, strict=True))) == 17301

    t0 = time.process_time()  # CPU seconds: a busy machine does not inflate them
    summary = run_curate(
        tmp_path,
        DAPO17K,
        "data.val_size=64",
        eval_sets={"aime-2024": str(AIME24_PARQUET), "aime-2025": str(AIME25_JSONL)},
    )
    cpu_s = time.process_time() - t0
    r = summary.report
    assert r["input_rows"] == 17917
    assert r["kept"] + sum(r["dropped"].values()) == 17917
    # whitespace-insensitive: 16,921 distinct problems; 15 of them carry two answers (2 rows
    # each, all counted as conflicting), so the extra copies of the others are the duplicates
    assert r["dropped"]["duplicate"] == 17917 - 16921 - 15 == 981
    assert r["conflicting_problems"] == 15 and r["dropped"]["conflicting_answers"] == 30
    assert r["dropped"].get("contaminated", 0) < 0.01 * 17917
    assert r["kept"] == 16921 - 15 - r["dropped"].get("contaminated", 0)
    assert (r["train"], r["val"]) == (r["kept"] - 64, 64)
    assert r["converted"]["total"] == 0  # every answer is already an integer
    assert r["decontamination"]["eval_sets"] == {"aime-2024": 30, "aime-2025": 30}
    assert cpu_s < 60


@needs(AIME24_PARQUET, AIME24_JSONL)
def test_real_aime_2024(tmp_path):
    rows, entry = eval_sets.prepare_eval_set("aime-2024", str(AIME24_PARQUET))
    assert entry["input_rows"] == 960 and len(rows) == 30
    assert entry["dropped"] == {"duplicate": 930}
    aya = [r for r in rows if "Aya" in r["problem"]]
    assert len(aya) == 1 and aya[0]["answer"] == "204"
    assert all(0 <= int(r["answer"]) <= 999 for r in rows)
    assert all(r["prompt"] == apply_template(r["problem"]) for r in rows)

    jsonl, _ = eval_sets.prepare_eval_set("aime-2024-qwen", str(AIME24_JSONL))
    assert len(jsonl) == 30 and not any(r["answer"].startswith("0") for r in jsonl)
    answers = {r["problem"]: r["answer"] for r in rows}
    same = [r for r in jsonl if r["problem"] in answers]
    assert len(same) == 29 and all(answers[r["problem"]] == r["answer"] for r in same)


@needs(AIME25_JSONL)
def test_real_aime_2025(tmp_path):
    rows, entry = eval_sets.prepare_eval_set("aime-2025", str(AIME25_JSONL))
    assert len(rows) == 30 and entry["dropped"] == {}
    assert rows[0]["answer"] == "70"


@needs(MATH500)
def test_real_math_500_conversions(tmp_path):
    r = run_curate(tmp_path, MATH500).report
    assert r["input_rows"] == 500
    forms = Counter_of(read(tmp_path / "out" / "train.parquet"))
    # 311 plain integers + 20 integers in disguise (145^\circ, x=5, 58,500, \$36)
    assert forms.pop("integer") == 331
    # terminating decimals are exact fractions unless the problem asks for a rounded value
    assert sum(forms.values()) == r["converted"]["total"] == 91
    assert r["dropped"] == {"no_integer_form": 78}  # of the 169 non-integer answers


def Counter_of(rows):  # noqa: N802 - reads as the Counter it returns
    from collections import Counter

    return Counter(x["answer_form"] for x in rows)


# ---------------------------------------------------------------------------------------------
# DVC: dvc.yaml, the data version, `dvc repro` in a copy of the repo
# ---------------------------------------------------------------------------------------------


def _flat_keys(d: dict, prefix: str = "") -> set[str]:
    keys = set()
    for k, v in d.items():
        keys.add(prefix + k)
        if isinstance(v, dict) and prefix == "":
            keys |= _flat_keys(v, f"{k}.")
    return keys


def test_dvc_yaml_stages_match_params_and_code():
    spec = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())
    params = _flat_keys(yaml.safe_load((REPO_ROOT / "params.yaml").read_text()))
    stages = spec["stages"]
    assert set(stages) == {"eval_sets", "curate"}
    for name, stage in stages.items():
        assert "-m flows.cli curate" in stage["cmd"]
        assert set(stage["params"]) <= params, name
        for dep in stage["deps"]:
            assert dep == "data/eval" or (REPO_ROOT / dep).exists(), dep
    assert stages["eval_sets"]["params"] == ["data.eval_sets"]
    assert stages["eval_sets"]["outs"] == ["data/eval"]
    assert stages["curate"]["outs"] == ["${data.out_dir}"]
    assert "data/eval" in stages["curate"]["deps"]


def test_dvc_lock_records_the_code_the_stages_run():
    """dvc.lock is committed with the hashes of the code each stage ran: stale, a fresh clone's
    `make demo` (`dvc repro`) reruns the stages and leaves dvc.lock modified. After changing a
    stage's code: `.venv/bin/dvc repro` (or `dvc commit`), and commit dvc.lock with it. Outputs
    a clone has not built yet (data/) do not count."""
    out = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )
    assert out.returncode == 0, out.stderr
    stale = {
        (stage, path)
        for stage, entries in json.loads(out.stdout or "{}").items()
        for entry in entries
        if isinstance(entry, dict)
        for path, change in entry.get("changed deps", {}).items()
        if not path.startswith("data/")
    }
    assert not stale, f"dvc.lock is out of date for {sorted(stale)}: run `.venv/bin/dvc repro`"


def test_data_version(tmp_path):
    assert data_version(tmp_path / "dvc.lock") == "none"
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  a:\n    outs:\n    - path: data/eval\n      md5: 1.dir\n"
        "  b:\n    outs:\n    - path: data/curated\n      md5: 2.dir\n"
    )
    v = data_version(tmp_path / "dvc.lock")
    assert len(v) == 32 and v != "none"


@pytest.mark.slow
def test_dvc_repro_in_a_fresh_copy(tmp_path):
    """The embedded default, offline: both stages run, the hub eval sets are listed as
    unavailable, dvc.lock gives a data version, and a second repro changes nothing."""
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__")
    for d in ("dapo_core", "tasks", "flows"):
        shutil.copytree(REPO_ROOT / d, repo / d, ignore=ignore)
    for f in ("dvc.yaml", "params.yaml", ".dvcignore", ".dvc/config", ".dvc/.gitignore"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / f, repo / f)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    dvc = [sys.executable, "-m", "dvc"]
    first = subprocess.run([*dvc, "repro"], cwd=repo, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    manifest = json.loads((repo / "data" / "eval" / "manifest.json").read_text())["eval_sets"]
    assert {e["status"] for e in manifest.values()} == {"unavailable"}
    report = json.loads((repo / "data" / "curated" / "report.json").read_text())
    assert report["source"] == "synthetic:arith" and report["val"] == 64
    version = data_version(repo / "dvc.lock")
    assert version != "none"
    again = subprocess.run([*dvc, "repro"], cwd=repo, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "didn't change" in again.stdout
    assert data_version(repo / "dvc.lock") == version


def test_synthetic_splits_are_disjoint_and_training_never_sees_validation():
    from tasks.data.splits import splits

    cfg = load_params()
    parts = splits(cfg)
    train, val, test = parts.train, parts.val, parts.test
    assert len(val) == cfg.data.val_size and len(test) == cfg.synthetic.num_test
    assert len(train) + len(val) == cfg.synthetic.num_train
    ids = [{p.id for p in s} for s in (train, val, test)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert {p.id for p in splits(cfg).train} == ids[0]


def test_corrupt_parquet_source_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    """One line whatever the terminal's width or the path's length: a console that wrapped at
    its width split the message across lines (and this test failed in a long clone path)."""
    import flows.commands.base
    import tasks.data.sources

    for module in (flows.commands.base, tasks.data.sources):
        monkeypatch.setattr(module.console, "width", 30)
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 6)
    deep.mkdir(parents=True)
    bad = deep / "x.parquet"
    bad.write_bytes(b"not a parquet file" * 10)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["curate", "--source", str(bad), "--out", str(out)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if "error:" in line]
    assert len(lines) == 1 and f"{bad} is not a readable parquet file" in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


def test_curate_with_out_leaves_the_repository_alone(tmp_path):
    """--out puts the eval sets beside the output; the repo's data/eval is not rewritten."""
    repo_eval = REPO_ROOT / "data" / "eval"
    before = {p: p.stat().st_mtime_ns for p in repo_eval.rglob("*")} if repo_eval.exists() else {}
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["curate", "--source", "synthetic:arith", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "train.parquet").exists() and (out / "eval" / "manifest.json").exists()
    after = {p: p.stat().st_mtime_ns for p in repo_eval.rglob("*")} if repo_eval.exists() else {}
    assert after == before


# ---------------------------------------------------------------------------------------------
# Stops, leftovers and curated data that is not what the config says
# ---------------------------------------------------------------------------------------------


def test_a_stop_while_writing_keeps_the_old_outputs_whole(dapo_parquet, tmp_path, monkeypatch):
    """Ctrl-C in the write phase left train.parquet.tmp, or a new train.parquet beside the old
    val.parquet and report.json."""
    run_curate(tmp_path, dapo_parquet, "data.val_size=1")
    out = tmp_path / "out"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = curate.write_parquet
    calls = []

    def stopped_on_the_second(rows, schema, path):
        calls.append(path.name)
        if len(calls) == 2:
            path.with_name(path.name + ".tmp").write_bytes(b"half")
            raise KeyboardInterrupt
        real(rows, schema, path)

    monkeypatch.setattr(curate, "write_parquet", stopped_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        run_curate(tmp_path, dapo_parquet, "data.val_size=2")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_an_interrupted_atomic_write_leaves_no_tmp_file(tmp_path, monkeypatch):
    from tasks.data import tables

    def killed(table, where):
        Path(where).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(tables.pq, "write_table", killed)
    with pytest.raises(KeyboardInterrupt):
        tables.write_parquet([], tables.TRAIN_SCHEMA, tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


def test_curate_refuses_an_out_dir_it_cannot_write_before_reading(tmp_path):
    """-S data.out_dir=<a file> failed with an Errno after the whole curation."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = cfg_with(f"data.out_dir={blocker / 'curated'}")
    with pytest.raises(PipelineError, match=f"data.out_dir {blocker / 'curated'}: {blocker} is"):
        curate.curate(
            cfg, source=str(tmp_path / "missing.parquet"), eval_sets={}, progress=False
        )  # refused before the (missing) source is opened


@pytest.fixture
def curated_from(tmp_path, monkeypatch):
    """curate(source) into <tmp>/data/curated, read back with data.source set to ``spec``."""
    monkeypatch.setattr(curate, "repo_path", lambda p: tmp_path / p)

    def make(source: Path, spec: str | None = None):
        cfg = cfg_with("data.val_size=1", "data.out_dir=data/curated")
        curate.curate(
            cfg, source=str(source), out=tmp_path / "data" / "curated", eval_sets={}, progress=False
        )
        return cfg_with(f"data.source={spec or source}", "data.out_dir=data/curated")

    return make


def test_training_reads_curated_data_of_its_own_source_only(curated_from, tmp_path):
    """-S data.source=X trained on the curated data of another source, silently."""
    from tasks.data.splits import splits

    source = tmp_path / "dapo_small.jsonl"
    shutil.copy(FIXTURES / "plain_malformed.jsonl", source)
    cfg = curated_from(source)
    assert len(splits(cfg).train) == 4  # 5 kept, 1 of them validation
    other = cfg_with(f"data.source={FIXTURES / 'eval_small.jsonl'}", "data.out_dir=data/curated")
    with pytest.raises(
        PipelineError,
        match="curated from dapo_small.jsonl \\(file\\), not .*eval_small.jsonl; run `dapo curate`",
    ):
        splits(other)
    source.write_text(source.read_text() + '{"problem": "What is 2+2?", "answer": "4"}\n')
    with pytest.raises(PipelineError, match="an earlier version of .*sha256 differs"):
        splits(cfg)


def test_training_refuses_curated_data_without_its_report(curated_from, tmp_path):
    """A curation stopped between its renames (or a folder made by hand) has no report.json."""
    from tasks.data.splits import splits

    cfg = curated_from(FIXTURES / "plain_malformed.jsonl")
    (tmp_path / "data" / "curated" / "report.json").unlink()
    with pytest.raises(PipelineError, match="holds no readable report.json: no `dapo curate`"):
        splits(cfg)


def test_training_on_a_source_never_curated_says_how_to_curate_that_one(curated_from, tmp_path):
    """`-S data.source=/nonexistent.parquet` said to run `dapo curate`, which curated
    params.yaml's source, after which the same advice came again."""
    from tasks.data.splits import splits

    curated_from(FIXTURES / "plain_malformed.jsonl")
    missing = cfg_with("data.source=/nonexistent.parquet", "data.out_dir=data/curated")
    with pytest.raises(FileNotFoundError, match="/nonexistent.parquet does not exist .*set "
                       "data.source \\(-S data.source=...\\) to one that is"):  # fmt: skip
        splits(missing)
    elsewhere = cfg_with(f"data.source={FIXTURES / 'plain_malformed.jsonl'}",
                         "data.out_dir=data/other")  # fmt: skip
    advice = "other/train.parquet does not exist; run `dapo curate` with the same -c and -S to "
    with pytest.raises(FileNotFoundError, match=advice + "curate .*plain_malformed.jsonl"):
        splits(elsewhere)


def test_an_eval_set_with_no_readable_row_is_not_ready(tmp_path):
    """A file with other columns was marked 'ready' with 0 problems; given on the command line,
    its failure left an empty eval folder behind."""
    wrong = tmp_path / "wrongcols.parquet"
    pq.write_table(pa.Table.from_pylist([{"q": "1+1", "a": "2"}] * 3), wrong)
    manifest = eval_sets.prepare_eval_sets({"w": str(wrong)}, tmp_path / "eval", progress=False)
    assert manifest["w"]["status"] == "unavailable"
    assert "holds no problem (3 rows: 3 missing_problem)" in manifest["w"]["reason"]
    with pytest.raises(sources.SourceUnavailable, match="holds no problem"):
        eval_sets.prepare_eval_sets({"w": str(wrong)}, tmp_path / "e2", {"w"}, progress=False)
    assert not (tmp_path / "e2").exists()


def test_a_curation_stopped_after_its_eval_sets_leaves_no_new_folder(tmp_path, monkeypatch):
    """Ctrl-C after the eval step of `dapo curate --out NEW` left NEW/eval/ alone."""

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(curate, "curate_source", stopped)
    cfg = cfg_with("data.val_size=0")
    with pytest.raises(KeyboardInterrupt):
        curate.curate(
            cfg,
            source="synthetic:arith",
            out=tmp_path / "new",
            eval_sets={"small": str(FIXTURES / "eval_small.jsonl")},
            progress=False,
        )
    assert list(tmp_path.iterdir()) == []
