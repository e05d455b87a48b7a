"""Which packages the GPU tier and ``bench/bench_gpu.py`` import, and which of them this Python lacks.

Problem: the lent GPU machines have no internet and an image with torch and a
handful of packages, not the project's full dependency list (no plotly,
JupyterLab, Playwright, ...). ``scripts/gpu_check.sh`` must install what the
GPU tier and the benchmark really need there, and nothing else (above all
not torch), and ``scripts/gpu_wheels.sh`` must know which wheels to bring.
A hand-kept list goes stale whenever a test of the tier changes.

Approach: import what the tier and the benchmark load, in this process: the
workbench modules a run uses, the modules the runs import lazily (found by
running the tier's launches and ``bench_gpu.py --smoke`` with every other
package blocked), pytest and its timeout plugin, the benchmark, and every
test file under ``tests/`` that carries the ``gpu`` mark with its conftest
chain. A module that fails with ModuleNotFoundError names a missing package.
``--image`` simulates the GPU image on a full environment: packages outside
the image's stated list and its dependencies (read from this environment's
metadata) are blocked, blocked imports that were caught are reported as
optional, and the wheels to bring are the missing packages with their
dependencies outside the image, pinned to the versions installed here.

    python scripts/gpu_imports.py [--image] [--json]   # report
    python scripts/gpu_imports.py --missing            # one distribution per line (gpu_check.sh)
    python scripts/gpu_imports.py --wheels --image     # name==version per line (gpu_wheels.sh)
    python scripts/gpu_imports.py --tier-files         # the test files of the gpu tier
    python scripts/gpu_imports.py --write-metadata DIR # workbench's dist-info (entry points) for a PYTHONPATH run
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKBENCH_MODULES = ("workbench", "workbench.jobs", "workbench.runtime.entry", "workbench.profiling")
# imported lazily by the runs and the tests: GPT-2/BERT builders, ResNet/VGG, the digits task, the profiler's
# progress bar, and the job monitor (Job.monitor, tests/gpu/test_monitor_cuda.py), whose plotly FigureWidget
# needs anywidget (imported only when the widget is built)
RUNTIME_MODULES = ("transformers", "torchvision", "sklearn.datasets", "tqdm.auto", "psutil",
                   "workbench.widgets.job_monitor", "anywidget")
# @pytest.mark.timeout under --strict-markers needs the plugin; gpu_check.sh runs the tier on xdist workers
PYTEST_MODULES = ("pytest", "pytest_timeout", "xdist")
# the packages the lent GPU image is stated to have (their dependencies come with them)
IMAGE_PACKAGES = ("torch", "torchvision", "transformers", "numpy", "pandas", "psutil", "tqdm", "pytest",
                  "pytest-timeout", "hypothesis", "pyyaml", "scikit-learn", "tensorboard", "pip", "setuptools")
# import name -> distribution where they differ
DISTRIBUTIONS = {"sklearn": "scikit-learn", "yaml": "pyyaml", "PIL": "pillow", "pytest_timeout": "pytest-timeout", "xdist": "pytest-xdist",
                 "dateutil": "python-dateutil", "google": "protobuf"}
NEVER_INSTALL = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")
GPU_MARK = re.compile(r"\bpytest\.mark\.gpu\b")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def tier_files(root: Path = ROOT) -> list[Path]:
    """The test files under ``tests/`` that mark tests ``gpu``: the tier without collecting the whole suite,
    whose notebook and widget test modules import packages the GPU image lacks (nbclient, jupytext, ...)."""
    return sorted(p for p in (root / "tests").rglob("test_*.py") if GPU_MARK.search(p.read_text(errors="replace")))


def conftest_chain(path: Path, root: Path = ROOT) -> list[Path]:
    """``conftest.py`` files from ``tests/`` down to ``path``'s folder, outermost first."""
    chain, folder = [], path.parent
    while folder == root / "tests" or root / "tests" in folder.parents:
        chain.append(folder / "conftest.py")
        folder = folder.parent
    return [p for p in reversed(chain) if p.is_file()]


def dependency_closure(names: list[str], stop: set[str] = frozenset()) -> set[str]:
    """``names`` and their requirements (no extras), transitively, from this environment's metadata."""
    from packaging.requirements import Requirement

    seen, todo = set(), [normalise(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen or name in stop:
            continue
        seen.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(normalise(req.name))
    return seen


class ImageBlocker:
    """A meta-path finder refusing top-level modules whose distribution is not in ``allowed``."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed | {"workbench"}
        self.owners = metadata.packages_distributions()
        self.blocked: set[str] = set()

    def find_spec(self, name: str, path=None, target=None):
        top = name.split(".")[0]
        owners = self.owners.get(top)
        if not owners or any(normalise(d) in self.allowed for d in owners):
            return None
        self.blocked.add(top)
        raise ModuleNotFoundError(f"No module named {top!r} (blocked: not on the GPU image)", name=top)

    def allow(self, top: str) -> bool:
        """Let ``top``'s distribution through from now on (as if installed); False if it was not blocked."""
        if top not in self.blocked:
            return False
        self.allowed |= {normalise(d) for d in self.owners.get(top, [])}
        return True


def import_targets(root: Path = ROOT) -> list[tuple[str, Path | None]]:
    """(module name or file, None or the file) of everything the tier and the benchmark load, in order."""
    targets: list[tuple[str, Path | None]] = [(m, None) for m in WORKBENCH_MODULES + RUNTIME_MODULES + PYTEST_MODULES]
    files = []
    for test in tier_files(root):
        files += [c for c in conftest_chain(test, root) if c not in files] + [test]
    files.append(root / "bench" / "bench_gpu.py")
    return targets + [(str(f.relative_to(root)), f) for f in files]


def load(name: str, file: Path | None, index: int) -> None:
    if file is None:
        importlib.import_module(name)
        return
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))  # pytest's rootdir-less import mode; the benchmark's own folder
    spec = importlib.util.spec_from_file_location(f"_gpu_imports_{index}_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def distribution_of(module: str, owners: dict[str, list[str]]) -> str:
    return normalise(DISTRIBUTIONS.get(module) or (owners.get(module) or [module])[0])


def version_of(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check(root: Path = ROOT, blocker: ImageBlocker | None = None) -> dict:
    """Import every target; the missing modules (with the target that needed them) and what was imported."""
    if blocker is not None:
        sys.meta_path.insert(0, blocker)
    before = set(sys.modules)
    missing: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    for index, (name, file) in enumerate(import_targets(root)):
        for _attempt in range(100):  # with the blocker, each retry lets one more missing package through
            loaded = set(sys.modules)
            try:
                load(name, file, index)
            except ModuleNotFoundError as exc:
                for partial in set(sys.modules) - loaded:  # what the failed attempt left behind is imported again
                    del sys.modules[partial]
                top = (exc.name or "?").split(".")[0]
                if top in ("workbench", "?") or (file is not None and top == file.stem):
                    failed[name] = f"{type(exc).__name__}: {exc}"
                    break
                missing.setdefault(top, []).append(name)
                if blocker is None or not blocker.allow(top):
                    break
                continue
            except Exception as exc:  # noqa: BLE001 - anything else a module raises on import is reported as is
                failed[name] = f"{type(exc).__name__}: {exc}"[:500]
            break
    if blocker is not None:
        sys.meta_path.remove(blocker)
    owners = metadata.packages_distributions()
    imported = sorted({normalise(d) for m in set(sys.modules) - before for d in owners.get(m.split(".")[0], [])})
    report = {"python": sys.version.split()[0], "tier_files": [str(p.relative_to(root)) for p in tier_files(root)],
              "imported": {d: version_of(d) for d in imported},
              "missing": [{"module": m, "distribution": distribution_of(m, owners), "needed_by": by}
                          for m, by in sorted(missing.items())],
              "failed": failed}
    if blocker is not None:
        report["blocked_optional"] = sorted(blocker.blocked - set(missing))
    return report


def wheels(report: dict, image: set[str]) -> list[str]:
    """``name==version`` of the missing distributions and their requirements outside the image (never torch)."""
    needed = dependency_closure([m["distribution"] for m in report["missing"]], stop=image)
    specs = []
    for name in sorted(needed):
        if NEVER_INSTALL.match(name):
            continue
        version = version_of(name)
        specs.append(f"{name}=={version}" if version else name)
    return specs


def write_metadata(folder: Path, root: Path = ROOT) -> Path:
    """A minimal ``workbench-<version>.dist-info`` (name, version, entry points) from ``pyproject.toml``.

    A checkout on PYTHONPATH has no installed metadata, so ``importlib.metadata`` would find none of the
    entry points the package declares (``Job.monitor`` finds its widget through one); this folder on
    ``sys.path`` supplies them.
    """
    import tomllib

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    info = folder / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items()) + "\n"
        for group, points in groups.items() if points))
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="store_true", help="block every package the GPU image does not have")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="the whole report as JSON")
    mode.add_argument("--missing", action="store_true", help="the missing distributions, one per line")
    mode.add_argument("--wheels", action="store_true", help="name==version of the wheels to bring, one per line")
    mode.add_argument("--tier-files", action="store_true", help="the gpu tier's test files, one per line")
    mode.add_argument("--write-metadata", type=Path, metavar="DIR", help="write workbench's dist-info into DIR")
    args = parser.parse_args(argv)
    if args.write_metadata:
        print(write_metadata(args.write_metadata))
        return 0
    if args.tier_files:
        print("\n".join(str(p.relative_to(ROOT)) for p in tier_files()))
        return 0
    sys.path.append(str(ROOT))  # an installed workbench comes first; a bare checkout still imports
    image = dependency_closure(list(IMAGE_PACKAGES)) if args.image else set()
    report = check(ROOT, ImageBlocker(image) if args.image else None)
    if args.missing:
        print("\n".join(m["distribution"] for m in report["missing"] if not NEVER_INSTALL.match(m["distribution"])))
    elif args.wheels:
        print("\n".join(wheels(report, image)))
    elif args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"python {report['python']}; gpu tier: {', '.join(report['tier_files'])}")
        print("imported:", ", ".join(f"{d}=={v}" for d, v in report["imported"].items()))
        for entry in report["missing"]:
            print(f"MISSING {entry['distribution']} (module {entry['module']}, for {', '.join(entry['needed_by'])})")
        for name, error in report["failed"].items():
            print(f"FAILED {name}: {error}")
        if args.image:
            print("blocked but optional:", ", ".join(report["blocked_optional"]) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
