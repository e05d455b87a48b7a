import json

import pytest

from workbench.core.timeline import Event, Timeline


def events():
    return [
        Event(rank=0, stage=0, op="F", start=0, end=1, microbatch=0),
        Event(rank=1, stage=1, op="F", start=1, end=2, microbatch=0),
        Event(rank=1, stage=1, op="B", start=2, end=4, microbatch=0),
        Event(rank=0, stage=0, op="B", start=4, end=6, microbatch=0, version=3),
        Event(rank=0, stage=0, op="AR", start=6, end=7),
    ]


def test_bubble_and_views():
    t = Timeline(tuple(events()))
    assert t.makespan == 7 and t.ranks == [0, 1]
    assert t.busy_ms(0) == 3 and t.busy_ms(0, compute_only=False) == 4
    assert t.bubble_fraction(1) == pytest.approx(1 - 3 / 7)
    assert len(t.filter(rank=0)) == 3 and len(t.filter(ops=["F"])) == 2
    assert t.shifted(10).start == 10
    assert t.events[3].label == "0B0v3"


def test_json_round_trip():
    t = Timeline(tuple(events()), meta={"schedule": "gpipe"})
    again = Timeline.from_json(t.to_json())
    assert again.events == t.events and again.meta == t.meta


def test_chrome_trace_is_loadable(tmp_path):
    t = Timeline(tuple(events() + [Event(rank=0, stage=0, op="F", start=0, end=1.5, source="measured")]))
    path = t.save_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 6
    assert {e["pid"] for e in complete} == {1, 2}
    first = next(e for e in complete if e["name"] == "1F0")
    assert first["ts"] == 1000 and first["dur"] == 1000 and first["tid"] == 1
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["measured", "simulated"]


@pytest.mark.parametrize(
    "kw, fragment",
    [(dict(op="X"), "Event.op must be one of"), (dict(end=-1), "is before start"), (dict(rank=-1), "rank must be"),
     (dict(source="guess"), "source must be one of"), (dict(start=float("inf")), "finite number"),
     (dict(microbatch=-2), "microbatch must be None")],
)
def test_bad_events(kw, fragment):
    base = dict(rank=0, stage=0, op="F", start=0, end=1)
    base.update(kw)
    with pytest.raises(ValueError, match=fragment):
        Event(**base)
