"""Views of a job, found by name, so the jobs room never imports the widgets that draw it.

Widgets sit above jobs (a monitor reads a :class:`~workbench.jobs.Job`), so
``Job.monitor()`` cannot import the monitor widget without tying the two
rooms into a circle. Instead it asks this registry for the viewer named
``"monitor"``: a factory registered at run time with :func:`register_viewer`
(a notebook can swap in its own), else the one the installed package
declares under the ``workbench.viewers`` entry-point group in
``pyproject.toml`` (the widgets room's ``JobMonitor``). The factory is
called with the job and the caller's options.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Callable

__all__ = ["ENTRY_POINT_GROUP", "register_viewer", "viewer"]

ENTRY_POINT_GROUP = "workbench.viewers"
_REGISTERED: dict[str, Callable[..., Any]] = {}


def register_viewer(name: str, factory: Callable[..., Any]) -> None:
    """Use ``factory(job, **options)`` for the viewer ``name`` (overrides the installed one)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"viewer name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise ValueError(f"viewer {name!r} needs a callable factory, got {type(factory).__name__}")
    _REGISTERED[name] = factory


def viewer(name: str) -> Callable[..., Any]:
    """The factory of viewer ``name``: registered at run time, else declared by the installed package."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        declared = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} | set(_REGISTERED))
        raise LookupError(f"no job viewer named {name!r} (known: {declared or 'none'}); the workbench package "
                          f"declares its viewers under the {ENTRY_POINT_GROUP!r} entry points, so reinstall it "
                          f"(make install), or call workbench.jobs.viewers.register_viewer({name!r}, factory)")
    return found[0].load()
