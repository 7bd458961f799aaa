"""The console in a real terminal (tmux) on a database of hostile rows (issue 16).

Job types, workers, errors and schedule names carry escape sequences that retitle, clear and
reset a terminal, C1 controls, bidi overrides, markup and newlines. After the console has
opened and every pane (and the drill-downs, the job detail and the help) has been shown, the
pane's title is the one it had, the tab bar and column headers are on the screen, and every
hostile row is there, in its visible form.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.hostile import Texts, seed, visible
from tests.tui.helpers import query
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
TITLE = "operator-console"
TYPES = [
    "title\x1b]0;pwned-title\x07",
    "title2\x1b]2;pwned-again\x1b\\",
    "clear\x1b[2J\x1b[H",
    "c1\x9b2J\x9d0;c1-title\x9c",
    "dcs\x1bP+q544e\x1b\\",
    "ask\x1b[6n",  # the terminal would answer on the console's stdin
    "bidi\u202eevil\u2066",
    "markup[/]",
    "red[bold red]x",
    "link[link=http://evil.example]click[/link]",
    "nl\nforged",
    "reset\x1bc",
]

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed: apt-get install -y tmux runs this test"
)


class Terminal:
    """A tmux server of this test's own, with one pane of `width` x `height`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def tmux(self, *args: str) -> str:
        # The pane's size is the window's: without COLUMNS and LINES, which some process of the
        # test run may have left in the environment (and tmux would pass on).
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        done = subprocess.run(
            ["tmux", "-L", self.name, *args], capture_output=True, text=True, timeout=10, check=True, env=env
        )
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "console")

    def title(self) -> str:
        return self.tmux("display", "-p", "-t", "console", "#{pane_title}").strip()

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "console", *keys)

    def wait(self, condition: Callable[[str], bool], what: str, timeout: float = 20.0) -> str:
        # tmux says nothing when a pane changes: the pane is read again until it shows it.
        def shown() -> str | None:
            screen = self.screen()
            return screen if condition(screen) else None

        def told() -> str:
            size = self.tmux("display", "-p", "-t", "console", "#{pane_width}x#{pane_height}").strip()
            return f"the screen ({size}):\n{self.screen()}"

        found: str = wait_until(shown, timeout, what, told)
        return found


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    term = Terminal(f"jobtui-test-{os.getpid()}")
    yield term
    subprocess.run(["tmux", "-L", term.name, "kill-server"], capture_output=True, timeout=10, check=False)


def test_hostile_rows_neither_retitle_nor_blank_the_terminal(dsn: str, terminal: Terminal) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, job_type in enumerate(TYPES):
            seed(conn, Texts(job_type, f"w{i}{job_type}", f"err{i} {job_type}", f"k{i}", f"s{i}{job_type}", "a"))
    # The console waits for a key, so the title is set before anything runs in the pane.
    command = f"read _; unset COLUMNS LINES; exec {sys.executable} -m jobtui.cli --actor tester"
    terminal.tmux(
        "-f", "/dev/null", "new-session", "-d", "-s", "console", "-x", "230", "-y", "60", "-c", str(ROOT),
        "-e", f"JOBTUI_DSN={dsn}", "sh", "-c", command,
    )  # fmt: skip
    terminal.tmux("select-pane", "-t", "console", "-T", TITLE)
    assert terminal.title() == TITLE
    terminal.keys("Enter")

    tabs = ["1 Ready", "2 Running", "3 Dead", "4 Lease expiries", "5 Schedules"]
    shown_types = [visible(t) for t in TYPES]
    panes = {
        "1": (["type", "due", "delayed", "oldest wait"], shown_types),
        "2": (["id", "type", "worker", "lease left"], [visible(f"w{i}{t}") for i, t in enumerate(TYPES)]),
        "3": (["status", "type", "jobs", "error fingerprint"], shown_types),
        "4": (["reaped", "job", "type", "worker"], shown_types),
        "5": (["name", "next", "missed"], [visible(f"s{i}{t}") for i, t in enumerate(TYPES)]),
    }
    for key, (headers, rows) in panes.items():
        terminal.keys(key)
        screen = terminal.wait(
            lambda s, h=headers, r=rows: all(x in s for x in [*tabs, *h, *r]), what=f"pane {key} with every row"
        )
        assert terminal.title() == TITLE, screen
        assert "pwned" not in terminal.title()

    def main(s: str) -> bool:
        return all(t in s for t in tabs)

    # The drill-downs, the job detail and the help, over the same rows; one key at a time (an
    # escape followed at once by another key reads as alt+key).
    for keys, shown, what in (
        ("3", lambda s: main(s) and "error fingerprint" in s, "the dead pane"),
        # The list holds the keys until its rows are shown; this waits to read them.
        ("Enter", lambda s: " jobs of " in s and "error fingerprint" not in s and "3/3" in s, "a dead group's jobs"),
        ("Enter", lambda s: "Attempts and events (1 recorded" in s and "Payload:" in s, "a dead job explained"),
        ("Escape", lambda s: " jobs of " in s, "back to the group's jobs"),
        ("Escape", main, "back to the panes"),
        ("2", lambda s: "lease left" in s, "the running pane"),
        ("Enter", lambda s: "  worker        w" in s, "a running job explained"),
        ("Escape", main, "back to the panes"),
        ("?", lambda s: "drill down" in s and "Panes" in s, "the help"),
        ("Escape", lambda s: main(s) and "drill down" not in s, "the help closed"),
        ("1", lambda s: main(s) and all(t in s for t in shown_types), "the ready pane again"),
    ):
        terminal.keys(keys)
        screen = terminal.wait(shown, what)
        assert terminal.title() == TITLE, screen

    assert terminal.title() == TITLE, screen
    where, header, tab_bar = screen.splitlines()[0], screen.splitlines()[1], screen.splitlines()[2:5]
    assert "schema jobtui" in where and "oldest ready" in header, screen  # the vital signs, not blanked
    assert any(all(t in line for t in tabs) for line in tab_bar), screen
    terminal.keys("q")
    terminal.wait(lambda s: "1 Ready" not in s, what="the console to quit")


# Drill-downs opened, each with its key in the same write: 50 in the slow run, 10 by default.
KEYED = [10, pytest.param(50, marks=pytest.mark.slow)]


@pytest.mark.parametrize("times", KEYED)
def test_a_screens_key_typed_with_the_key_that_opens_it_is_never_lost(dsn: str, terminal: Terminal, times: int) -> None:
    """Enter (a dead group's jobs), r (requeue the job under the cursor), y (the answer) and q
    (back) go to the console in one send-keys, 10 times (50 in the slow run): each key opens a
    screen while the next ones are on their way, and every requeue happens, counted by its
    audit row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobtui.job (type, status, attempts, max_attempts, last_error, started_at, finished_at)"
            " SELECT 'burst.send', 'dead', 3, 3, 'TimeoutError: upstream ' || i || ' did not answer', now(), now()"
            " FROM generate_series(1, %s) AS i",
            (times,),
        )
    command = f"unset COLUMNS LINES; exec {sys.executable} -m jobtui.cli --actor tester"
    terminal.tmux(
        "-f", "/dev/null", "new-session", "-d", "-s", "console", "-x", "160", "-y", "40", "-c", str(ROOT),
        "-e", f"JOBTUI_DSN={dsn}", "sh", "-c", command,
    )  # fmt: skip

    def dead_pane(s: str) -> bool:
        return "error fingerprint" in s and " jobs of " not in s

    terminal.wait(lambda s: "1 Ready" in s and "updated" in s, "the console")
    terminal.keys("3")
    terminal.wait(lambda s: dead_pane(s) and "burst.send" in s, "the dead pane")
    for done in range(1, times + 1):
        # One write: open the list, requeue its first job, answer the question, back (q).
        terminal.keys("Enter", "r", "y", "q")
        wait_until(lambda n=done: audit_count(dsn) >= n, 10, f"requeue {done} of {times}", terminal.screen)
        terminal.wait(dead_pane, "back to the dead pane")
    rows = query(dsn, "SELECT actor, action, rows FROM jobtui.audit ORDER BY id")
    assert rows == [("tester", "requeue", 1)] * times
    assert query(dsn, "SELECT status, count(*) FROM jobtui.job GROUP BY status") == [("ready", times)]
    terminal.keys("q")


def audit_count(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM jobtui.audit")[0][0])
