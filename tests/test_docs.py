"""Every document the code cites is in the repository, and every section of the design document
it cites exists (a newcomer can follow each reference)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("dapo_core", "tasks", "flows", "bench")
# A document by path, or one of the root's (README.md): not a file a run writes (ablation.md).
CITED = re.compile(r"\b((?:[\w.-]+/)+[\w.-]+\.md|[A-Z][A-Z_]*\.md)\b")
SECTION = re.compile(r"docs/design\.md,?\s+section\s+(\d+)")


def _sources() -> list[Path]:
    return [p for folder in CODE for p in sorted((ROOT / folder).rglob("*.py"))]


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


def test_the_citation_patterns_read_what_they_should():
    text = "see DESIGN.md section 2, docs/x.md and the run's ablation.md"
    assert CITED.findall(text) == ["DESIGN.md", "docs/x.md"]
    assert SECTION.findall("docs/design.md section 4 and docs/design.md, section 12") == ["4", "12"]
