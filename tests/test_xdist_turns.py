"""The turns that let a test checking measured speed run alone under pytest-xdist (tests/xdist_turns.py)."""

import multiprocessing
import time
import uuid

from xdist_turns import lock_file, turn


def _hold(run_id: str, exclusive: bool, seconds: float, log) -> None:
    with turn(run_id, exclusive):
        began = time.monotonic()
        time.sleep(seconds)
        log.put((exclusive, began, time.monotonic()))


def test_an_exclusive_turn_waits_for_running_tests_and_keeps_new_ones_out():
    run_id = uuid.uuid4().hex
    ctx = multiprocessing.get_context("fork")
    log = ctx.Queue()
    first = ctx.Process(target=_hold, args=(run_id, False, 0.6, log))  # a test already running
    first.start()
    time.sleep(0.2)
    alone = ctx.Process(target=_hold, args=(run_id, True, 0.6, log))  # asks while it runs
    alone.start()
    time.sleep(0.2)
    later = ctx.Process(target=_hold, args=(run_id, False, 0.3, log))  # asks while the exclusive one waits
    later.start()
    for proc in (first, alone, later):
        proc.join(10)
        assert proc.exitcode == 0
    spans = [log.get(timeout=5) for _ in range(3)]
    (_, a0, a1), = [s for s in spans if s[0]]
    shared = [s for s in spans if not s[0]]
    assert all(end <= a0 or begin >= a1 for _, begin, end in shared), spans  # nothing overlaps the exclusive turn
    assert max(begin for _, begin, _ in shared) >= a1  # the later test ran after it, not before
    for kind in ("gate", "lock"):
        lock_file(run_id, kind).unlink(missing_ok=True)
