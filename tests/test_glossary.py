"""The glossary of docs/architecture.md names real types where they live, one meaning per name.

Every row's names (first column) must be defined in the module the row names (second column,
``workbench/``-relative paths: ``core/plan.py``, or a package ``core/pipelines/``): imported and
found there, and defined there or in that package, not merely re-exported.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_CODE = re.compile(r"`([^`]+)`")


def glossary_rows() -> list[tuple[int, list[str], list[str]]]:
    """(line number, names, module paths) of every row of the Glossary table."""
    rows, inside = [], False
    for number, line in enumerate(ARCHITECTURE.read_text().splitlines(), 1):
        if line.startswith("## "):
            inside = line.strip() == "## Glossary"
            continue
        if not inside or not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in _CELL_SPLIT.split(line.strip().strip("|"))]
        if cells[:2] == ["name", "module"]:
            continue
        rows.append((number, _CODE.findall(cells[0]), _CODE.findall(cells[1])))
    return rows


def module_name(path: str) -> str:
    """``core/plan.py`` -> ``workbench.core.plan``; ``core/pipelines/`` -> ``workbench.core.pipelines``."""
    return "workbench." + path.removesuffix(".py").strip("/").replace("/", ".")


def test_the_glossary_is_found_and_each_name_appears_once():
    rows = glossary_rows()
    assert len(rows) >= 20, f"expected the Glossary table in {ARCHITECTURE}, found {len(rows)} rows"
    names = [name for _, row_names, _ in rows for name in row_names]
    assert not [n for n in set(names) if names.count(n) > 1], "a name is defined twice in the glossary"
    for number, row_names, modules in rows:
        assert row_names and modules, f"architecture.md:{number}: a row needs a `Name` and a `module/path.py`"


def defines(module, name: str) -> bool:
    """Whether ``module`` (or, for a package, one of its modules) defines ``name`` rather than importing it."""
    value = getattr(module, name)
    defined_in = getattr(value, "__module__", None)
    if defined_in is None:  # a constant: no record of where it was made
        return True
    in_package = hasattr(module, "__path__") and defined_in.startswith(module.__name__ + ".")
    return defined_in == module.__name__ or in_package


@pytest.mark.parametrize("number,names,modules", [pytest.param(*row, id=",".join(row[1])) for row in glossary_rows()])
def test_glossary_names_exist_in_the_modules_it_names(number, names, modules):
    imported = {path: importlib.import_module(module_name(path)) for path in modules}
    for name in names:
        homes = [path for path, m in imported.items() if hasattr(m, name)]
        assert homes, f"architecture.md:{number}: `{name}` is not in {', '.join(modules)}"
        assert any(defines(imported[path], name) for path in homes), (
            f"architecture.md:{number}: `{name}` is only re-exported by {', '.join(homes)}; it is defined in "
            f"{getattr(imported[homes[0]], name).__module__}")
