"""A plotly ``FigureWidget`` whose first message to the browser already holds the whole figure.

Problem. plotly's ``FigureWidget`` (an anywidget since plotly 6) opens its
comm at the very start of its constructor, before it has parsed the figure:
the comm-open message carries ``_widget_data = []`` and ``_widget_layout =
{}``, and the traces and layout follow as a separate state update. In the
browser the view draws once, from whatever the model holds when it renders,
and never looks at ``_widget_data`` / ``_widget_layout`` again (it only
follows the incremental ``_py2js_*`` messages). anywidget holds both the
first render and the processing of comm messages until the widget's 5 MB
JavaScript bundle (imported anew for every figure) has loaded, and then the
two race; and when loading takes more than 2 s, which a busy browser
showing several figures at once easily reaches, anywidget gives up on the
model and drops its comm messages altogether. Either way the view is drawn
from the comm-open state: bare axes, default 360 px height, no title,
whatever the kernel-side figure holds. Displaying a figure on its own once
(``_repr_mimebundle_`` resends the state) hides this for single figures, but
the widgets here show their figures only as children of boxes.

Approach. :func:`figure_widget` builds the widget with its comm still
closed, copies the parsed figure into the synced traits, and only then opens
the comm, so the comm-open message is the complete figure and there is no
later state for a view to miss. Updates afterwards are the ordinary
``batch_update`` / restyle / relayout messages, which the browser applies in
order to the model (and to any view already drawn). One case stays open: a
model anywidget has given up on drops those updates as well, so such a
figure keeps showing the state it was first drawn with.
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
        # plotly 7 has already copied them at the end of its constructor; earlier 6.x releases have not
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
