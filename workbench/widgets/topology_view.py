"""TopologyView: the rank grid of a layout, recoloured by the axis you pick.

A dropdown chooses the axis (data-parallel group, pipeline stage, tensor
row or column); the tiles recolour in place. ``figure()`` returns the same
picture as a static ``go.Figure`` for places with no widget frontend.
"""

from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go

from ..core.costs import ClusterSpec
from ..core.topology import Topology
from ..viz.topology import topology_figure
from .figure import figure_widget

__all__ = ["TopologyView"]


class TopologyView:
    """Interactive view of a :class:`Topology` (optionally placed on a cluster)."""

    def __init__(self, topology: Topology, *, cluster: ClusterSpec | None = None, color_by: str | None = None):
        self.topology = topology
        self.cluster = cluster
        self.color_by = W.Dropdown(options=list(topology.names), value=color_by or topology.names[-1],
                                   description="colour by")
        self.figure_widget = figure_widget(self.figure())
        self.color_by.observe(self._recolour, names="value")
        self.widget = W.VBox([self.color_by, self.figure_widget])

    def figure(self) -> go.Figure:
        """The current view as a static figure."""
        return topology_figure(self.topology, self.color_by.value, cluster=self.cluster)

    def _recolour(self, _change=None) -> None:
        fresh = self.figure()
        with self.figure_widget.batch_update():
            self.figure_widget.data = ()
            self.figure_widget.add_traces(list(fresh.data))
            self.figure_widget.layout = fresh.layout

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
