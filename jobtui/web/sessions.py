"""Who is signed in to `jobtui serve`, for how long, and how fast a wrong password may be tried.

Sessions live in the server's memory only: a restart signs everyone out. The browser holds a
random token (256 bits) in a cookie; the server keeps only the token's SHA-256, so the table
of sessions is no list of valid cookies. A session ends at sign-out, when its user leaves the
users file or changes role, or after `idle_timeout` without a key pressed or a page loaded.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobtui.web.users import User

# Signed-in sessions kept at most; past that the one idle longest is signed out. Each costs a
# few hundred bytes, and each took a right password, so this only bounds a runaway client.
MAX_SIGNED_IN = 1000


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(eq=False)
class Session:
    user: str
    role: str
    started: float
    last_active: float
    # The consoles (WebSockets) open in this session, closed with it: each has a close(reason).
    consoles: set[Any] = field(default_factory=set)

    @property
    def operator(self) -> bool:
        return self.role == "operator"


class Sessions:
    def __init__(self, idle_timeout: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout = idle_timeout
        self.clock = clock
        self._by_digest: dict[bytes, Session] = {}

    def __len__(self) -> int:
        return len(self._by_digest)

    def create(self, user: User) -> tuple[str, Session]:
        """A new session for `user`, and the token its cookie carries."""
        if len(self._by_digest) >= MAX_SIGNED_IN:
            oldest = min(self._by_digest, key=lambda d: self._by_digest[d].last_active)
            del self._by_digest[oldest]
        token = secrets.token_urlsafe(32)
        now = self.clock()
        session = Session(user.name, user.role, now, now)
        self._by_digest[_digest(token)] = session
        return token, session

    def get(self, token: str | None) -> Session | None:
        """The live session of `token`; None for no token, an unknown one or an expired one."""
        if not token:
            return None
        digest = _digest(token)
        session = self._by_digest.get(digest)
        if session is None:
            return None
        if self.clock() - session.last_active > self.idle_timeout:
            return None  # ended by `idle`, whose caller closes its consoles
        return session

    def touch(self, session: Session) -> None:
        """The user did something: the idle timeout starts again (unless it has run out: a key
        pressed after the timeout does not bring the session back)."""
        now = self.clock()
        if now - session.last_active <= self.idle_timeout:
            session.last_active = now

    def end(self, session: Session) -> None:
        for digest, s in list(self._by_digest.items()):
            if s is session:
                del self._by_digest[digest]

    def idle(self) -> list[Session]:
        """Sessions idle past the timeout, removed: their consoles are the caller's to close."""
        now = self.clock()
        gone = [(d, s) for d, s in self._by_digest.items() if now - s.last_active > self.idle_timeout]
        for digest, _ in gone:
            del self._by_digest[digest]
        return [s for _, s in gone]

    def not_in(self, users: dict[str, User]) -> list[Session]:
        """Sessions whose user left the users file or changed role, removed."""
        gone = [(d, s) for d, s in self._by_digest.items() if s.user not in users or users[s.user].role != s.role]
        for digest, _ in gone:
            del self._by_digest[digest]
        return [s for _, s in gone]

    def all(self) -> list[Session]:
        return list(self._by_digest.values())


# Failed sign-ins: after the n-th failure in a row of a name, or from an address, the next
# attempt of that name or from that address is refused unanswered for FIRST_DELAY * 2**(n-1)
# seconds, at most MAX_DELAY; a failure older than FORGET_AFTER no longer counts.
FIRST_DELAY = 1.0
MAX_DELAY = 60.0
FORGET_AFTER = 900.0
MAX_TRACKED = 10_000  # names and addresses remembered at most (an attacker picks them)


@dataclass
class _Failures:
    count: int
    last: float


class SignInThrottle:
    """Slows down guessing: each key (a name, an address) has its own count of failures."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._failures: dict[str, _Failures] = {}

    def wait(self, *keys: str) -> float:
        """Seconds before any of `keys` may try again (0: now)."""
        now = self.clock()
        longest = 0.0
        for key in keys:
            f = self._failures.get(key)
            if f is None:
                continue
            if now - f.last > FORGET_AFTER:
                del self._failures[key]
                continue
            longest = max(longest, f.last + delay_after(f.count) - now)
        return max(0.0, longest)

    def failed(self, *keys: str) -> int:
        """Count a failure of each key; the most failures in a row of any of them."""
        now = self.clock()
        if len(self._failures) + len(keys) > MAX_TRACKED:
            self._forget(now)
        most = 0
        for key in keys:
            f = self._failures.get(key)
            if f is None or now - f.last > FORGET_AFTER:
                f = self._failures[key] = _Failures(0, now)
            f.count += 1
            f.last = now
            most = max(most, f.count)
        return most

    def succeeded(self, *keys: str) -> None:
        for key in keys:
            self._failures.pop(key, None)

    def _forget(self, now: float) -> None:
        for key in [k for k, f in self._failures.items() if now - f.last > FORGET_AFTER]:
            del self._failures[key]
        while len(self._failures) >= MAX_TRACKED:  # still full: the oldest go
            del self._failures[min(self._failures, key=lambda k: self._failures[k].last)]


def delay_after(failures: int) -> float:
    """Seconds an attempt waits after `failures` in a row.

    >>> [delay_after(n) for n in (0, 1, 2, 3, 8)]
    [0.0, 1.0, 2.0, 4.0, 60.0]
    """
    if failures <= 0:
        return 0.0
    return float(min(MAX_DELAY, FIRST_DELAY * 2 ** (failures - 1)))
