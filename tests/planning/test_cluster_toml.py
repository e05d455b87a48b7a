"""Clusters as TOML files: a file equal to a preset loads to the same cluster, every field checked."""

import json

import pytest

from workbench.core.hardware import PRESETS
from workbench.planning.costs.cluster_toml import CLUSTER_FIELDS, cluster_to_toml
from workbench.planning.costs.clusters import get_cluster, load_cluster

PRESET_TOML = """\
name = "2x8xH100-IB"
num_nodes = 2
devices_per_node = 8
device = "H100"
intra_node = "nvlink4"
inter_node = "infiniband-ndr"
overlap_slowdown = 1.2
"""

FULL_TOML = """\
name = "2x8xH100-IB"
num_nodes = 2
devices_per_node = 8
overlap_slowdown = 1.2
shared_compute = false
collective_call_ms = 0.0

[device]
name = "H100"
peak_tflops = { float32 = 66.9, tfloat32 = 494.7, float16 = 989.4, bfloat16 = 989.4, float8 = 1978.9 }
memory_bytes = 85899345920
memory_bandwidth_gbs = 3350.0
efficiency = 0.5
winograd = { float32 = 2.25 }

[intra_node]
name = "nvlink4"
latency_us = 5.0
bandwidth_gbs = 350.0

[inter_node]
name = "infiniband-ndr"
latency_us = 10.0
bandwidth_gbs = 45.0
"""


def write(tmp_path, text, name="cluster.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text", [PRESET_TOML, FULL_TOML], ids=["by-name", "in-full"])
def test_a_toml_cluster_equal_to_a_preset_loads_to_the_same_cluster(tmp_path, text):
    assert load_cluster(write(tmp_path, text)) == get_cluster("2x8xH100-IB")


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "local"])
def test_every_preset_written_as_toml_loads_back_equal(tmp_path, name):
    cluster = get_cluster(name)
    text = cluster_to_toml(cluster)
    assert "null" not in text and f'name = "{name}"' in text
    assert load_cluster(write(tmp_path, text)) == cluster


def test_a_toml_cluster_of_pods_and_a_collective_link_in_full(tmp_path):
    text = PRESET_TOML.replace('name = "2x8xH100-IB"', 'name = "pods"').replace("num_nodes = 2", "num_nodes = 4") + \
        'nodes_per_pod = 2\ninter_pod = "infiniband-ndr-2to1"\n' \
        '[collective_link]\nname = "measured"\nlatency_us = 40.0\nbandwidth_gbs = 30.0\n'
    cluster = load_cluster(write(tmp_path, text))
    assert cluster.nodes_per_pod == 2 and cluster.link(0, 16).name == "infiniband-ndr-2to1"
    assert cluster.collective_link.bandwidth_gbs == 30.0
    assert json.loads(cluster.to_json())["inter_pod"]["name"] == "infiniband-ndr-2to1"


BAD = [
    ("num_nodes = 2", 'num_nodes = "2"', r"num_nodes must be an int >= 1, got '2'"),
    ("num_nodes = 2", "num_nodes = 0", r"num_nodes must be an int >= 1, got 0"),
    ("devices_per_node = 8", "devices_per_node = true", r"devices_per_node must be an int >= 1, got True"),
    ("overlap_slowdown = 1.2", 'overlap_slowdown = "1.2"', r"overlap_slowdown must be a number >= 0"),
    ("overlap_slowdown = 1.2", "overlap_slowdown = 9", r"overlap_slowdown must be in \[1, 4\]"),
    ("overlap_slowdown = 1.2", "shared_compute = 1", r"shared_compute must be true or false, got 1"),
    ('name = "2x8xH100-IB"', 'name = ""', r"name must be a non-empty string"),
    ('device = "H100"', 'device = "B200"', r"device = 'B200' is no catalogued device; known: V100, "),
    ('device = "H100"', "device = 3", r"device must be the name of a catalogued device or a table of its fields"),
    ('device = "H100"', 'device = { name = "x", peak_tflops = { float32 = 1.0 }, memory_bytes = -1, '
     'memory_bandwidth_gbs = 1.0 }', r"device.memory_bytes must be an int >= 1, got -1"),
    ('device = "H100"', 'device = { name = "x", peak_tflops = { float32 = 0 }, memory_bytes = 1, '
     'memory_bandwidth_gbs = 1.0 }', r"device.peak_tflops must be a table of dtype = number > 0"),
    ('device = "H100"', 'device = { name = "x", peak_tflops = { float32 = 1.0 }, memory_bytes = 1, '
     'memory_bandwidth_gbs = 1.0, efficency = 0.5 }', r"unknown field device.efficency; valid fields: name, "
     r"peak_tflops, memory_bytes, memory_bandwidth_gbs, efficiency, winograd"),
    ('device = "H100"', 'device = { name = "x", peak_tflops = { float32 = 1.0 }, memory_bytes = 1, '
     'memory_bandwidth_gbs = 1.0, efficiency = 2.0 }', r"device: DeviceSpec\[x\].efficiency must be in \(0, 1\]"),
    ('intra_node = "nvlink4"', 'intra_node = { name = "x", latency_us = 1.0 }',
     r"intra_node.bandwidth_gbs is missing \(required: name, latency_us, bandwidth_gbs\)"),
    ('intra_node = "nvlink4"', 'intra_node = { name = "x", latency_us = -1.0, bandwidth_gbs = 5.0 }',
     r"intra_node.latency_us must be a number >= 0, got -1.0"),
    ('inter_node = "infiniband-ndr"', 'inter_node = "ndr"', r"inter_node = 'ndr' is no catalogued link"),
    ('inter_node = "infiniband-ndr"', 'inter_node = { name = "x", latency_us = 1.0, bandwidth_gbs = 1e9 }',
     r"inter_node.bandwidth_gbs = 1e\+09 is beyond any real machine"),
    ('inter_node = "infiniband-ndr"', "", r"has 2 nodes but no inter_node link"),
    ("devices_per_node = 8", "", r"devices_per_node is missing \(required: name, num_nodes, devices_per_node, "),
    ("overlap_slowdown = 1.2", "nodes = 4", "unknown field nodes; valid fields: " + ", ".join(CLUSTER_FIELDS)),
    ("overlap_slowdown = 1.2", 'nodes_per_pod = 3\ninter_pod = "infiniband-ndr-2to1"',
     r"nodes_per_pod must divide num_nodes \(2\), got 3"),
    ("overlap_slowdown = 1.2", "overlap_slowdown 1.2", r"is not valid TOML"),
]


@pytest.mark.parametrize("line, replacement, message", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_toml_fields_are_refused_in_one_line_naming_the_field(tmp_path, line, replacement, message):
    path = write(tmp_path, PRESET_TOML.replace(line, replacement))
    with pytest.raises(ValueError, match=message) as caught:
        load_cluster(path)
    assert str(caught.value).startswith(f"cluster file {str(path)!r}") and "\n" not in str(caught.value)


def test_the_cli_plans_on_a_toml_cluster(tmp_path, capsys):
    from workbench.cli import main
    from workbench.core.costs import ModelCosts

    costs = ModelCosts.uniform(4, forward_ms=1.0, backward_ms=2.0, param_bytes=1 << 20, activation_bytes=1 << 16,
                               batch_size=8).save(tmp_path / "costs.json")
    path = write(tmp_path, PRESET_TOML)
    assert main(["plan", str(costs), "--cluster", str(path), "--batch", "64", "--top", "3", "--world-size", "4"]) == 0
    assert "on 2x8xH100-IB (4 devices)" in capsys.readouterr().out
    bad = write(tmp_path, PRESET_TOML.replace("num_nodes = 2", "num_nodes = 0"), "bad.toml")
    assert main(["plan", str(costs), "--cluster", str(bad), "--batch", "64"]) == 2
    assert "num_nodes must be an int >= 1" in capsys.readouterr().err


def test_the_toml_cluster_of_the_planner_docs_loads(tmp_path):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", text, re.S) if "devices_per_node" in b]
    assert blocks, "docs/planner.md shows a TOML cluster file"
    cluster = load_cluster(write(tmp_path, blocks[0]))
    assert cluster.collective_link.name == "measured-allreduce"
    assert cluster.intra_node == get_cluster("2x8xH100-IB").intra_node
