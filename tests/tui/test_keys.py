"""The console's keys as declared: each pane implements the actions of its keys, and the help,
written by purpose rather than by pane, names every key a footer shows and every change."""

from __future__ import annotations

import re

from textual.binding import Binding

from jobtui.tui import panes
from jobtui.tui.app import PANE_ACTIONS, JobtuiApp
from jobtui.tui.console import Change
from jobtui.tui.screens import HELP, JobListScreen
from jobtui.tui.search import JobSearchScreen

OWNERS: tuple[type[object], ...] = (*panes.ALL, JobtuiApp, JobListScreen, JobSearchScreen)
SHOWN_AS = {"slash": "/", "question_mark": "?", "escape": "esc"}


def declared(cls: type[object]) -> list[Binding]:
    """The bindings `cls` and its bases in jobtui declare (not Textual's own)."""
    return [
        b
        for k in cls.__mro__
        if k.__module__.startswith("jobtui.")
        for b in vars(k).get("BINDINGS", ())
        if isinstance(b, Binding)
    ]


def keys(binding: Binding) -> list[str]:
    return [SHOWN_AS.get(k.strip(), k.strip()) for k in binding.key.split(",")]


def test_every_key_a_footer_shows_is_in_the_help() -> None:
    for cls in OWNERS:
        for binding in declared(cls):
            if binding.show:
                for key in keys(binding):
                    assert f"[b]{key}[/]" in HELP, (cls.__name__, key)


def test_the_help_names_each_pane_after_its_number_key() -> None:
    for pane in panes.ALL:
        assert f"{pane.KEY} {pane.TITLE.lower()}" in HELP, pane.__name__


def test_the_help_lists_exactly_the_changes_as_actions() -> None:
    section = HELP.split("[b]Actions[/]")[1].split("\n\n")[0]
    listed = set(re.findall(r"^\[b\](\S+)\[/\]", section, re.MULTILINE))
    changes = {key for cls in OWNERS for b in declared(cls) if isinstance(b, Change) for key in keys(b)}
    assert changes == listed - {"w"}  # w pauses the console's own worker: local, not asked


def test_each_pane_offers_its_own_keys_and_implements_them() -> None:
    offered = {pane.ID: pane.actions() - {"open", "filter", "sort"} for pane in panes.ALL}
    assert offered == {
        "ready": set(),
        "running": {"kill_lease", "cancel", "next_page", "first_page", "every_worker"},
        "dead": {"requeue", "every_type"},
        "expiries": set(),
        "schedules": {"pause_schedule", "run_now"},
        "worker": set(),
        "charts": set(),
        "queues": {"pause_queue", "limit", "rate", "ramp", "why"},
        "workers": {"quiet", "stop", "quiet_shown", "stop_shown"},
        "why": {"every"},
    }
    for pane in panes.ALL:
        for action in pane.actions():
            assert callable(getattr(pane, f"action_{action}", None)), (pane.__name__, action)
    assert frozenset().union(*offered.values()) | {"open", "filter", "sort"} == PANE_ACTIONS
