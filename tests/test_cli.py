import json
import subprocess
import sys

import pytest

from workbench.cli import build_parser, main


def run(*args):
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True, timeout=120)


def test_topology_json(capsys):
    assert main(["topology", "dp=2,pp=2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == 4 and data["groups"]["dp"] == [[0, 2], [1, 3]]


def test_action_text(capsys):
    assert main(["action", "0SEND_F3>1"]) == 0
    assert "'peer': 1" in capsys.readouterr().out


def test_bad_input_exits_nonzero_with_one_line():
    out = run("topology", "dp=0")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "size must be an int >= 1" in lines[0]


def test_unknown_command_is_one_line():
    out = run("no-such-command")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_every_subcommand_takes_json():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert len(sub.choices) >= 3
    for name, p in sub.choices.items():
        flags = {s for a in p._actions for s in a.option_strings}
        assert "--json" in flags, name


def test_info_json(capsys):
    assert main(["info", "--json"]) == 0
    assert "packages" in json.loads(capsys.readouterr().out)


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    return action.choices


def test_every_command_that_builds_a_model_takes_model_args_and_names_strategies_as_plans():
    commands = _subcommands()
    takes_model = {name for name, p in commands.items() if any(a.dest == "model" and not a.option_strings
                                                                for a in p._actions)}
    assert {"profile", "plan"} <= takes_model
    for name in sorted(takes_model):
        assert "--model-arg" in commands[name]._option_string_actions, f"workbench {name} lacks --model-arg"
    for name, p in commands.items():  # one vocabulary: a strategy is a plan name (--plan, --strategies)
        assert not {"--strategy", "--schedule-kind", "--groups"} & set(p._option_string_actions), name
    assert "--plan" in commands["simulate"]._option_string_actions


def test_model_args_parse_json_values_and_refuse_a_missing_value():
    from workbench.cli.model_args import parse_model_args

    assert parse_model_args(["n_layer=4", "tie_word_embeddings=false", "act=gelu"]) == {
        "n_layer": 4, "tie_word_embeddings": False, "act": "gelu"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_model_args(["n_layer"])
