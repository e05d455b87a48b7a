"""The hardware catalogue: one record per device and link name, presets that resolve, collective links as fields."""

import ast
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from workbench.core import hardware
from workbench.core.costs import ClusterSpec, DeviceSpec, LinkSpec
from workbench.core.hardware import DEVICES, LINKS, PRESETS, ClusterPreset, get_device, get_link, get_preset

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "workbench"
CATALOGUE = PKG / "core" / "hardware.py"


def _spec_literals(path: Path) -> list[tuple[str, str, int]]:
    """(class, name, line) of every ``DeviceSpec(...)`` / ``LinkSpec(...)`` in ``path`` whose name is a literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if func not in ("DeviceSpec", "LinkSpec"):
            continue
        name = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            found.append((func, name.value, node.lineno))
    return found


def test_every_name_is_defined_once_in_the_catalogue_and_nowhere_else_in_the_package():
    literals = _spec_literals(CATALOGUE)
    for kind, table in (("DeviceSpec", DEVICES), ("LinkSpec", LINKS)):
        names = [name for k, name, _ in literals if k == kind]
        assert sorted(names) == sorted(set(names)) == sorted(table), kind  # each once, all in the table
        assert all(record.name == key for key, record in table.items())
    catalogued = set(DEVICES) | set(LINKS) | {"ib-ndr"}  # the InfiniBand NDR link's former second name
    elsewhere = [f"{path.relative_to(ROOT)}:{line}: {kind}({name!r})"
                 for path in sorted(PKG.rglob("*.py")) if path != CATALOGUE
                 for kind, name, line in _spec_literals(path) if name in catalogued]
    assert not elsewhere, "a catalogued device or link is defined again outside core/hardware.py:\n" + \
        "\n".join(elsewhere)


def test_the_catalogue_refuses_a_name_given_twice_and_presets_naming_what_it_lacks():
    with pytest.raises(ValueError, match="LinkSpec 'x' is defined twice"):
        hardware._by_name(LinkSpec("x", 1.0, 1.0), LinkSpec("x", 2.0, 2.0))
    with pytest.raises(ValueError, match="unknown device 'B200'"):
        ClusterPreset("8xB200", 1, 8, "B200", "nvlink4")
    with pytest.raises(ValueError, match="unknown link 'nvlink5'"):
        ClusterPreset("8xH100-next", 1, 8, "H100", "nvlink5")
    with pytest.raises(ValueError, match="unknown cluster preset '9xTPU'"):
        get_preset("9xTPU")
    assert get_device("H100") is DEVICES["H100"] and get_link("nvlink4") is LINKS["nvlink4"]
    spec = DeviceSpec("mine", {"float32": 1.0}, 1, 1.0)
    assert get_device(spec) is spec


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_resolves_with_its_collective_link_as_a_field_of_its_cluster(name):
    from workbench.planning.costs.clusters import get_cluster

    preset = PRESETS[name]
    cluster = preset.cluster()
    assert cluster.name == name and cluster.device is DEVICES[preset.device]
    assert cluster.intra_node is LINKS[preset.intra_node]
    assert cluster.inter_node is (LINKS[preset.inter_node] if preset.inter_node else None)
    assert cluster.collective_link is (LINKS[preset.collective] if preset.collective else None)
    assert cluster.world_size == preset.num_nodes * preset.devices_per_node
    if name != "local":  # local reads this machine's calibration file where there is one
        assert get_cluster(name) == cluster


def test_the_cpu_presets_all_reduce_over_gloo_and_the_gpu_presets_over_their_node_links():
    for name in ("local", "local-cpu"):
        assert PRESETS[name].cluster().collective_link.name == "gloo-allreduce"
    assert all(p.collective is None for p in PRESETS.values() if not p.shared_compute)


def test_shared_gpus_carry_the_collective_link():
    from workbench.planning.costs.clusters import HOST_STAGED_LINK, share_gpus

    assert HOST_STAGED_LINK is LINKS["host-staged"]
    cluster = replace(PRESETS["1xH100"].cluster(), collective_link=LINKS["pcie4"])
    shared = share_gpus(cluster, 2)
    assert shared.intra_node is HOST_STAGED_LINK and shared.collective_link is LINKS["pcie4"]


def test_a_cluster_with_a_collective_link_round_trips_through_json():
    cluster = replace(PRESETS["2x8xH100-IB"].cluster(), collective_link=LinkSpec("nccl-tree", 12.0, 40.0))
    data = json.loads(cluster.to_json())
    assert data["collective_link"] == {"name": "nccl-tree", "latency_us": 12.0, "bandwidth_gbs": 40.0}
    assert ClusterSpec.from_json(cluster.to_json()) == cluster
    assert ClusterSpec.from_dict({**data, "collective_link": None}).collective_link is None
    without = {k: v for k, v in data.items() if k != "collective_link"}  # files written before the field
    assert ClusterSpec.from_dict(without) == replace(cluster, collective_link=None)
    with pytest.raises(ValueError, match=r"collective_link must be a link"):
        ClusterSpec.from_dict({**data, "collective_link": "gloo-allreduce"})
    with pytest.raises(ValueError, match=r"LinkSpec\[slow\].bandwidth_gbs must be > 0"):
        ClusterSpec.from_dict({**data, "collective_link": {"name": "slow", "latency_us": 1.0, "bandwidth_gbs": 0}})


def test_cluster_files_carry_the_collective_link_and_refuse_an_impossible_one(tmp_path):
    from workbench.planning.costs.clusters import load_cluster

    base = PRESETS["8xV100-PCIe"].cluster()
    slow = LinkSpec("slow", 50.0, 0.5)
    path = tmp_path / "cluster.json"
    path.write_text(replace(base, collective_link=slow).to_json())
    assert load_cluster(path).collective_link == slow
    path.write_text(json.dumps({"cluster": base.to_dict(), "collective_link": slow.to_dict()}))  # the wrapped form
    assert load_cluster(path).collective_link == slow
    path.write_text(json.dumps({"cluster": replace(base, collective_link=slow).to_dict(),
                                "collective_link": slow.to_dict()}))
    with pytest.raises(ValueError, match="collective_link is given twice"):
        load_cluster(path)
    for field, value, unit in (("bandwidth_gbs", 1e9, "1e\\+09"), ("latency_us", 1e9, "1e\\+09")):
        path.write_text(json.dumps({**base.to_dict(), "collective_link": {**slow.to_dict(), field: value}}))
        with pytest.raises(ValueError, match=rf"collective_link\.{field} = {unit} is beyond any real machine"):
            load_cluster(path)
    with pytest.raises(ValueError, match=r"collective_link\.bandwidth_gbs = 1e\+09 is beyond any real machine"):
        load_cluster(replace(base, collective_link=LinkSpec("typo", 5.0, 1e9)))


def test_the_local_calibration_file_keeps_the_collective_link(tmp_path, monkeypatch):
    from workbench.planning.costs import clusters

    monkeypatch.setattr(clusters, "LOCAL_CALIBRATION", tmp_path / "local.json")
    clusters.save_local_calibration(LinkSpec("measured-p2p", 50.0, 3.0), LinkSpec("measured-ar", 80.0, 0.9))
    saved = json.loads((tmp_path / "local.json").read_text())
    assert saved["collective_link"]["name"] == "measured-ar"  # a ClusterSpec JSON file like any other
    assert clusters.get_cluster("local").collective_link == LinkSpec("measured-ar", 80.0, 0.9)
    old = {"cluster": {**saved, "collective_link": None}, "collective_link": saved["collective_link"]}
    (tmp_path / "local.json").write_text(json.dumps(old))  # as calibrations were saved before the field
    assert clusters.get_cluster("local").collective_link == LinkSpec("measured-ar", 80.0, 0.9)


def test_the_cluster_file_of_the_planner_docs_loads(tmp_path):
    from workbench.planning.costs.clusters import load_cluster

    text = (ROOT / "docs" / "planner.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    assert blocks, "docs/planner.md shows a cluster file"
    path = tmp_path / "cluster.json"
    path.write_text(blocks[0])
    cluster = load_cluster(path)
    assert cluster.collective_link is not None and cluster.device.name in DEVICES
