"""Turns between pytest-xdist workers: a test that checks measured speed runs while no other test runs.

Every test holds a shared lock on one file while it runs; an exclusive test holds it alone. A gate file is
taken before either: an exclusive test keeps it until it ends, so while it waits for the tests already running
to finish, no worker starts another (flock gives no priority to a waiting exclusive lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator


def lock_file(run_id: str, kind: str) -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"workbench-pytest-{run_id}.{kind}"


@contextlib.contextmanager
def turn(run_id: str, exclusive: bool) -> Iterator[None]:
    """Hold the run's lock, alone when ``exclusive``, for the body."""
    with open(lock_file(run_id, "gate"), "a") as gate, open(lock_file(run_id, "lock"), "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)
