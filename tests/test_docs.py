"""The documentation lives in the repository (docs/): the code cites it as ``docs/<page>.md §N`` and never a file a
user of the repository does not have (the project's old ``methods.md`` / ``evaluation.md`` sheets outside it), and
every section it cites exists — a heading ``## N. `` (section N) or ``### N.M `` (subsection N.M) of that page, the
convention docs/index.md states."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# where code cites the docs: the package, the tests and the benchmark scripts (not the generated *.egg-info)
SOURCES = (ROOT / "src" / "diffattn", ROOT / "tests", ROOT / "benchmarks")
SHEETS = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*)(methods|evaluation)\.md")
CITATION = re.compile(r"docs/([\w-]+)\.md(?: (§\d+(?:\.\d+)?)(?:\s*[–-]\s*(\d+(?:\.\d+)?))?)?")
HEADING = re.compile(r"^(?:## (\d+)\. |### (\d+\.\d+) )", re.MULTILINE)


def _source_files() -> list[Path]:
    files = []
    for top in SOURCES:
        for path in sorted(top.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path == Path(__file__).resolve():
                continue
            try:
                path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # not a text file
            files.append(path)
    return files


def _sections(page: str) -> set[str]:
    text = (DOCS / f"{page}.md").read_text(encoding="utf-8")
    return {major or minor for major, minor in HEADING.findall(text)}


def _cited(first: str, last: str | None) -> list[str]:
    """The section numbers a citation names: ``§2`` → 2; ``§2.3`` → 2.3; ``§2–4`` → 2, 3, 4; ``§4.1–4.3`` → both
    ends; ``§9–10`` → 9, 10."""
    if last is None:
        return [first]
    if "." not in first and "." not in last:
        return [str(n) for n in range(int(first), int(last) + 1)]
    return [first, last]


def test_the_code_cites_only_the_docs_in_the_repository():
    wrong = []
    for path in _source_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in SHEETS.finditer(line):
                if m.group(1) != "docs/":
                    wrong.append(f"{path.relative_to(ROOT)}:{number}: {m.group(0)!r} (cite docs/{m.group(2)}.md §N)")
    assert not wrong, "citations of a methods/evaluation sheet outside docs/:\n" + "\n".join(wrong)


def test_every_cited_section_exists():
    problems, citations = [], 0
    sections: dict[str, set[str] | None] = {}
    for path in _source_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in CITATION.finditer(line):
                page, first, last = m.group(1), m.group(2), m.group(3)
                where = f"{path.relative_to(ROOT)}:{number}: {m.group(0)!r}"
                if page not in sections:
                    sections[page] = _sections(page) if (DOCS / f"{page}.md").is_file() else None
                if sections[page] is None:
                    problems.append(f"{where}: there is no docs/{page}.md")
                    continue
                citations += 1
                if first is None:
                    continue
                missing = [n for n in _cited(first.removeprefix("§"), last) if n not in sections[page]]
                if missing:
                    problems.append(f"{where}: docs/{page}.md has no section {', '.join(missing)}")
    assert not problems, "\n".join(problems)
    assert citations > 0  # the walk found the code's citations at all


def test_the_heading_convention_holds_in_every_page():
    """Every numbered heading of the docs is written as the citations expect, and numbers are not repeated."""
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        numbered = re.findall(r"^#{2,3} \d.*$", text, re.MULTILINE)
        bad = [h for h in numbered if not HEADING.match(h)]
        assert not bad, f"{page.name}: headings not of the form '## N. ' / '### N.M ': {bad}"
        found = [major or minor for major, minor in HEADING.findall(text)]
        assert len(found) == len(set(found)), f"{page.name}: a section number is used twice: {found}"
