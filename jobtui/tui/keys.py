"""The console's keys: passed on one at a time, and held while a screen or a pane opens.

A terminal or a browser may deliver several keys in one read: enter, r and y typed fast come
together. Textual hands each key to the focused widget at once and runs its binding when the
key has come back up to the app, so the second key sets off before the first one's binding
has opened anything. It lands on the screen being left (r on the dead pane asks to requeue
the whole group, not the job the list would show), or on the new screen before its rows are
there (r finds no job, and nothing says so).

So the app passes a key on only once the one before has come back up to it, and holds every
key while what a key opened is not ready: a screen until its first frame is drawn (and a
list until its first rows are shown), a pane until its table has the focus (the Why pane
until its first diagnosis is read), a question until it is asked (a dead group is counted
first), an input box's enter until what it submits is done (the filter applied, the search
or the question opened). The keys held then go on, in order, each waiting for the one
before. Escape does not wait behind what is not ready: it drops the keys held before it and
goes at once, so a screen whose rows do not come can be left. Nothing waits longer than
HOLD_LIMIT: a screen still not ready by then gets its keys as it is.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from textual import events
from textual.message_pump import MessagePump
from textual.screen import Screen

HOLD_LIMIT = 5.0  # seconds a key waits for what it is held for
TRAIL_LIMIT = 1.0  # seconds a key may take to come back up to the app
NEVER_HELD = frozenset({"escape"})  # goes at once, dropping the keys held before it


class KeyGate:
    """What the app asks of each key from the terminal (`arrived`), tells of each key it
    passed on (`passed`), and what screens and panes say while they open (`hold`, `ready`)."""

    def __init__(self, app: MessagePump, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.clock = clock
        self.held: collections.deque[events.Key] = collections.deque()
        self.waiting: dict[Hashable, float] = {}  # what is not ready yet, since when
        self._flying: object | None = None  # the key on its way up, by a token of its own
        self._flying_since = 0.0
        self._again: events.Key | None = None  # a held key, posted again: let through
        self._event: events.Key | None = None  # the key on its way up

    @property
    def busy(self) -> bool:
        return self._flying is not None or bool(self.waiting)

    def arrived(self, event: events.Key) -> bool:
        """A key from the terminal: True when it is held (the app must not pass it on)."""
        if event is self._again:  # a held key, going on now
            self._again = None
            return False
        if event.key in NEVER_HELD and self.waiting:
            self.held.clear()
            return False
        if self.busy or self.held:
            self.held.append(event)
            return True
        return False

    def passed(self, event: events.Key, target: MessagePump) -> None:
        """The app passed `event` on to `target` (the focused widget, or the screen): the next
        key goes once this one is back up at the app, its binding run (`back`), or, if a widget
        kept it (an input box takes letters), once its trail through each node's queue after
        it has reached the app."""
        token = object()
        self._flying, self._flying_since, self._event = token, self.clock(), event
        if not target.call_later(self._up, target, token):
            self._landed(token)

    def back(self, event: events.Key) -> bool:
        """`event` is back up at the app, its binding not yet run. True when it must wait
        after all: it was passed on before the key ahead of it had opened anything (a table's
        enter opens its drill-down one message later), so it goes first once that is ready.
        Otherwise the next key goes once its binding has run (a screen it closes may never
        pass its trail on)."""
        token = self._flying
        if self._event is event and token is not None:
            self.app.call_later(self._landed, token)
        if not self.waiting or event.key in NEVER_HELD:
            return False
        self.held.appendleft(events.Key(event.key, event.character))
        return True

    def _up(self, node: Any, token: object) -> None:
        # Runs in `node`'s queue, after the key. At the app, once more: what the key's binding
        # asked for there (a focus moved, a message to a widget) goes first.
        if self._flying is not token:
            return
        parent = node.parent if node is not self.app else None
        if parent is None:
            if not self.app.call_later(self._landed, token):
                self._landed(token)
        elif not parent.call_later(self._up, parent, token):
            self._landed(token)

    def _landed(self, token: object) -> None:
        if self._flying is token:
            self._flying = None
            self._next()

    def hold(self, reason: Hashable) -> None:
        """Hold the keys to come until `ready(reason)` (or HOLD_LIMIT)."""
        self.waiting.setdefault(reason, self.clock())

    def submitting(self, box: MessagePump) -> None:
        """Enter went to the input box `box`: the keys after it wait until its submission is
        handled (`submitted`) or a screen comes or goes (a dialog's box closes with it). Else
        they land in the box as it is emptied or closed: enter only posts the submission,
        which reaches the app after the key's own trail."""
        self.hold(("submitted", box))

    def submitted(self, box: MessagePump) -> None:
        self.ready(("submitted", box))

    def ready(self, reason: Hashable) -> None:
        if self.waiting.pop(reason, None) is not None:
            self._next()

    def screen_changed(self, screen: Screen[Any], stack: Sequence[Screen[Any]]) -> None:
        """A screen came on top: pushed, or back once the one above closed. A new one holds
        the keys until it is mounted and its focus set, and one that LOADS_ROWS until
        `ready((screen, "rows"))`. What waited for a screen no longer open waits no more."""
        for reason in [r for r in self.waiting if isinstance(r, tuple) and isinstance(r[0], Screen)]:
            if reason[0] not in stack:
                del self.waiting[reason]
        for reason in [r for r in self.waiting if isinstance(r, tuple) and r[0] == "submitted"]:
            del self.waiting[reason]  # the submission opened or closed a screen, which holds them now
        if not screen.is_mounted and (screen, "mounted") not in self.waiting:
            self.hold((screen, "mounted"))
            if getattr(screen, "LOADS_ROWS", False):
                self.hold((screen, "rows"))
            # In the screen's queue after its mount; then in the app's, after the focus it set.
            screen.call_later(self.app.call_later, self.ready, (screen, "mounted"))
        self._next()

    def tick(self) -> None:
        """From the app's timer: what waited too long waits no more."""
        now = self.clock()
        for reason in [r for r, since in self.waiting.items() if now - since > HOLD_LIMIT]:
            del self.waiting[reason]
        if self._again is None and self._flying is not None and now - self._flying_since > TRAIL_LIMIT:
            self._flying = None  # a trail lost with a screen that closed: the next key goes
        self._next()

    def _next(self) -> None:
        """Post the first key held again, if nothing is on its way or waited for. Until the
        app takes it, it counts as on its way: nothing passes it, and it never expires."""
        if self.busy or not self.held or self._again is not None:
            return
        first = self.held.popleft()
        self._again = events.Key(first.key, first.character)
        self._flying, self._flying_since = object(), self.clock()  # nothing passes it meanwhile
        if not self.app.post_message(self._again):
            self._again, self._flying = None, None
