"""The field layer (``workbench.core.fields``): one set of checks, declared fields, one to_dict / from_dict."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from workbench.core.fields import (at_least, boolean, check, check_bool, check_choice, check_int, check_number,
                                   check_str, check_tuple, choice, config_error, field_error, from_dict, integer,
                                   is_int, is_number, number, optional, reject_unknown, spec, string, table, to_dict,
                                   tuple_of, validate)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: check_int("warmup", -1, 0), "warmup must be an int >= 0, got -1"),
    (lambda: check_int("steps", True, 1), "steps must be an int >= 1, got True"),
    (lambda: check_int("stages", 0, 1, 16), "stages must be an int from 1 to 16, got 0"),
    (lambda: check_number("ratio", -1, 0, 2.0), "ratio must be a number from 0 to 2.0, got -1"),
    (lambda: check_number("lr", 0.0, 0.0, strict=True), "lr must be a number > 0.0, got 0.0"),
    (lambda: check_number("t", float("nan"), finite=True), "t must be a finite number, got nan"),
    (lambda: check_choice("schedule", "zb", ("gpipe", "1f1b")), "schedule must be one of gpipe, 1f1b; got 'zb'"),
    (lambda: check_bool("flag", 1), "flag must be true or false, got 1"),
    (lambda: check_str("name", "", empty=False), "name must be a non-empty string, got ''"),
    (lambda: check_tuple("ranks", [0, -1], integer(0)), "ranks must be a list of ints >= 0, got [0, -1]"),
    (lambda: check_int("steps", 0, 1, error=config_error),
     "config field 'steps' = 0 is invalid: expected an int >= 1"),
    (lambda: check_choice("precision", "fp8", ("fp32", "bf16"), error=config_error),
     "config field 'precision' = 'fp8' is invalid: valid options are fp32, bf16"),
    (lambda: check_bool("stash", "yes", error=field_error("plan")),
     "plan field 'stash' = 'yes' is invalid: expected true or false"),
    (lambda: check("x", -1, number(finite=True).then(at_least(0))), "x must be >= 0, got -1"),
    (lambda: check("x", "1", number(finite=True).then(at_least(0))), "x must be a finite number, got '1'"),
    (lambda: check("rank", -1, optional(integer(0))), "rank must be None or an int >= 0, got -1"),
])
def test_one_message_form_per_owner_naming_the_field(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == message


def test_checks_return_the_stored_value():
    assert check_int("n", 3, 1) == 3
    assert check_tuple("cols", ["a", "b"], string()) == ("a", "b")
    assert check("rank", None, optional(integer(0))) is None
    assert check("args", {"a": 1}, table()) == {"a": 1}
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(3.5) and is_number(3) and not is_number(False) and not is_number("3")


@dataclass(frozen=True)
class Inner:
    name: str = spec("sgd", choice(("sgd", "adam")))
    lr: float = spec(0.01, number(0.0, strict=True))

    def __post_init__(self) -> None:
        validate(self, "outer.inner.", config_error)


@dataclass(frozen=True)
class Outer:
    steps: int = spec(rule=integer(1))
    columns: tuple[str, ...] = spec((), tuple_of(string()))
    inner: Inner = field(default_factory=Inner)
    enabled: bool = spec(True, boolean())

    def __post_init__(self) -> None:
        validate(self, "outer.", config_error)


def test_validate_checks_every_declared_field_and_stores_conversions():
    value = Outer(steps=3, columns=["a", "b"])
    assert value.columns == ("a", "b")
    with pytest.raises(ValueError, match=r"config field 'outer.steps' = 0 is invalid: expected an int >= 1"):
        Outer(steps=0)
    with pytest.raises(ValueError, match=r"'outer.enabled' = 'no' is invalid: expected true or false"):
        Outer(steps=1, enabled="no")
    with pytest.raises(ValueError, match=r"'outer.inner.lr' = 0 is invalid: expected a number > 0.0"):
        Inner(lr=0)


def test_to_dict_and_from_dict_are_inverse_with_nested_tables_and_lists():
    value = Outer(steps=3, columns=("a", "b"), inner=Inner(name="adam", lr=0.5))
    data = to_dict(value)
    assert data == {"steps": 3, "columns": ["a", "b"], "inner": {"name": "adam", "lr": 0.5}, "enabled": True}
    assert from_dict(Outer, data, "outer.", config_error) == value
    assert from_dict(Outer, {"steps": 2}, "outer.", config_error) == Outer(steps=2)


@pytest.mark.parametrize(("data", "message"), [
    ({"steps": 1, "stepz": 2}, "config field 'outer.stepz' = 2 is invalid: unknown field; valid fields are "
                               "['columns', 'enabled', 'inner', 'steps']"),
    ({"steps": 1, "inner": {"lr": 0.1, "momentun": 0.9}},
     "config field 'outer.inner.momentun' = 0.9 is invalid: unknown field; valid fields are ['lr', 'name']"),
    ({"columns": []}, "config field 'outer.steps' is missing; it is required"),
    ({"steps": 1, "inner": {"name": "lion"}}, "config field 'outer.inner.name' = 'lion' is invalid: valid options "
                                             "are sgd, adam"),
])
def test_from_dict_names_the_unknown_the_missing_and_the_invalid_field(data, message):
    with pytest.raises(ValueError) as info:
        from_dict(Outer, data, "outer.", config_error)
    assert str(info.value) == message


def test_reject_unknown_lists_the_valid_names_in_order_when_asked():
    with pytest.raises(ValueError, match=r"x = 1 is invalid: unknown field; valid fields are \['b', 'a'\]"):
        reject_unknown({"x": 1}, ["b", "a"], ordered=True)
    reject_unknown({"a": 1}, ["a", "b"])


def test_rules_carry_their_json_schema():
    assert integer(1).json_schema == {"type": "integer", "minimum": 1}
    assert number(0, strict=True).json_schema == {"type": "number", "exclusiveMinimum": 0}
    assert number(finite=True).then(at_least(0)).json_schema == {"type": "number", "minimum": 0}
    assert choice(("a", "b")).json_schema == {"enum": ["a", "b"]}
    assert tuple_of(string()).json_schema == {"type": "array", "items": {"type": "string"}}
    assert boolean().json_schema == {"type": "boolean"}


def test_the_field_layer_imports_without_torch():
    code = "import sys, workbench.core.fields; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
