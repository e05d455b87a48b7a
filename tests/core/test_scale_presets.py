"""Presets at the scale of real clusters: sizes their names say, numbers against the datasheets they name, pods."""

import json
import re

import pytest

from workbench.core.costs import ClusterSpec, LinkSpec
from workbench.core.hardware import DEVICES, LINK_DATASHEETS, LINKS, PRESETS, get_preset
from workbench.core.pods import PodClusterSpec, cluster_from_dict, level_link, nodes_link, span_level

GB = 10 ** 9
H100_NODES = (4, 8, 16, 32, 64, 128)
LARGE = [f"{n}x8xH100-IB" for n in H100_NODES] + ["32x8xA100-IB", "4pod-32x8xH100"]

# Public datasheet figures the catalogue cites (per GPU; links per direction).
H100_SXM = {"bfloat16": 989.0, "memory_gb": 80, "memory_bandwidth_gbs": 3350.0}  # H100 SXM5: 989 TFLOP/s, HBM3
A100_SXM = {"bfloat16": 312.0, "memory_gb": 80, "memory_bandwidth_gbs": 2039.0}  # A100 SXM 80GB, HBM2e
RATES = {"nvlink4": 900 / 2, "nvlink3": 600 / 2, "infiniband-ndr": 400 / 8, "infiniband-hdr": 200 / 8}


@pytest.mark.parametrize("name", LARGE)
def test_the_large_presets_resolve_with_the_sizes_their_names_say(name):
    cluster = get_preset(name).cluster()
    pods, per_pod, per_node = re.match(r"(?:(\d+)pod-)?(\d+)x(\d+)x", name).groups()
    nodes, per_node = int(pods or 1) * int(per_pod), int(per_node)
    assert (cluster.num_nodes, cluster.devices_per_node, cluster.world_size) == (nodes, per_node, nodes * per_node)
    assert cluster.device.name == ("A100" if "A100" in name else "H100")
    assert cluster.inter_node is not None and cluster.collective_link is None
    assert cluster.overlap_slowdown == pytest.approx(1.2) and not cluster.shared_compute
    assert max(c.world_size for c in (p.cluster() for p in PRESETS.values())) == 1024


@pytest.mark.parametrize("device, sheet", [("H100", H100_SXM), ("A100", A100_SXM)])
def test_device_numbers_are_the_datasheets(device, sheet):
    spec = DEVICES[device]
    assert spec.tflops("bfloat16") == pytest.approx(sheet["bfloat16"], rel=1e-3)
    assert spec.tflops("float16") == spec.tflops("bfloat16")
    assert sheet["memory_gb"] * GB <= spec.memory_bytes <= sheet["memory_gb"] * 1.075 * GB  # 80 GB, or 80 GiB
    assert spec.memory_bandwidth_gbs == pytest.approx(sheet["memory_bandwidth_gbs"])


def test_links_reach_a_plausible_share_of_their_datasheet_rate():
    for name, (rate, source) in LINK_DATASHEETS.items():
        assert name in LINKS and source
        assert LINKS[name].bandwidth_gbs <= rate, name  # achieved, never above the signalling rate
    for name, rate in RATES.items():
        assert LINK_DATASHEETS[name][0] == pytest.approx(rate)
    used = {link for name in LARGE for preset in [get_preset(name)]
            for link in (preset.intra_node, preset.inter_node, preset.inter_pod) if link}
    assert used == {"nvlink4", "nvlink3", "infiniband-ndr", "infiniband-hdr", "infiniband-ndr-2to1"}
    for name in used:
        assert 0.6 <= LINKS[name].bandwidth_gbs / LINK_DATASHEETS[name][0] <= 0.95, name
        assert 1.0 <= LINKS[name].latency_us <= 50.0, name


def test_the_two_node_preset_the_golden_plans_use_is_unchanged():
    cluster = get_preset("2x8xH100-IB").cluster()
    assert type(cluster) is ClusterSpec and cluster.device is DEVICES["H100"]
    assert (cluster.num_nodes, cluster.devices_per_node, cluster.overlap_slowdown) == (2, 8, 1.2)
    assert cluster.intra_node == LinkSpec("nvlink4", 5.0, 350.0)
    assert cluster.inter_node == LinkSpec("infiniband-ndr", 10.0, 45.0)


def test_a_cluster_of_pods_talks_over_the_link_of_each_level():
    cluster = get_preset("4pod-32x8xH100").cluster()
    assert isinstance(cluster, PodClusterSpec) and (cluster.num_pods, cluster.nodes_per_pod) == (4, 32)
    pod = 32 * 8
    assert cluster.link(0, 7).name == "nvlink4"
    assert cluster.link(0, 8).name == cluster.link(0, pod - 1).name == "infiniband-ndr"
    assert cluster.link(0, pod).name == cluster.link(pod - 1, 3 * pod).name == "infiniband-ndr-2to1"
    assert cluster.group_link(list(range(8))).name == "nvlink4"
    assert cluster.group_link(list(range(0, pod, 8))).name == "infiniband-ndr"
    assert cluster.group_link([0, 8, pod]).name == "infiniband-ndr-2to1"
    assert [span_level(cluster, nodes) for nodes in ([3], [3, 3], [0, 31], [31, 32])] == [0, 0, 1, 2]
    flat = get_preset("128x8xH100-IB").cluster()  # the same machine on a fabric without pods
    assert flat.world_size == cluster.world_size and nodes_link(flat, [0, 127]).name == "infiniband-ndr"
    assert level_link(flat, 2) is flat.inter_node and level_link(get_preset("1xH100").cluster(), 1).name == "nvlink4"


def test_pod_fields_are_checked_and_round_trip_through_json():
    cluster = get_preset("4pod-32x8xH100").cluster()
    data = json.loads(cluster.to_json())
    assert data["nodes_per_pod"] == 32 and data["inter_pod"]["name"] == "infiniband-ndr-2to1"
    assert cluster_from_dict(data) == cluster
    plain = get_preset("2x8xH100-IB").cluster()
    assert type(cluster_from_dict(plain.to_dict())) is ClusterSpec  # files without pods load as they always did
    for value, message in ((0, "nodes_per_pod must be an int >= 1"), (True, "nodes_per_pod must be an int >= 1"),
                           (48, r"nodes_per_pod must divide num_nodes \(128\)")):
        with pytest.raises(ValueError, match=message):
            cluster_from_dict({**data, "nodes_per_pod": value})
    with pytest.raises(ValueError, match="has 4 pods but no inter_pod link"):
        cluster_from_dict({**data, "inter_pod": None})
    with pytest.raises(ValueError, match="inter_pod must be a link"):
        cluster_from_dict({**data, "inter_pod": "infiniband-ndr-2to1"})
    one_pod = cluster_from_dict({**data, "nodes_per_pod": 128, "inter_pod": None})
    assert one_pod.link(0, 1023).name == "infiniband-ndr"
    with pytest.raises(ValueError, match=r"'ClusterSpec.pods' = 4 is invalid: unknown field; valid fields are \['collective_call_ms'"):
        cluster_from_dict({**data, "pods": 4})
