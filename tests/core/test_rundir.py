import json

import pytest

from workbench.core.rundir import EVENT_SCHEMA_VERSION, events_path, make_event, parse_event_line


def test_event_round_trip(tmp_path):
    record = make_event("step", 1, step=3, loss=0.5)
    assert record["v"] == EVENT_SCHEMA_VERSION and record["kind"] == "step" and record["rank"] == 1
    assert parse_event_line(json.dumps(record)) == record
    assert events_path(tmp_path, 2).name == "rank2.jsonl"


@pytest.mark.parametrize("line, fragment", [("{oops", "corrupt event line"), ("[1]", "lacks 'kind'"),
                                            ('{"kind": "step", "rank": 0, "v": 7}', "schema version 7")])
def test_bad_lines(line, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_event_line(line)


def test_bad_kind():
    with pytest.raises(ValueError, match="event kind must be one of"):
        make_event("weird", 0)
