"""The console's views that can be linked: `jobtui --open VIEW` starts the console on one, and
`jobtui serve` takes the same as `?open=VIEW`, so that a link pasted in an incident channel
opens the same view for whoever follows it (with their own role).

    workers          the Workers pane (any pane by its name: ready, running, dead, why, ...)
    job:ID           job ID, explained
    dead:TYPE        the dead letters of job type TYPE
    queue:NAME       queue NAME in the Queues pane

Standard library only: the CLI, the console and the web server parse it alike.

>>> parse_view("dead:billing.charge")
OpenView(kind='dead', value='billing.charge')
>>> parse_view("job:42").text
'job:42'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote

# The panes, by the names their tabs have (tui/panes/; a test holds the two to each other).
PANES = ("ready", "running", "dead", "expiries", "schedules", "worker", "queues", "charts", "workers", "why")
# What a view may name: a job type or queue name as the checks allow it, without spaces and
# control characters (a link is a URL), at most 200 characters.
_NAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")
MAX_JOB_ID = 2**63 - 1
HOW = "give a pane (workers, why, ready, running, dead, queues, ...), job:ID, dead:TYPE or queue:NAME"


@dataclass(frozen=True, slots=True)
class OpenView:
    kind: str  # a pane's name, or "job"
    value: str | None = None  # the job's id, the dead letters' type, the queue's name

    @property
    def text(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value}"

    @property
    def pane(self) -> str:
        """The pane the view is on (a job is explained over the Ready pane)."""
        return {"job": "ready", "queue": "queues"}.get(self.kind, self.kind)


def parse_view(text: str) -> OpenView:
    """The view `text` names; InvalidInput, in one line, for one the console does not have."""
    head, sep, value = text.strip().partition(":")
    head = head.lower()
    if not sep:
        if head in PANES:
            return OpenView(head)
        raise InvalidInput(f"no view {quote(text)}: {HOW}")
    if head == "job":
        if not value.isdigit() or not 1 <= int(value) <= MAX_JOB_ID:
            raise InvalidInput(f"view {quote(text)}: a job is job:ID, ID a whole number (job:42)")
        return OpenView("job", str(int(value)))
    if head in ("dead", "queue"):
        if not _NAME.fullmatch(value):
            raise InvalidInput(f"view {quote(text)}: give the {'type' if head == 'dead' else 'queue'} after the colon")
        return OpenView(head, value)
    raise InvalidInput(f"no view {quote(text)}: {HOW}")
