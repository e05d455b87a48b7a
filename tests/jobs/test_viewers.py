"""Job.monitor() finds its widget through the viewer registry, never by importing the widgets room."""

import subprocess
import sys

import pytest

from workbench.jobs import viewers


def test_the_installed_monitor_is_the_widgets_job_monitor_in_a_fresh_interpreter():
    code = ("import workbench, sys\n"
            "assert 'workbench.widgets.job_monitor' not in sys.modules\n"
            "from workbench.jobs.viewers import viewer\n"
            "print(viewer('monitor').__module__, viewer('monitor').__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["workbench.widgets.job_monitor", "JobMonitor"]


def test_a_registered_viewer_wins_and_unknown_names_are_explained(monkeypatch):
    monkeypatch.setattr(viewers, "_REGISTERED", {})
    seen = []
    viewers.register_viewer("monitor", lambda job, **options: seen.append((job, options)) or "mine")
    assert viewers.viewer("monitor")("job", refresh_s=1) == "mine" and seen == [("job", {"refresh_s": 1})]
    with pytest.raises(LookupError, match="no job viewer named 'gallery'"):
        viewers.viewer("gallery")
    with pytest.raises(ValueError, match="callable factory"):
        viewers.register_viewer("monitor", None)
