"""The architecture contract of DESIGN.md, enforced.

1. The torch-free rooms (core, scheduling, planning, jobs, viz) import without
   torch: a fresh interpreter imports every module in them and checks that
   ``torch`` never entered ``sys.modules``.
2. Imports only go downward: every ``workbench.X`` import in a room's source
   (anywhere in the file, lazy ones included) targets a room it may use.
   ``jobs`` never imports ``widgets`` (``Job.monitor`` finds its widget
   through ``jobs.viewers``).
3. No file circles: no two or more modules import each other, directly or
   round a loop, counting lazy imports inside functions (imports of a
   package's ``__init__``, which only re-exports, aside).

A planted fake package checks that the checkers catch what they look for.
"""

import ast
import json
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
}


# The declared exceptions: (file, room) pairs allowed although the room sits above the file's own.
# ``core.plan.ParallelPlan.schedule()`` is the one place a plan becomes a schedule (DESIGN.md), so it calls the
# pure schedule generators and the memory walk, importing them when called; nothing in scheduling imports the plan.
EXCEPTIONS = {("core/plan.py", "scheduling")}


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

    ``from X import name`` yields ``X`` and ``X.name`` (the latter is a module when ``name`` is a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path, pkg).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found += [(t, node.lineno) for t in targets if t.split(".")[0] == pkg.name]
    return found


def upward_imports(pkg: Path, allowed: dict[str, set[str]], exceptions: set[tuple[str, str]] = frozenset()) -> list[str]:
    """``file:line imports pkg.room`` for every import of a room the file's room may not use."""
    out = []
    for room in sorted(allowed):
        for path in sorted((pkg / room).rglob("*.py")):
            rel = path.relative_to(pkg).as_posix()
            for target, line in sorted(set(imported_modules(path, pkg))):
                parts = target.split(".")
                if len(parts) < 2:
                    continue
                to = parts[1]
                if to != room and to in allowed and to not in allowed[room] and (rel, to) not in exceptions:
                    out.append(f"{rel}:{line} imports {pkg.name}.{to}")
    return sorted(set(out))


def file_circles(pkg: Path) -> list[list[str]]:
    """Groups of two or more modules that import each other round a loop (strongly connected components)."""
    files = {_module_name(p, pkg): p for p in pkg.rglob("*.py")}
    modules = {name for name, p in files.items() if p.name != "__init__.py"}
    graph = {m: {t for t, _ in imported_modules(files[m], pkg) if t in modules and t != m} for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
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

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return sorted(circles)


def test_imports_go_downward():
    violations = upward_imports(PKG, ALLOWED, EXCEPTIONS)
    assert not violations, "upward imports:\n" + "\n".join(violations)


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
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    allowed = {"core": set(), "jobs": {"core"}, "widgets": {"core", "jobs"}}
    assert upward_imports(pkg, allowed) == ["core/values.py:3 imports fakewb.widgets",
                                           "jobs/job.py:4 imports fakewb.widgets"]
    assert upward_imports(pkg, allowed, {("core/values.py", "widgets")}) == ["jobs/job.py:4 imports fakewb.widgets"]
    # job <-> tail directly, and job -> view -> job round the lazy import; the package __init__ re-export is no circle
    assert file_circles(pkg) == [["fakewb.jobs.job", "fakewb.jobs.tail", "fakewb.widgets.view"]]


def test_every_room_exists():
    for room in ALLOWED:
        assert (PKG / room / "__init__.py").is_file(), room
