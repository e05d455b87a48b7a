"""The architecture contract of docs/architecture.md (its "Arrows"), enforced.

1. The torch-free rooms (core, scheduling, planning, jobs, viz) import without
   torch: a fresh interpreter imports every module in them and checks that
   ``torch`` never entered ``sys.modules``.
2. Imports only go downward: every ``workbench.X`` import in a room's source
   (anywhere in the file, lazy ones included) targets a room it may use.
   ``jobs`` never imports ``widgets`` (``Job.monitor`` finds its widget
   through ``jobs.viewers``). Inside ``planning`` the same holds between its
   sub-packages (:data:`PLANNING_PARTS`), and every module of the room lives
   in one of them.
3. No file circles: no two or more files import each other, directly or
   round a loop, counting lazy imports inside functions and modules a
   package imports by name (``import_module``). A package ``__init__``'s
   re-exports are aside, but a circle through them is not, nor one through
   an ``__init__`` that defines what its own modules import.

4. Rooms stay readable: no file of the package is longer than
   :data:`MAX_FILE_LINES` lines and no function (method, nested function)
   longer than :data:`MAX_FUNCTION_LINES`, from its ``def`` to its last line;
   :data:`LONG_FUNCTIONS` would name the exceptions, and names none.
5. One way to check a field: the check helpers (an int with a minimum, a
   number, a choice, a bool, unknown keys ...) are defined once, in
   ``core/fields.py``; no other file defines one, nor spells out the "an int
   that is not a bool" test inline.

A planted fake package checks that the checkers catch what they look for.
"""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "workbench"
TORCH_FREE = ("core", "scheduling", "planning", "jobs", "viz")

# room -> rooms it may import (besides itself).
ALLOWED = {
    "core": set(),
    "scheduling": {"core"},
    "planning": {"core", "scheduling"},
    "models": {"core"},
    "profiling": {"core", "models"},
    "runtime": {"core", "scheduling", "planning", "models", "profiling"},
    "viz": {"core", "scheduling", "planning"},
    "widgets": {"core", "scheduling", "planning", "viz", "jobs", "models", "profiling"},
    "jobs": {"core", "scheduling", "planning", "viz"},
    "cli": {"core", "scheduling", "planning", "models", "profiling", "runtime", "jobs", "viz", "widgets"},
    "lessons": {"core", "scheduling", "planning", "models", "profiling", "runtime", "jobs", "viz", "widgets"},
}


# planning's sub-packages -> those each may import (besides itself); the room's __init__ gathers its public names.
PLANNING_PARTS = {
    "partitioning": set(),
    "costs": {"partitioning"},
    "layerwise": {"partitioning", "costs"},
    "strategy": {"partitioning", "costs", "layerwise"},
}


# The declared exceptions: (file, room) pairs allowed although the room sits above the file's own. None: a plan
# becomes its schedule in scheduling.registry, which reads the pipeline kinds core declares.
EXCEPTIONS: set[tuple[str, str]] = set()


MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
# Functions allowed past MAX_FUNCTION_LINES ("workbench/room/file.py::name"), while one is being reworked. None:
# the planner's search, the last, takes typed values and is split into named helpers.
LONG_FUNCTIONS: set[str] = set()


def modules_of(room: str) -> list[str]:
    out = []
    for path in sorted((PKG / room).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(parts))
    return out


def test_torch_free_rooms_never_import_torch():
    modules = [m for room in TORCH_FREE for m in modules_of(room)]
    code = (
        "import importlib, json, sys\n"
        f"mods = {modules!r}\n"
        "bad = []\n"
        "for m in mods:\n"
        "    importlib.import_module(m)\n"
        "    if 'torch' in sys.modules:\n"
        "        bad.append(m); break\n"
        "print(json.dumps({'bad': bad, 'count': len(mods)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["count"] >= 5
    assert result["bad"] == [], f"importing {result['bad']} pulled in torch"


def _module_name(path: Path, pkg: Path) -> str:
    parts = [pkg.name, *path.relative_to(pkg).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, pkg: Path) -> list[tuple[str, int]]:
    """Every module of the package ``path`` imports (absolute or relative, anywhere in the file), with its line.

    ``from X import name`` yields ``X`` and ``X.name`` (the latter is a module when ``name`` is a submodule).
    ``import_module("X")`` yields ``X``; ``import_module(f"{__name__}.{...}")``, which a package uses to
    discover or dispatch to its own modules by name, yields ``<this package>.*``: any of them."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path, pkg)
    package = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            targets = [_import_module_target(node.args[0], here)]
        else:
            continue
        found += [(t, node.lineno) for t in targets if t and t.split(".")[0] == pkg.name]
    return found


def _is_import_module(func: ast.expr) -> bool:
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name.endswith("import_module")


def _import_module_target(arg: ast.expr, here: str) -> str:
    """The module a literal name stands for, ``here.*`` for ``f"{__name__}.{...}"``, else "" (not knowable)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and len(arg.values) >= 2:
        head, dot = arg.values[:2]
        if isinstance(head, ast.FormattedValue) and isinstance(head.value, ast.Name) and head.value.id == "__name__" \
                and isinstance(dot, ast.Constant) and str(dot.value).startswith("."):
            return f"{here}.*"
    return ""


def reexport_statements(init: Path) -> list[ast.ImportFrom]:
    """The ``from .module import name`` lines at the top of a package ``__init__``: its re-exports."""
    body = ast.parse(init.read_text()).body
    return [n for n in body if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module]


def upward_imports(pkg: Path, allowed: dict[str, set[str]], exceptions: set[tuple[str, str]] = frozenset(),
                   within: str = "") -> list[str]:
    """``file:line imports pkg.room`` for every import of a room the file's room may not use.

    ``within`` a room's name: ``allowed`` maps that room's sub-packages instead (``pkg.room.part``)."""
    prefix = [pkg.name, *within.split(".")] if within else [pkg.name]
    out = []
    for room in sorted(allowed):
        for path in sorted(pkg.joinpath(*prefix[1:], room).rglob("*.py")):
            rel = path.relative_to(pkg).as_posix()
            for target, line in sorted(set(imported_modules(path, pkg))):
                parts = target.split(".")
                if len(parts) <= len(prefix) or parts[:len(prefix)] != prefix:
                    continue
                to = parts[len(prefix)]
                if to != room and to in allowed and to not in allowed[room] and (rel, to) not in exceptions:
                    out.append(f"{rel}:{line} imports {'.'.join(prefix)}.{to}")
    return sorted(set(out))


def circles_in(allowed: dict[str, set[str]]) -> list[str]:
    """Rooms that may import each other round a loop in an ``allowed`` table (its arrows must only go down)."""
    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(r == goal or (r not in seen and reaches(r, goal, seen | {r})) for r in allowed.get(start, ()))

    return sorted(room for room in allowed if reaches(room, room, set()))


def import_graph(pkg: Path) -> dict[str, set[str]]:
    """File -> the files it imports, a package ``__init__`` being a file like any other.

    An ``__init__``'s re-export lines are no edges: they only gather the package's names, so a module
    importing from its own package is no circle. A name taken from a package resolves to the module it is
    re-exported from, so a circle through re-exports still is one, and whatever else an ``__init__``
    imports (lazily in a function, or by name to dispatch) counts like any module's imports."""
    files = {_module_name(p, pkg): p for p in pkg.rglob("*.py")}
    inits = {name: p for name, p in files.items() if p.name == "__init__.py"}
    reexports = {name: {a.asname or a.name: (f"{name}.{n.module}", a.name)
                        for n in reexport_statements(p) for a in n.names} for name, p in inits.items()}

    def resolve(target: str) -> set[str]:
        if target.endswith(".*"):  # any module of the package but __main__, which runs a program when imported
            return {f for f in files if f.rpartition(".")[0] == target[:-2] and not f.endswith(".__main__")}
        if target in files:
            return {target}
        package, _, name = target.rpartition(".")
        if name in reexports.get(package, {}):
            source, original = reexports[package][name]
            return resolve(f"{source}.{original}") or resolve(source)
        return set()

    graph = {}
    for name, path in files.items():
        skip = {n.lineno for n in reexport_statements(path)} if name in inits else set()
        graph[name] = {f for t, line in imported_modules(path, pkg) if line not in skip for f in resolve(t)} - {name}
    return graph


def file_circles(pkg: Path) -> list[list[str]]:
    """Groups of two or more files that import each other round a loop (strongly connected components)."""
    graph = import_graph(pkg)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circles)


def test_imports_go_downward():
    violations = upward_imports(PKG, ALLOWED, EXCEPTIONS)
    assert not violations, "upward imports:\n" + "\n".join(violations)


def test_planning_parts_import_only_downward():
    violations = upward_imports(PKG, PLANNING_PARTS, within="planning")
    assert not violations, "upward imports between planning's sub-packages:\n" + "\n".join(violations)


def test_every_planning_module_lives_in_a_part():
    loose = [p.name for p in (PKG / "planning").glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"planning/{loose[0]} belongs in one of the sub-packages {sorted(PLANNING_PARTS)}"
    parts = {p.name for p in (PKG / "planning").iterdir() if (p / "__init__.py").is_file()}
    assert parts == set(PLANNING_PARTS), f"planning's sub-packages {sorted(parts)} are not {sorted(PLANNING_PARTS)}"


def test_the_allowed_tables_only_point_down():
    assert circles_in(ALLOWED) == [] and circles_in(PLANNING_PARTS) == []
    assert circles_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c"]


def test_the_declared_exceptions_are_still_needed():
    for file, room in EXCEPTIONS:
        assert any(v.startswith(file + ":") and v.endswith(f".{room}") for v in upward_imports(PKG, ALLOWED)), \
            f"{file} no longer imports {room}: drop the exception"


def test_no_file_circles():
    circles = file_circles(PKG)
    assert circles == [], "modules that import each other: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_checkers_catch_a_planted_circle_and_an_upward_import(tmp_path):
    pkg = tmp_path / "fakewb"
    files = {
        "__init__.py": "from .core.values import Value\n",
        "core/__init__.py": "",
        "core/values.py": "class Value:\n    def show(self):\n        from ..widgets.view import View\n",
        "jobs/__init__.py": "",
        "jobs/job.py": "from .tail import follow\n\ndef run():\n    from ..widgets.view import View\n",
        "jobs/tail.py": "def follow():\n    from . import job\n",
        "widgets/__init__.py": "",
        "widgets/view.py": "from fakewb.jobs.job import run\n\nclass View:\n    pass\n",
        # the package picks a backend by name, a backend takes a shared value from the package
        "jobs/backends/__init__.py": "class State:\n    pass\n\ndef get():\n    from .local import Local\n",
        "jobs/backends/local.py": "from . import State\n\nclass Local:\n    pass\n",
        # data and zoo import each other only through names the package re-exports
        "models/__init__.py": "from .data import batch\nfrom .zoo import build\n",
        "models/data.py": "def batch():\n    from . import build\n",
        "models/zoo.py": "from . import batch\n\ndef build():\n    pass\n",
        # the package discovers its commands by name, and they take a value from the package
        "cli/__init__.py": ("from importlib import import_module\n\nclass Result:\n    pass\n\n"
                            "def main():\n    import_module(f\"{__name__}.{'run'}\")\n"),
        "cli/__main__.py": "from . import main\n",
        "cli/run.py": "from . import Result\n",
        # planning's parts: low may not import high, and an absolute import counts like a relative one
        "planning/__init__.py": "from .high.top import plan\n",
        "planning/low/__init__.py": "",
        "planning/low/base.py": "def cost():\n    from ..high.top import plan\n",
        "planning/low/other.py": "import fakewb.planning.high.top\n",
        "planning/high/__init__.py": "",
        "planning/high/top.py": "from ..low.base import cost\n\ndef plan():\n    pass\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    allowed = {"core": set(), "jobs": {"core"}, "widgets": {"core", "jobs"}}
    assert upward_imports(pkg, allowed) == ["core/values.py:3 imports fakewb.widgets",
                                           "jobs/job.py:4 imports fakewb.widgets"]
    assert upward_imports(pkg, allowed, {("core/values.py", "widgets")}) == ["jobs/job.py:4 imports fakewb.widgets"]
    assert upward_imports(pkg, {"low": set(), "high": {"low"}}, within="planning") == [
        "planning/low/base.py:2 imports fakewb.planning.high", "planning/low/other.py:1 imports fakewb.planning.high"]
    # job <-> tail directly, and job -> view -> job round the lazy import; an __init__'s re-exports are no
    # circle (models: __init__ -> data -> __init__), but a circle through them is, and so is one through the
    # lazy or by-name imports of an __init__ that does more than re-export (cli's __main__ is not discovered)
    assert file_circles(pkg) == [["fakewb.cli", "fakewb.cli.run"],
                                 ["fakewb.jobs.backends", "fakewb.jobs.backends.local"],
                                 ["fakewb.jobs.job", "fakewb.jobs.tail", "fakewb.widgets.view"],
                                 ["fakewb.models.data", "fakewb.models.zoo"],
                                 ["fakewb.planning.high.top", "fakewb.planning.low.base"]]


def oversized(pkg: Path, max_file_lines: int = MAX_FILE_LINES,
              max_function_lines: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``path`` or ``path::Qualified.name`` -> its length in lines, for every file and function over the limits.

    Paths are relative to the package's parent (``workbench/core/plan.py``); a function's length runs from its
    ``def`` line to its last line, so a method or nested function counts inside its enclosing one too."""
    out: dict[str, int] = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > max_file_lines:
            out[rel] = len(text.splitlines())

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    length = child.end_lineno - child.lineno + 1
                    if not isinstance(child, ast.ClassDef) and length > max_function_lines:
                        out[f"{rel}::{name}"] = length
                    visit(child, f"{name}.")
                else:
                    visit(child, prefix)

        visit(ast.parse(text, filename=str(path)), "")
    return out


def test_files_and_functions_stay_short():
    found = oversized(PKG)
    over = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert not over, (f"over {MAX_FILE_LINES} lines per file or {MAX_FUNCTION_LINES} per function (split them by "
                      "topic, or into named helpers):\n" + "\n".join(f"{k}: {v}" for k, v in sorted(over.items())))


def test_the_long_function_exceptions_are_still_needed():
    found = oversized(PKG)
    for name in sorted(LONG_FUNCTIONS):
        assert name in found, f"{name} is no longer over {MAX_FUNCTION_LINES} lines (or is gone): drop the exception"


def test_the_size_checker_catches_long_files_and_functions(tmp_path):
    pkg = tmp_path / "fakewb"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    body = "".join(f"    x{i} = {i}\n" for i in range(5))
    (pkg / "core" / "short.py").write_text(f"def fine():\n{body}")
    (pkg / "core" / "long.py").write_text(
        "class Box:\n"
        f"    def method(self):\n{body.replace('    ', '        ')}"
        "        def inner():\n            return 1\n"
        "\n\nasync def top():\n    pass\n" + "# padding\n" * 3)
    assert oversized(pkg, max_file_lines=12, max_function_lines=6) == {
        "fakewb/core/long.py": 16, "fakewb/core/long.py::Box.method": 8}
    assert oversized(pkg, max_file_lines=16, max_function_lines=1) == {
        "fakewb/core/long.py::Box.method": 8, "fakewb/core/long.py::Box.method.inner": 2,
        "fakewb/core/long.py::top": 2, "fakewb/core/short.py::fine": 6}


def test_every_room_exists():
    for room in ALLOWED:
        assert (PKG / room / "__init__.py").is_file(), room
    for part in PLANNING_PARTS:
        assert (PKG / "planning" / part / "__init__.py").is_file(), f"planning/{part}"


# 5. -- one way to check a field ---------------------------------------------------------------------------------------

FIELDS_MODULE = "core/fields.py"
# a helper that checks one value's type or range, or refuses unknown keys, by the names the package used for them
CHECK_HELPER = re.compile(r"^[ \t]*def (_?check_(int|number|float|choice|bool|str|string|tuple|positive|index)"
                          r"|_?positive_int|_?int_at_least|_?is_int|_?is_number|_?reject_unknown)\(", re.M)
# "an int that is not a bool", spelled out: fields.is_int / integer() / check_int say it once
INLINE_INT = re.compile(r"isinstance\([^()]*,\s*bool\)[\s\\]*or[\s\\]+not[\s\\]+isinstance\("
                        r"|isinstance\([^()]*,\s*(int|\(int,\s*float\))\)[\s\\]*and[\s\\]+not[\s\\]+"
                        r"isinstance\([^()]*,\s*bool\)"
                        r"|not[\s\\]+isinstance\([^()]*,\s*bool\)[\s\\]*and[\s\\]+isinstance\([^()]*,\s*"
                        r"(int|\(int,\s*float\))\)")


def duplicated_checks(pkg: Path) -> list[str]:
    """``path:line what`` for every check helper defined, or int-not-bool test spelled out, outside core/fields.py."""
    out = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if rel == FIELDS_MODULE:
            continue
        text = path.read_text()
        for pattern, what in ((CHECK_HELPER, "defines a check helper"), (INLINE_INT, "spells out an int check")):
            for m in pattern.finditer(text):
                code = " ".join(m.group(0).replace("\\", " ").split())
                out.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1} {what}: {code}")
    return out


def test_each_check_helper_has_one_definition():
    found = duplicated_checks(PKG)
    assert not found, ("check fields with workbench.core.fields (check_int, check_number, check_choice, check_bool, "
                       "is_int, spec/validate, reject_unknown) instead of defining them again:\n" + "\n".join(found))
    assert (PKG / FIELDS_MODULE).is_file()


def test_the_check_scanner_catches_a_planted_helper_and_an_inline_check(tmp_path):
    pkg = tmp_path / "fakewb"
    (pkg / "core").mkdir(parents=True)
    (pkg / "core" / "fields.py").write_text("def check_int(name, value, minimum):\n"
                                            "    return isinstance(value, bool) or not isinstance(value, int)\n")
    (pkg / "core" / "tables.py").write_text("def _check_int(name, value, minimum):\n    pass\n\n\n"
                                            "def _check_heads(plan):\n    pass\n")
    (pkg / "widget.py").write_text("def f(n):\n    if isinstance(n, bool) or \\\n            not isinstance(n, int):\n"
                                   "        raise ValueError(n)\n    return isinstance(n, (int, float)) and not "
                                   "isinstance(n, bool)\n\n\ndef _is_int(v):\n"
                                   "    return not isinstance(v, bool) and isinstance(v, int)\n")
    assert duplicated_checks(pkg) == [
        "core/tables.py:1 defines a check helper: def _check_int(",
        "widget.py:8 defines a check helper: def _is_int(",
        "widget.py:2 spells out an int check: isinstance(n, bool) or not isinstance(",
        "widget.py:5 spells out an int check: isinstance(n, (int, float)) and not isinstance(n, bool)",
        "widget.py:9 spells out an int check: not isinstance(v, bool) and isinstance(v, int)"]
