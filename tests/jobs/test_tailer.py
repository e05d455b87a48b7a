import json
import threading

from workbench.core.rundir import events_path, make_event
from workbench.jobs.tailer import EventTailer, TextTailer


def line(kind, rank, **fields):
    return (json.dumps(make_event(kind, rank, **fields)) + "\n").encode()


def test_missing_folder_and_late_file(tmp_path):
    tailer = EventTailer(tmp_path)
    assert tailer.poll() == []
    path = events_path(tmp_path, 3)
    path.parent.mkdir()
    path.write_bytes(line("heartbeat", 3, step=0))
    assert [e["rank"] for e in tailer.poll()] == [3]
    assert tailer.poll() == []


def test_partial_line_is_held_back_until_complete(tmp_path):
    path = events_path(tmp_path, 0)
    path.parent.mkdir()
    whole = line("step", 0, step=1, loss=0.5)
    path.write_bytes(line("start", 0) + whole[:10])
    tailer = EventTailer(tmp_path)
    assert [e["kind"] for e in tailer.poll()] == ["start"]
    assert tailer.poll() == []
    with open(path, "ab") as f:
        f.write(whole[10:])
    events = tailer.poll()
    assert [(e["kind"], e["step"]) for e in events] == [("step", 1)]
    assert tailer.corrupt == []


def test_corrupt_line_is_skipped_and_reported_without_losing_the_rest(tmp_path):
    path = events_path(tmp_path, 1)
    path.parent.mkdir()
    good1, good2 = line("step", 1, step=0), line("step", 1, step=1)
    path.write_bytes(good1 + b'{"kind": "step", "ra\xff\n' + b"\n" + good2)
    tailer = EventTailer(tmp_path)
    assert [e["step"] for e in tailer.poll()] == [0, 1]
    assert len(tailer.corrupt) == 1
    bad = tailer.corrupt[0]
    assert bad.offset == len(good1) and bad.path.endswith("rank1.jsonl")


def test_writer_thread_with_torn_writes_loses_nothing(tmp_path):
    path = events_path(tmp_path, 0)
    path.parent.mkdir()
    payload = b"".join(line("step", 0, step=i, loss=float(i)) for i in range(300))
    done = threading.Event()

    def writer():
        with open(path, "ab", buffering=0) as f:
            for start in range(0, len(payload), 37):  # chunks that cut lines anywhere
                f.write(payload[start:start + 37])
        done.set()

    tailer = EventTailer(tmp_path)
    thread = threading.Thread(target=writer)
    thread.start()
    seen = []
    while not done.is_set():
        seen += tailer.poll()
    thread.join()
    seen += tailer.poll()
    assert [e["step"] for e in seen] == list(range(300))
    assert tailer.corrupt == []


def test_text_tailer_returns_only_complete_new_lines(tmp_path):
    path = tmp_path / "console.log"
    tailer = TextTailer(path)
    assert tailer.poll() == []
    path.write_text("a\nb\npart")
    assert tailer.poll() == ["a", "b"]
    with open(path, "a") as f:
        f.write("ial\n")
    assert tailer.poll() == ["partial"]
