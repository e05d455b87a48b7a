"""A plotly ``FigureWidget`` that is ready for kernel messages at once and always holds its current figure.

Problem. plotly's ``FigureWidget`` (an anywidget since plotly 6) ships its
5 MB JavaScript module in every figure's ``_esm``, and anywidget imports it
afresh for each figure from a blob URL. anywidget holds every comm message
for a model until that import (and the widget's ``initialize``) is done, and
gives the model 2 s: past that, the model is marked failed and every message
the kernel sends it, then or later, is dropped (the console says
"[anywidget] Failed to initialize model."). On a 2-core machine whose cores
a training job keeps busy, one import takes 1.1 to 2.0 s, and a job
monitor's three figures import side by side, so the second or third one
intermittently misses the deadline and never shows a single update: an
empty throughput chart, a timeline stuck at "no stage events yet". Two
smaller faults add to
it: plotly opens the comm before it has parsed the figure (the comm-open
state is an empty figure, the figure follows in a later update), and its
browser-side model never keeps the figure's later changes (each change is
applied to a copy), so a view drawn after some updates draws the old figure.

Approach. :func:`figure_widget` builds a ``FigureWidget`` whose module is a
small loader: the model is ready as soon as that loader runs, whatever the
browser is doing, and plotly's own module (sent as the ``_widget_code``
trait) is imported once per page and shared by every figure; a view waits
for it and then renders with plotly's code. The comm opens only after the
figure is in the synced traits, so its first message is the complete figure,
and after every change the widget also republishes ``_widget_data`` /
``_widget_layout`` with the update, so a view drawn at any time (late, again,
after a page reload) starts from the current figure. Updates themselves are
the ordinary ``batch_update`` / restyle / relayout messages, which the
browser applies in order.
"""

from __future__ import annotations

import hashlib
from copy import deepcopy
from functools import lru_cache

import plotly
import plotly.graph_objects as go
import traitlets

__all__ = ["figure_widget", "WIDGET_LOADER_JS"]

# The figure's anywidget module. ``initialize`` only starts loading plotly's module (so anywidget never holds the
# model's messages behind it); the module is imported once per page per code id and shared by all figures; a
# view waits for it, makes plotly's widget for its model once, and renders with it.
WIDGET_LOADER_JS = """\
const modules = (globalThis.__workbenchWidgetModules ??= new Map());

function plotlyModule(model) {
  const id = model.get("_widget_code_id");
  if (!modules.has(id)) {
    const url = URL.createObjectURL(new Blob([model.get("_widget_code")], { type: "text/javascript" }));
    modules.set(id, import(url).finally(() => URL.revokeObjectURL(url)));
  }
  return modules.get(id);
}

export default () => {
  let plotlyWidget = null;
  return {
    initialize({ model }) {
      plotlyModule(model);
    },
    async render({ model, el, experimental }) {
      const module = await plotlyModule(model);
      if (plotlyWidget === null) {
        const made = typeof module.default === "function" ? module.default() : module.default;
        plotlyWidget = Promise.resolve(made).then(async (widget) => {
          await widget.initialize?.({ model, experimental });
          return widget;
        });
      }
      return (await plotlyWidget).render({ model, el, experimental });
    },
  };
};
"""

# The messages that change the figure, and with each the widget republishes its state. A view drawn between the
# two starts from the state it finds and then gets the message: setting values again is harmless, so the state
# goes first (the view never misses the change); adding, removing or moving traces twice is not, so it goes after.
_SETTING_MESSAGES = ("_send_update_msg", "_send_restyle_msg", "_send_relayout_msg", "_send_animate_msg")
_TRACE_LIST_MESSAGES = ("_send_addTraces_msg", "_send_deleteTraces_msg", "_send_moveTraces_msg")


@lru_cache(maxsize=1)
def _plotly_widget_code() -> tuple[str, str]:
    """plotly's widget module and an id that changes whenever the module does."""
    code = str(go.FigureWidget._esm)
    digest = hashlib.sha256(code.encode("utf-8")).hexdigest()[:16]
    return code, f"plotly-{plotly.__version__}-{digest}"


class _FigureWidget(go.FigureWidget):
    """``go.FigureWidget`` with the loader module and the published state described in the module docstring."""

    _esm = WIDGET_LOADER_JS
    _widget_code = traitlets.Unicode("").tag(sync=True)
    _widget_code_id = traitlets.Unicode("").tag(sync=True)

    def __init__(self, figure: go.Figure | dict | None = None):
        self._hold_comm = True
        try:
            super().__init__(figure)
        finally:
            self._hold_comm = False
        self._widget_code, self._widget_code_id = _plotly_widget_code()
        self._copy_state()
        self.open()

    def open(self) -> None:
        """Open the comm, except while the constructor is still filling the figure in."""
        if getattr(self, "_hold_comm", False):
            return
        super().open()

    def _copy_state(self) -> None:
        self._widget_layout = deepcopy(self._layout_obj._props)
        self._widget_data = deepcopy(self._data)

    def _publish_state(self) -> None:
        """Send the current figure as the synced state (one message), for views drawn from now on."""
        if getattr(self, "_hold_comm", True) or self.comm is None:
            return
        with self.hold_sync():
            self._copy_state()


def _publishing(name: str, *, state_first: bool):
    send = getattr(go.FigureWidget, name)

    def method(self, *args, **kwargs):
        if state_first:
            self._publish_state()
        send(self, *args, **kwargs)
        if not state_first:
            self._publish_state()

    method.__name__ = name
    return method


for _name in _SETTING_MESSAGES + _TRACE_LIST_MESSAGES:
    setattr(_FigureWidget, _name, _publishing(_name, state_first=_name in _SETTING_MESSAGES))


def figure_widget(figure: go.Figure | dict | None = None) -> go.FigureWidget:
    """A ``go.FigureWidget`` of ``figure`` that opens with the complete figure and never misses an update."""
    return _FigureWidget(figure)
