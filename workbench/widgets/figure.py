"""A plotly ``FigureWidget`` whose first message to the browser already holds the whole figure.

Problem. plotly's ``FigureWidget`` (an anywidget since plotly 6) opens its
comm at the very start of its constructor, before it has parsed the figure:
the comm-open message carries ``_widget_data = []`` and ``_widget_layout =
{}``, and the traces and layout follow as a separate state update. In the
browser the view draws once, from whatever the model holds when it renders,
and never looks at ``_widget_data`` / ``_widget_layout`` again (it only
follows the incremental ``_py2js_*`` messages). anywidget holds both the
first render and the processing of comm messages until the widget's 5 MB
JavaScript bundle has been imported, and the two then race; when the render
wins, which a busy browser makes likely for figures created inside an
ipywidgets box, the figure stays empty: bare axes, default 360 px height, no
title, whatever the kernel-side figure holds. Displaying the figure on its
own once (``_repr_mimebundle_`` resends the state) hides the race for single
figures, but the widgets here show their figures only as children of boxes.

Approach. :func:`figure_widget` builds the widget with its comm still
closed, copies the parsed figure into the synced traits, and only then opens
the comm, so the comm-open message is the complete figure and there is no
later state for a view to miss. Updates afterwards are the ordinary
``batch_update`` / restyle / relayout messages, which the browser applies in
order to the model (and to any view already drawn).
"""

from __future__ import annotations

from copy import deepcopy

import plotly.graph_objects as go

__all__ = ["figure_widget"]


class _FigureWidget(go.FigureWidget):
    """``go.FigureWidget`` that opens its comm after the figure is in the synced traits (see the module docstring)."""

    def __init__(self, figure: go.Figure | dict | None = None):
        self._hold_comm = True
        try:
            super().__init__(figure)
        finally:
            self._hold_comm = False
        # plotly >= 6.1 has already copied them at the end of its constructor; 6.0 has not
        self._widget_layout = deepcopy(self._layout_obj._props)
        self._widget_data = deepcopy(self._data)
        self.open()

    def open(self) -> None:
        """Open the comm, except while the constructor is still filling the figure in."""
        if getattr(self, "_hold_comm", False):
            return
        super().open()


def figure_widget(figure: go.Figure | dict | None = None) -> go.FigureWidget:
    """A ``go.FigureWidget`` of ``figure`` whose comm opens with the complete figure as its state."""
    return _FigureWidget(figure)
