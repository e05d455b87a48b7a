"""The set-up files agree with each other: pyproject, environment.yml, Makefile, CI."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_agrees_with_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "conda-forge" in env["channels"]
    deps = env["dependencies"]
    python = next(d for d in deps if isinstance(d, str) and d.startswith("python"))
    version = python.split("=", 1)[1]
    requires = pyproject()["project"]["requires-python"]
    minimum = re.match(r">=\s*(\d+\.\d+)", requires).group(1)
    assert tuple(map(int, version.split("."))) >= tuple(map(int, minimum.split("."))), (version, requires)
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    extras = set(pyproject()["project"]["optional-dependencies"])
    installs = [p for p in pip_section if p.startswith("-e")]
    assert installs, "environment.yml must install the project itself"
    named = set(re.findall(r"\[([^\]]+)\]", installs[0])[0].split(","))
    assert named <= extras and "dev" in named


def test_torch_pins():
    deps = pyproject()["project"]["dependencies"]
    assert "torch==2.14.1" in deps and "torchvision==0.29.1" in deps


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme


def test_console_script_target_exists():
    target = pyproject()["project"]["scripts"]["workbench"]
    module, func = target.split(":")
    mod = __import__(module, fromlist=[func])
    assert callable(getattr(mod, func))
