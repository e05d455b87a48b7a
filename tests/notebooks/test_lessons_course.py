"""The lessons read as a course: numbered in order, each with exercises and solutions, terms defined before use.

* The lessons are ``00`` to ``08`` with no gap, and the tour's "Where next"
  table links every other lesson in that order.
* Every lesson links the glossary, and has an "Exercises" section listing at least two exercises and
  at least two code cells tagged ``solution`` after it (the execution tests
  run them, so every solution runs in CI).
* Terms: every row of ``docs/glossary.md``'s table names the lessons that
  teach the term; the first of them uses the word. A lesson numbered before
  it that uses the word anyway (a preview) links to the glossary in the
  cell where the word first appears, so a reader who meets it early finds
  its definition there. The tour previews everything and links the glossary.
* Every code cell of every notebook is at most :data:`MAX_CELL_LINES` lines:
  a cell shows the call that matters, and the tables, sentences and figures
  built from its numbers live in ``workbench/lessons/``.
"""

from __future__ import annotations

import re

import pytest

from notebook_files import REPO_ROOT, read_notebook

NOTEBOOKS = REPO_ROOT / "notebooks"
GLOSSARY = REPO_ROOT / "docs" / "glossary.md"
LESSONS = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
MAX_CELL_LINES = 15


def _cells(name: str):
    return read_notebook(NOTEBOOKS / name).cells


def _markdown(name: str) -> str:
    return "\n".join(c.source for c in _cells(name) if c.cell_type == "markdown")


def test_the_lessons_are_numbered_without_gaps_and_the_tour_links_them_in_order():
    assert [int(name[:2]) for name in LESSONS] == list(range(len(LESSONS))) and len(LESSONS) >= 9
    tour = _markdown(LESSONS[0])
    linked = re.findall(r"\]\((\d\d_[a-z0-9_]+\.ipynb)\)", tour[tour.index("## Where next"):])
    assert linked == LESSONS[1:], linked


@pytest.mark.parametrize("name", LESSONS)
def test_every_lesson_links_the_glossary(name):
    assert "](../docs/glossary.md)" in _markdown(name)


@pytest.mark.parametrize("name", LESSONS)
def test_every_lesson_has_two_exercises_and_their_solutions(name):
    cells = _cells(name)
    heading = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## Exercises" in c.source)
    listed = re.findall(r"^\d\. \*\*", cells[heading].source, re.M)
    solutions = [c for c in cells[heading:] if c.cell_type == "code" and "solution" in c.metadata.get("tags", [])]
    assert len(listed) >= 2, cells[heading].source
    assert len(solutions) >= 2, f"{name}: {len(solutions)} solution cells"


def _glossary_rows() -> list[tuple[str, list[str]]]:
    """(term, lessons that teach it, first first) for each glossary row that links a lesson."""
    rows, table = [], GLOSSARY.read_text().split("\n\n| ", 2)[1]  # the first table (the guide's comes later)
    for line in ("| " + table).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("term", "---"):
            continue
        lessons = re.findall(r"\(\.\./notebooks/(\d\d_[a-z0-9_]+\.ipynb)\)", cells[2])
        if lessons:
            rows.append((cells[0], lessons))
    return rows


def _words(term: str) -> list[str]:
    """The spellings of a glossary term a lesson may use: ``FSDP, ZeRO-3`` is ``FSDP`` or ``ZeRO-3``; a
    parenthesised abbreviation or qualifier is left out (``data parallelism (DP)``: ``data parallelism``)."""
    return [w.strip() for w in re.sub(r"\s*\(.*?\)", "", term).split(",") if w.strip()]


def _uses(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}s?(?![\w-])", text, re.I) is not None  # or its plural


@pytest.mark.parametrize(("term", "lessons"), _glossary_rows(), ids=[row[0] for row in _glossary_rows()])
def test_terms_are_taught_where_the_glossary_says_and_previews_link_the_glossary(term, lessons):
    teacher = lessons[0]
    assert teacher in LESSONS, (term, teacher)
    teacher_text = "\n".join(c.source for c in _cells(teacher))
    assert any(_uses(teacher_text, word) for word in _words(term)), f"{teacher} does not use {term!r}"
    for earlier in LESSONS[1:LESSONS.index(teacher)]:
        cells = [c.source for c in _cells(earlier) if c.cell_type == "markdown"]
        first = next((text for text in cells if any(_uses(text, word) for word in _words(term))), None)
        assert first is None or "glossary.md" in first, (
            f"{earlier} uses {term!r} before {teacher} teaches it, without a link to the glossary where it first "
            f"does:\n{first}")


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_no_code_cell_is_longer_than_fifteen_lines(name):
    long = {index: len(cell.source.splitlines()) for index, cell in enumerate(_cells(name))
            if cell.cell_type == "code" and len(cell.source.splitlines()) > MAX_CELL_LINES}
    assert not long, (f"{name}: code cells over {MAX_CELL_LINES} lines (cell index: lines): {long}; move what builds "
                      "tables, sentences or figures into workbench/lessons/")
