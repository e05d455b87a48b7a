"""``sent``: a fake kernel comm that records what widgets send, the way the browser would receive it.

Each entry is ``(comm_id, kind, state)``: ``"open"`` with the comm-open
state, then ``"update"`` for every state update, in order.
"""

import comm
import pytest


class RecordingComm:
    """Stands in for a kernel comm and keeps the open state and every update sent."""

    def __init__(self, log, **kwargs):
        self.comm_id = f"comm-{len(log)}"
        self.kernel = object()  # ipywidgets sends only over a comm with a kernel
        self.log = log
        log.append((self.comm_id, "open", kwargs["data"]["state"]))

    def send(self, data=None, buffers=None, **_kwargs):
        self.log.append((self.comm_id, "update", data["state"]))

    def on_msg(self, _callback):
        pass

    def close(self, *_args, **_kwargs):
        pass


@pytest.fixture
def sent(monkeypatch):
    log = []
    monkeypatch.setattr(comm, "create_comm", lambda **kwargs: RecordingComm(log, **kwargs))
    return log
