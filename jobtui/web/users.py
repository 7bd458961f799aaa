"""The users of `jobtui serve`: a file of names, roles and password hashes, one user a line.

    # jobtui serve users: NAME:ROLE:HASH
    alice:operator:$argon2id$v=19$m=65536,t=3,p=4$...
    bob:viewer:$argon2id$v=19$m=65536,t=3,p=4$...

Passwords are hashed with Argon2id (argon2-cffi, RFC 9106's low-memory profile: 64 MiB, 3
passes), a memory-hard function, so a stolen file is slow to attack on any hardware. An
operator may change the queue; a viewer gets a read-only console. The file is written whole
(a new file renamed over the old one), readable by its owner only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote

OPERATOR, VIEWER = "operator", "viewer"
ROLES = (OPERATOR, VIEWER)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
MIN_PASSWORD = 12
MAX_PASSWORD = 1024  # hashing is bounded in time by the hash's cost, not by a password's length
HEADER = "# jobtui serve users, one a line: NAME:ROLE:HASH (jobtui user add|remove|list)\n"
USERS_ENV = "JOBTUI_USERS"

_hasher = PasswordHasher()


@functools.cache
def unknown_user_hash() -> str:
    """Checked for a name that is not in the file, so that a wrong name costs as long as a
    wrong password and the time of an answer does not tell which names exist."""
    return _hasher.hash("not the password of anyone")


def default_path() -> Path:
    """JOBTUI_USERS, else ~/.config/jobtui/users."""
    env = os.environ.get(USERS_ENV)
    return Path(env) if env else Path.home() / ".config" / "jobtui" / "users"


@dataclass(frozen=True, slots=True)
class User:
    name: str
    role: str  # OPERATOR or VIEWER
    password_hash: str

    @property
    def operator(self) -> bool:
        return self.role == OPERATOR


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidInput(
            f"user name {quote(name)} is not allowed: 1-64 letters, digits and . _ @ -, starting with a letter or digit"
        )
    return name


def check_password(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise InvalidInput(f"the password is too short: give at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise InvalidInput(f"the password is too long: give at most {MAX_PASSWORD} characters")
    if any(c in password for c in "\r\n\0"):
        raise InvalidInput("the password holds a line break or a NUL: type it on one line")
    return password


def hash_password(password: str) -> str:
    return _hasher.hash(check_password(password))


class UsersFile:
    """The users file at `path`: read whole on each look-up, so an added or removed user counts
    at once, without restarting the server."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, User]:
        """Every user of the file (none when it does not exist)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"cannot read the users file {self.path}: {exc}") from None
        users: dict[str, User] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            entry = raw.strip()
            if not entry or entry.startswith("#"):
                continue
            name, _, rest = entry.partition(":")
            role, _, password_hash = rest.partition(":")
            if not NAME.fullmatch(name) or role not in ROLES or not password_hash.startswith("$argon2"):
                raise InvalidInput(
                    f"the users file {self.path} is not valid at line {number}: expected NAME:ROLE:HASH with ROLE"
                    " operator or viewer; rewrite it with `jobtui user add`"
                )
            users[name] = User(name, role, password_hash)
        return users

    def check_private(self) -> None:
        """Refuse a file others may read or anyone but its owner may change: it holds hashes."""
        try:
            mode = self.path.stat().st_mode
        except FileNotFoundError:
            return
        if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
            raise InvalidInput(
                f"the users file {self.path} can be read or changed by other users: run chmod 600 {self.path}"
            )

    def add(self, name: str, password: str, *, role: str, replace: bool = False) -> bool:
        """Add `name` (or, with `replace`, set its password and role); True when it was new."""
        users = self.load()
        check_name(name)
        new = name not in users
        if not new and not replace:
            raise InvalidInput(f"user {quote(name)} exists: give --replace to set a new password and role")
        users[name] = User(name, role, hash_password(password))
        self._save(users)
        return new

    def remove(self, name: str) -> None:
        users = self.load()
        if users.pop(name, None) is None:
            raise InvalidInput(f"no user {quote(name)} in {self.path}; `jobtui user list` lists them")
        self._save(users)

    def verify(self, name: str, password: str) -> User | None:
        """The user whose name and password these are, else None. Slow on purpose (the hash's
        cost), as slow for an unknown name as for a wrong password."""
        user = self.load().get(name)
        try:
            _hasher.verify(user.password_hash if user is not None else unknown_user_hash(), password)
        except (VerificationError, InvalidHashError):
            return None
        return user

    def _save(self, users: dict[str, User]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lines = [HEADER, *(f"{u.name}:{u.role}:{u.password_hash}\n" for u in sorted(users.values(), key=_by_name))]
        fd, tmp = tempfile.mkstemp(prefix=".users-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp's mode is 0600
                out.writelines(lines)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _by_name(user: User) -> str:
    return user.name
