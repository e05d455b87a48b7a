"""The run config's JSON Schema (``workbench schema``) accepts every shipped and documented config."""

import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest

from workbench.cli import main
from workbench.core.config import RunConfig
from workbench.core.schema import run_config_schema

ROOT = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(run_config_schema())


def _errors(data: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(data)]


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(run_config_schema())


@pytest.mark.parametrize("path", sorted((ROOT / "launch").glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_config_validates(path):
    data = tomllib.loads(path.read_text())
    assert _errors(data) == []
    RunConfig.from_dict({k: v for k, v in data.items() if k != "launch"})  # and loads


def _documented_configs():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```toml\n(.*?)```", page.read_text(), flags=re.S):
            data = tomllib.loads(block)
            if "model" in data and "plan" in data:
                yield pytest.param(data, id=f"{page.name}-{data.get('name', data['model'])}")


@pytest.mark.parametrize("data", list(_documented_configs()))
def test_every_documented_run_config_validates(data):
    assert _errors(data) == []


def test_written_configs_validate_with_every_field():
    config = RunConfig.from_dict({"model": "gpt2-tiny", "plan": "pp2-1f1b-m4-tp1d2-L[0=fsdp;1-3=ddp.rc]",
                                  "training": {"global_batch": 16}, "data": {"kind": "bytes-lm", "seq_len": 16}})
    assert _errors(json.loads(json.dumps(config.to_dict()))) == []
    assert _errors(tomllib.loads(config.to_toml())) == []


@pytest.mark.parametrize(("change", "where"), [
    ({"stepz": 3}, ""), ({"training": {"precision": "fp8"}}, "training/precision"),
    ({"training": {"optimizer": {"name": "lion"}}}, "training/optimizer/name"),
    ({"training": {"steps": "ten"}}, "training/steps"), ({"training": {"stepz": 3}}, "training"),
    ({"evaluation": {"every": -1}}, "evaluation/every"), ({"run": {"device": "tpu"}}, "run/device"),
    ({"model": {"name": "mlp", "overrides": []}}, "model"), ({"steps": "ten"}, "steps"),
    ({"plan": {"mesh": {"dp": 2, "qq": 2}}}, "plan"),
    ({"plan": {"mesh": {"pp": 2}, "pipeline": {"kind": "1f1b", "chunks": 2}}}, "plan"),
    ({"data": {"kind": "digits", "shuffle": True}}, "data"),
])
def test_what_the_config_refuses_the_schema_flags(change, where):
    data = {"model": "mlp", "plan": "dp2", **change}
    errors = _errors(data)
    assert errors and errors[0].startswith(where), errors
    with pytest.raises(ValueError):
        RunConfig.from_dict(data)


def test_workbench_schema_prints_and_writes_it(tmp_path, capsys):
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == run_config_schema()
    assert main(["schema", "--out", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["title"] == "workbench run config"


def test_the_earlier_flat_keys_validate_as_deprecated_and_load_into_their_tables():
    flat = {"model": "mlp", "plan": "dp2", "steps": 3, "global_batch": 8, "eval_every": 2, "run_dir": "x"}
    assert _errors(flat) == []
    schema = run_config_schema()["properties"]
    assert schema["steps"]["deprecated"] and "[training] steps" in schema["steps"]["description"]
    assert RunConfig.from_dict(flat) == RunConfig.from_dict({"model": "mlp", "plan": "dp2", "run": {"dir": "x"},
                                                             "training": {"steps": 3, "global_batch": 8},
                                                             "evaluation": {"every": 2}})
