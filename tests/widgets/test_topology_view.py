from workbench.core.topology import Topology
from workbench.widgets.topology_view import TopologyView


def test_changing_the_axis_recolours_the_figure():
    view = TopologyView(Topology(dp=2, tp_row=2, tp_col=2))
    assert [tr.name for tr in view.figure_widget.data] == ["tp_col=0", "tp_col=1"]
    view.color_by.value = "dp"
    assert [tr.name for tr in view.figure_widget.data] == ["dp=0", "dp=1"]
    assert list(view.figure_widget.data[1].text) == ["r4", "r5", "r6", "r7"]
    assert "coloured by dp" in view.figure_widget.layout.title.text
    assert view.figure().data[0].name == "dp=0"
