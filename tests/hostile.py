"""Hostile text for the tests of issue 16, and the checks that what jobtui shows of it is safe.

The checks do not ask jobtui's own module: a character is unsafe by its Unicode category
(control, format, surrogate, line or paragraph separator), and its visible form is the
escape Python's repr writes for it.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

import psycopg
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

# Sequences a terminal acts on, markup that Rich would read, and the characters around them.
TOKENS = [
    "\x1b]0;pwned-title\x07",  # OSC: set the window and pane title
    "\x1b]2;pwned\x1b\\",  # OSC ended by ST
    "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\",  # OSC 8 hyperlink
    "\x1b[2J\x1b[H",  # CSI: clear the screen, cursor home
    "\x1b[31;1m",  # CSI: SGR red
    "\x1b[6n",  # CSI: cursor position report (the terminal answers on stdin)
    "\x9b2J",  # the one-character C1 CSI
    "\x9d0;c1-title\x9c",  # C1 OSC ... ST
    "\x1bP+q544e\x1b\\",  # DCS: request termcap
    "\x1b_apc\x1b\\",
    "\x1bc",  # RIS: reset the terminal
    "\u202egnp.exe",  # right-to-left override
    "\u2066isolate\u2069",
    "\u200f\u061c\u200e",
    "\u200b\ufeff\U000e0041",  # invisible
    "[/]",
    "[/red",
    "[bold red]red[/]",
    "[link=http://evil.example]click[/link]",
    "list[int]",
    ":smile:",
    "\\x1b",  # the escape's own spelling, as four characters
    "\n2025-01-01 12:00:00 ERROR jobtui.worker: forged",
    "\r\t\x7f\x08\x00",
]

ALPHABET = st.characters(
    categories=("Cc", "Cf", "Cs", "Zl", "Zp", "Zs", "Lu", "Ll", "Lo", "Nd", "Mn", "Ps", "Pe", "Po", "Sm", "So"),
)


def hostile(*, max_pieces: int = 6, db: bool = False) -> st.SearchStrategy[str]:
    """Text made of hostile tokens and arbitrary characters. `db`: only what PostgreSQL
    stores in a text column (no NUL, no lone surrogate)."""
    alphabet = ALPHABET.filter(lambda c: c != "\x00" and not 0xD800 <= ord(c) <= 0xDFFF) if db else ALPHABET
    piece = st.one_of(st.sampled_from(TOKENS), st.text(alphabet, min_size=1, max_size=4))
    text = st.lists(piece, min_size=1, max_size=max_pieces).map("".join)
    if db:
        text = text.map(lambda t: t.replace("\x00", "")).filter(bool)
    return text


def unsafe(char: str) -> bool:
    """A character a terminal may act on, or that draws nothing or reorders text."""
    return unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp")


def visible(text: str) -> str:
    """`text` as it must be shown on one line: each unsafe character as repr writes it."""
    return "".join(repr(c)[1:-1] if unsafe(c) else c for c in text)


def assert_safe(shown: str, *, keep: str = "") -> None:
    """Nothing in `shown` a terminal acts on: no control character (but those in `keep`), no
    format character (bidi controls included), no separator, no surrogate."""
    bad = sorted({c for c in shown if unsafe(c) and c not in keep})
    assert not bad, f"{[hex(ord(c)) for c in bad]} in {shown!r}"


@dataclass(frozen=True)
class Texts:
    """One hostile text per field that jobtui shows."""

    type: str
    worker: str
    error: str
    key: str
    schedule: str
    actor: str


def texts() -> st.SearchStrategy[Texts]:
    """Fields for `seed`; each type distinct from the others' (they are keys of rows)."""
    field = hostile(db=True)
    return st.builds(Texts, field, field, field, field, field, field)


@dataclass(frozen=True)
class Seeded:
    ready: int
    running: int
    dead: int
    failed: int


def seed(conn: psycopg.Connection[Any], t: Texts, *, schema: str = "jobtui") -> Seeded:
    """Rows in every state, and a schedule, a lease expiry and an audit row, that carry `t`:
    written in SQL, as another program's bug or an attacker with a worker role would."""
    s = schema
    error = f"{t.error}\nTraceback line two {t.error}"

    def job(sql: str, *params: Any) -> int:
        row = conn.execute(f"INSERT INTO {s}.job {sql} RETURNING id", params).fetchone()
        assert row is not None
        return int(row[0])

    ready = job("(type, payload, idempotency_key) VALUES (%s, %s, %s)", t.type, Jsonb({t.key: t.error}), t.key)
    running = job(
        "(type, status, attempts, max_attempts, locked_by, locked_until, lease_token, heartbeat_at, started_at)"
        " VALUES (%s, 'running', 1, 3, %s, now() + interval '1 hour', 1, now(), now())",
        t.type,
        t.worker,
    )
    history = Jsonb([{"at": "2025-01-01T00:00:00+00:00", "attempt": 2, "worker": t.worker, "kind": "error",
                      "error": error}])  # fmt: skip
    finished = "attempts, max_attempts, locked_by, last_error, errors, started_at, finished_at"
    dead = job(f"(type, status, {finished}) VALUES (%s, 'dead', 3, 3, %s, %s, %s, now(), now())",
               t.type, t.worker, error, history)  # fmt: skip
    failed = job(f"(type, status, {finished}) VALUES (%s, 'failed', 1, 3, %s, %s, %s, now(), now())",
                 t.type, t.worker, t.error, history)  # fmt: skip
    conn.execute(
        f"INSERT INTO {s}.lease_expiry (job_id, job_type, worker, attempt, expired_at, outcome)"
        " VALUES (%s, %s, %s, 1, now() - interval '1 minute', 'ready')",
        (running, t.type, t.worker),
    )
    conn.execute(
        f"INSERT INTO {s}.schedule (name, job_type, cron, next_run_at, last_slot)"
        " VALUES (%s, %s, '0 * * * *', now() + interval '1 hour', now())",
        (t.schedule, t.type),
    )
    conn.execute(
        f"INSERT INTO {s}.audit (actor, action, target, job_ids, rows) VALUES (%s, 'requeue', %s, %s, 1)",
        (t.actor, f"type={t.type} error={t.error}", [dead]),
    )
    return Seeded(ready, running, dead, failed)
