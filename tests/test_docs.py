"""The documentation holds together: every document the code and the configs cite is in the
repository, with the section they cite; the README's links land; the generated reference pages
are current; and the site builds with no broken link or anchor (a newcomer can follow each
reference)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = ("dapo_core", "tasks", "flows", "bench")
OTHER_CITERS = ("params.yaml", "constraints.txt", "Makefile", "checkpoints/README.md", "README.md")
# A document by path from the repository root, or one of the root's (README.md): not a file a run
# writes (ablation.md), nor a page's link relative to another (../guide/x.md).
CITED = re.compile(r"(?<![\w./-])((?:\w[\w.-]*/)+[\w.-]+\.md|[A-Z][A-Z_]*\.md)\b")
SECTION = re.compile(r"docs/design\.md,?\s+section\s+(\d+)")
# A page and the heading (or the bold lead of a paragraph) it cites: docs/results.md, "Ranking".
QUOTED = re.compile(r"((?:\w[\w.-]*/)+[\w.-]+\.md)`?,\s+[\"']([^\"']+)[\"']")
README_LINK = re.compile(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)")


def _sources() -> list[Path]:
    code = [p for folder in CODE for p in sorted((ROOT / folder).rglob("*.py"))]
    return code + sorted((ROOT / "configs").glob("*.yaml")) + [ROOT / p for p in OTHER_CITERS]


def test_every_cited_document_is_in_the_repository():
    missing = {
        f"{path.relative_to(ROOT)} cites {name}"
        for path in _sources()
        for name in CITED.findall(path.read_text())
        if not (ROOT / name).is_file()
    }
    assert not missing, sorted(missing)


def test_every_cited_design_section_exists():
    design = (ROOT / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^## (\d+)\.", design, flags=re.M))
    cited = {
        (str(path.relative_to(ROOT)), n)
        for path in _sources()
        for n in SECTION.findall(path.read_text())
    }
    assert cited, "the code cites the design document"
    assert all(n in sections for _, n in cited), sorted(cited)


def _has_section(page: Path, title: str) -> bool:
    """Whether ``page`` has a heading, or a paragraph's bold lead, that starts with ``title``."""
    lead = re.escape(" ".join(title.split()))
    return re.search(rf"^(#+ |\*\*){lead}", page.read_text(), flags=re.M) is not None


def test_every_cited_section_of_a_page_exists():
    cited = {
        (str(path.relative_to(ROOT)), page, " ".join(re.sub(r"\s#\s", " ", title).split()))
        for path in _sources()
        for page, title in QUOTED.findall(path.read_text())
    }
    assert any(page == "docs/results.md" for _, page, _ in cited), "the configs cite the results"
    missing = sorted(c for c in cited if not _has_section(ROOT / c[1], c[2]))
    assert not missing, missing


def _anchor(heading: str) -> str:
    """The id MkDocs gives a heading (Python-Markdown's toc slugify, on the heading's text)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readme_links_land_on_pages_and_anchors_that_exist():
    links = README_LINK.findall((ROOT / "README.md").read_text())
    assert len(links) >= 10, links
    broken = []
    for page, anchor in links:
        path = ROOT / page
        headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M) if path.is_file() else None
        if headings is None or (anchor and anchor not in {_anchor(h) for h in headings}):
            broken.append(f"{page}#{anchor}")
    assert not broken, broken


def test_the_readme_is_a_summary():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move detail into docs/"
    assert lines[2:6] == [
        "```bash",
        "make demo   # set up .venv (CPU torch), run `dvc repro`, `dapo pipeline` and a short "
        "`dapo ablate`",
        "make test   # same set-up, then ruff (lint + format check) and the whole pytest suite",
        "```",
    ], "the two commands come first"


def test_the_citation_patterns_read_what_they_should():
    text = "see DESIGN.md section 2, docs/x.md, [a](../guide/y.md) and the run's ablation.md"
    assert CITED.findall(text) == ["DESIGN.md", "docs/x.md"]
    assert SECTION.findall("docs/design.md section 4 and docs/design.md, section 12") == ["4", "12"]
    quoted = "see docs/results.md, \"The starting model\" and `docs/a/b.md`, 'Start-up'"
    assert QUOTED.findall(quoted) == [
        ("docs/results.md", "The starting model"),
        ("docs/a/b.md", "Start-up"),
    ]
    assert _anchor("Rollouts that overlap training (`train.rollout_ranks`)") == (
        "rollouts-that-overlap-training-trainrollout_ranks"
    )


# The generated reference pages (flows/reference_docs.py).


def test_the_generated_reference_pages_are_current():
    from flows import reference_docs

    stale = reference_docs.stale()
    assert not stale, f"{stale}: run `python -m flows.reference_docs` and commit"


def test_a_changed_config_docstring_makes_the_config_page_stale(monkeypatch, capsys):
    """The check reads the docstrings themselves: one reworded docstring is a stale page, and
    ``--check`` says which in one line."""
    from flows import reference_docs
    from tasks.params import load_params

    source = reference_docs.CONFIG_SOURCE.read_text()
    doc = '"""Number of distinct training problems."""'
    assert doc in source
    reworded = source.replace(doc, '"""How many distinct training problems."""')
    defaults = load_params().to_dict()
    page = reference_docs.config_page(reworded, defaults)
    assert "| `synthetic.num_train` | `800` | How many distinct training problems. |" in page
    assert page != (ROOT / reference_docs.CONFIG_PAGE).read_text()
    committed = (ROOT / reference_docs.CLI_PAGE).read_text()
    pages = {reference_docs.CLI_PAGE: committed, reference_docs.CONFIG_PAGE: page}
    monkeypatch.setattr(reference_docs, "pages", lambda: pages)
    assert reference_docs.main(["--check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "docs/reference/config.md" in err[0] and "cli.md" not in err[0]


def test_a_config_field_without_a_docstring_is_refused():
    from flows import reference_docs
    from tasks.params import load_params

    source = reference_docs.CONFIG_SOURCE.read_text()
    undocumented = source.replace('    """Number of distinct training problems."""\n', "")
    with pytest.raises(SystemExit, match="synthetic.num_train"):
        reference_docs.config_page(undocumented, load_params().to_dict())


# The site.


def _build(config: Path, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(out)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(cmd, cwd=config.parent, env=env, capture_output=True, text=True)


def test_the_site_builds_with_no_broken_link_or_anchor(tmp_path):
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "results" / "index.html").is_file()


def test_a_broken_anchor_fails_the_build(tmp_path):
    """The strict build is a check: a link to an anchor no page has fails it, naming the link."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "index.md").open("a") as f:
        f.write("\n[gone](results.md#no-such-section)\n")
    built = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0 and "#no-such-section" in built.stderr, built.stderr[-3000:]
