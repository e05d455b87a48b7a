import pytest

from workbench.core.costs import ClusterSpec, DeviceSpec, LinkSpec
from workbench.core.topology import Topology
from workbench.viz.topology import tile_positions, topology_figure


def test_one_trace_per_coordinate_value_covering_every_rank():
    t = Topology(dp=2, pp=4)
    fig = topology_figure(t, "pp")
    assert [tr.name for tr in fig.data] == ["pp=0", "pp=1", "pp=2", "pp=3"]
    labels = sorted(txt for tr in fig.data for txt in tr.text)
    assert labels == sorted(f"r{r}" for r in range(8))
    # stage 1 of both pipelines: ranks 1 and 5
    assert list(fig.data[1].text) == ["r1", "r5"]
    assert "dp=1, pp=1" in fig.data[1].hovertext[1]


def test_cluster_rows_are_nodes():
    dev = DeviceSpec("V100", {"float32": 15.7}, 2**35, 900.0)
    cluster = ClusterSpec("2x2", 2, 2, dev, LinkSpec("nvlink", 5, 100), LinkSpec("ib", 10, 12))
    assert tile_positions(Topology(dp=2, pp=2), cluster) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    fig = topology_figure(Topology(dp=2, pp=2), "dp", cluster=cluster)
    assert list(fig.layout.yaxis.ticktext) == ["node 0", "node 1"]


def test_bad_input():
    with pytest.raises(ValueError, match="color_by must be one of"):
        topology_figure(Topology(dp=2), "tp")
    dev = DeviceSpec("V100", {"float32": 15.7}, 2**35, 900.0)
    with pytest.raises(ValueError, match="has 4 devices but the layout has 2"):
        tile_positions(Topology(dp=2), ClusterSpec("1x4", 1, 4, dev, LinkSpec("l", 1, 1)))
