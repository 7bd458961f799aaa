"""The sign-in of `jobtui serve` without a server: the users file, its hashes, the sessions and
the slowing down of failed sign-ins, with a clock the tests move."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jobtui.kernel.errors import InvalidInput
from jobtui.web.sessions import MAX_DELAY, Sessions, SignInThrottle
from jobtui.web.users import OPERATOR, VIEWER, User, UsersFile


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_passwords_are_argon2id_hashes_checked_by_name(tmp_path: Path) -> None:
    users = UsersFile(tmp_path / "users")
    assert users.add("alice", "alice-password-1", role=OPERATOR)
    users.add("bob", "bob-password-12", role=VIEWER)
    text = (tmp_path / "users").read_text()
    assert "alice-password-1" not in text
    assert all(u.password_hash.startswith("$argon2id$") for u in users.load().values())
    assert (tmp_path / "users").stat().st_mode & 0o777 == 0o600

    alice = users.verify("alice", "alice-password-1")
    assert alice is not None and alice.operator
    bob = users.verify("bob", "bob-password-12")
    assert bob is not None and not bob.operator
    assert users.verify("alice", "bob-password-12") is None  # another user's password
    assert users.verify("alice", "alice-password-") is None
    assert users.verify("carol", "alice-password-1") is None  # no such user
    assert users.verify("alice", "") is None


def test_a_damaged_users_file_is_one_line_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text("# comment\nalice:operator:$argon2id$x\nbob:admin:$argon2id$y\n")
    with pytest.raises(InvalidInput, match="at line 3"):
        UsersFile(path).load()
    path.write_text("alice:operator:$argon2id$v=19$m=65536,t=3,p=4$notbase64$notahash\n")
    assert UsersFile(path).verify("alice", "whatever-password") is None  # a bad hash lets nobody in


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_a_users_file_others_can_read_or_write_is_refused(tmp_path: Path) -> None:
    users = UsersFile(tmp_path / "users")
    users.add("alice", "alice-password-1", role=OPERATOR)
    users.check_private()
    for mode in (0o604, 0o620, 0o602):
        users.path.chmod(mode)
        with pytest.raises(InvalidInput, match="chmod 600"):
            users.check_private()
    users.path.chmod(0o640)  # a group that may read it (the service's) is the owner's choice
    users.check_private()


def test_sessions_end_when_idle_and_keep_no_token() -> None:
    clock = Clock()
    sessions = Sessions(idle_timeout=60, clock=clock)
    token, session = sessions.create(User("alice", OPERATOR, "$argon2id$h"))
    assert len(token) >= 43  # 256 random bits
    assert token not in repr(sessions.__dict__)  # only its digest is kept
    assert sessions.get(token) is session
    assert sessions.get(token + "x") is None and sessions.get(None) is None and sessions.get("") is None

    clock.now += 50
    sessions.touch(session)
    clock.now += 50  # 100 s since sign-in, 50 since the last key
    assert sessions.get(token) is session
    clock.now += 61
    assert sessions.get(token) is None  # expired, still there for `idle` to end with its consoles
    sessions.touch(session)  # a key pressed now, before `idle` ran, does not bring it back
    assert sessions.get(token) is None
    assert sessions.idle() == [session]
    assert sessions.get(token) is None and len(sessions) == 0


def test_sessions_of_a_removed_user_or_a_changed_role_end() -> None:
    sessions = Sessions(idle_timeout=60, clock=Clock())
    alice = User("alice", OPERATOR, "$argon2id$h")
    bob = User("bob", OPERATOR, "$argon2id$h")
    _, a = sessions.create(alice)
    _, b = sessions.create(bob)
    ended = sessions.not_in({"alice": alice, "bob": User("bob", VIEWER, "$argon2id$h")})
    assert ended == [b] and sessions.all() == [a]
    assert sessions.not_in({}) == [a] and len(sessions) == 0


def test_failed_sign_ins_double_the_wait_per_name_and_per_address() -> None:
    clock = Clock()
    throttle = SignInThrottle(clock=clock)
    keys = ("name:alice", "address:192.0.2.1")
    assert throttle.wait(*keys) == 0
    waits = []
    for _ in range(8):
        throttle.failed(*keys)
        waits.append(throttle.wait(*keys))
        clock.now += throttle.wait(*keys)  # the attacker waits exactly as long as told
    assert waits == [1, 2, 4, 8, 16, 32, MAX_DELAY, MAX_DELAY]
    # Another address trying the same name waits as long; the same address another name too.
    assert throttle.wait("name:alice", "address:198.51.100.2") == 0  # (it waited its turn above)
    throttle.failed(*keys)
    assert throttle.wait("name:alice", "address:198.51.100.2") == MAX_DELAY
    assert throttle.wait("name:bob", "address:192.0.2.1") == MAX_DELAY
    assert throttle.wait("name:bob", "address:198.51.100.2") == 0
    # A success clears them; failures older than a quarter of an hour are forgotten.
    throttle.succeeded(*keys)
    assert throttle.wait(*keys) == 0
    throttle.failed("name:carol")
    clock.now += 901
    assert throttle.failed("name:carol") == 1
