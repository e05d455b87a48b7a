"""Keep the notebooks paired, stripped and ready to open.

Problem: every notebook lives twice, as an ``.ipynb`` that users double-click
and as a jupytext py:percent script that reviewers read and edit. The two
drift apart silently (someone edits one side only), executed outputs and
widget state sneak into commits, and an ``.ipynb`` without a kernelspec opens
in JupyterLab behind a blocking "Select Kernel" dialog.

Approach: compare the two files cell by cell through jupytext (type, source
and tags, never the header's version stamp), and inspect the ``.ipynb`` JSON
for outputs, execution counts, widget state and the kernelspec. ``--fix``
repairs what a tool can repair: ``jupytext --sync`` (the newer file wins) and
``nbstripout``. The test suite calls :func:`problems` on every notebook.

Usage::

    python scripts/nbsync.py          # check every notebook in notebooks/, exit 1 listing problems
    python scripts/nbsync.py --fix    # sync pairs and strip outputs, then check
    python scripts/nbsync.py --fix notebooks/04_new.py   # create the .ipynb of a new script
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import jupytext
from jupytext.cli import jupytext as jupytext_cli

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
KERNEL_NAME = "python3"
KERNEL_DISPLAY_NAME = "Python 3 (ipykernel)"
WIDGET_STATE_KEY = "widgets"


def notebook_paths(folder: Path = NOTEBOOK_DIR) -> list[Path]:
    """The ``.ipynb`` path of every notebook in ``folder``, sorted; a script alone counts too."""
    stems = {p.stem for p in folder.glob("*.ipynb")} | {p.stem for p in folder.glob("*.py")}
    return sorted(folder / f"{stem}.ipynb" for stem in stems if not stem.startswith("."))


def script_path(notebook: Path) -> Path:
    """The py:percent script paired with ``notebook``."""
    return notebook.with_suffix(".py")


def _cell_signature(cell) -> tuple[str, str, tuple[str, ...]]:
    return cell.cell_type, cell.source.rstrip(), tuple(cell.metadata.get("tags", ()))


def pair_problems(notebook: Path) -> list[str]:
    """Differences between ``notebook`` and its py:percent script."""
    script = script_path(notebook)
    if not notebook.exists():
        return [f"{script.name}: no {notebook.name} (run: python scripts/nbsync.py --fix {script})"]
    if not script.exists():
        return [f"{notebook.name}: no paired script {script.name} (run: python scripts/nbsync.py --fix)"]
    from_ipynb = jupytext.read(notebook)
    from_script = jupytext.read(script, fmt="py:percent")
    found = []
    if from_script.metadata.get("kernelspec", {}).get("name") != KERNEL_NAME:
        found.append(f"{script.name}: header has no kernelspec {KERNEL_NAME!r} (an .ipynb rebuilt from it "
                     f"would open a 'Select Kernel' dialog)")
    left = [_cell_signature(c) for c in from_ipynb.cells]
    right = [_cell_signature(c) for c in from_script.cells]
    if len(left) != len(right):
        found.append(f"{notebook.name} has {len(left)} cells but {script.name} has {len(right)}")
    for index, (a, b) in enumerate(zip(left, right)):
        if a != b:
            first_line = (a[1].splitlines() or [""])[0][:60]
            found.append(f"{notebook.name}: cell {index} ({a[0]}, starting {first_line!r}) differs from {script.name}")
            break
    return found


def strip_problems(notebook: Path) -> list[str]:
    """Outputs, execution counts, widget state or a missing kernelspec in ``notebook``."""
    if not notebook.exists():
        return []
    data = json.loads(notebook.read_text(encoding="utf-8"))
    found = []
    kernelspec = data.get("metadata", {}).get("kernelspec", {})
    if kernelspec.get("name") != KERNEL_NAME or not kernelspec.get("display_name"):
        found.append(f"{notebook.name}: kernelspec must name {KERNEL_NAME!r} with a display name "
                     f"(e.g. {KERNEL_DISPLAY_NAME!r}), got {kernelspec or 'none'}")
    if WIDGET_STATE_KEY in data.get("metadata", {}):
        found.append(f"{notebook.name}: notebook metadata holds saved widget state ('{WIDGET_STATE_KEY}')")
    for index, cell in enumerate(data.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            found.append(f"{notebook.name}: cell {index} has {len(cell['outputs'])} saved output(s)")
        if cell.get("execution_count") is not None:
            found.append(f"{notebook.name}: cell {index} has execution_count {cell['execution_count']}")
    return found


def problems(notebook: Path) -> list[str]:
    """Everything wrong with ``notebook`` and its pair; empty when clean."""
    return pair_problems(notebook) + strip_problems(notebook)


def fix(notebook: Path) -> None:
    """Sync the pair (the newer file wins, or the script when the .ipynb is missing), set the kernel, strip."""
    source = notebook if notebook.exists() else script_path(notebook)
    jupytext_cli(["--quiet", "--set-kernel", KERNEL_NAME, "--sync", str(source)])
    subprocess.run([sys.executable, "-m", "nbstripout", str(notebook)], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fix", action="store_true", help="sync pairs with jupytext and strip with nbstripout first")
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks or scripts (default: all in notebooks/)")
    args = parser.parse_args(argv)
    paths = [p.with_suffix(".ipynb") for p in args.notebooks] or notebook_paths()
    if args.fix:
        for path in paths:
            fix(path)
    found = [problem for path in paths for problem in problems(path)]
    for problem in found:
        print(problem)
    print(f"{len(paths)} notebook(s) checked, {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
