"""safetext against an oracle: Unicode categories and repr, over arbitrary hostile text."""

from __future__ import annotations

import logging
import re
import sys
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from jobtui.kernel import safetext
from jobtui.kernel.safetext import SafeFormatter, block, line, quote, shorten
from tests.hostile import assert_safe, hostile, unsafe, visible


def test_the_table_covers_every_control_format_and_separator_character_of_this_python() -> None:
    table = {c for low, high in safetext.UNSAFE_RANGES for c in range(low, high + 1)}
    wanted = {c for c in range(sys.maxunicode + 1) if unsafe(chr(c))}
    assert wanted - table == set(), [hex(c) for c in sorted(wanted - table)][:20]
    # More is only the format characters of Unicode versions newer than this Python's tables.
    assert all(unicodedata.category(chr(c)) == "Cn" for c in table - wanted)


@given(hostile())
def test_line_escapes_exactly_the_unsafe_characters_as_repr_writes_them(text: str) -> None:
    shown = line(text)
    assert shown == visible(text)
    assert_safe(shown)
    assert line(shown) == shown  # escaping twice changes nothing: no doubled backslashes


@given(hostile())
def test_block_keeps_newlines_and_tabs_and_escapes_the_rest(text: str) -> None:
    shown = block(text)
    assert_safe(shown, keep="\n\t")
    assert shown == "".join(c if c in "\n\t" else visible(c) for c in text.replace("\r\n", "\n"))


def test_the_issue_examples() -> None:
    assert line("\x1b]0;pwned-title\x07") == "\\x1b]0;pwned-title\\x07"
    assert line("\x1b[2J\x1b[H") == "\\x1b[2J\\x1b[H"
    assert line("\x9b2J") == "\\x9b2J"  # C1 CSI: one character, no ESC in it
    assert line("abc\u202edef\u2066\u2069") == "abc\\u202edef\\u2066\\u2069"
    assert line("a\nb\tc\x7f") == "a\\nb\\tc\\x7f"
    assert line("[bold red]x[/] list[int] é 日本 👍") == "[bold red]x[/] list[int] é 日本 👍"  # printable: as is


@given(st.one_of(hostile(max_pieces=30), st.text(max_size=200)), st.integers(1, 80))
def test_quote_is_one_safe_line_with_at_most_limit_characters_of_the_value(value: str, limit: int) -> None:
    shown = quote(value, limit)
    assert_safe(shown)
    if len(value) <= limit:
        assert shown == repr(value)
    else:
        assert shown == f"{value[:limit]!r}... ({len(value):,} characters)"


def test_a_100kb_value_is_cut_to_a_readable_length() -> None:
    shown = quote("x" * 100_000)
    assert shown == "'" + "x" * 60 + "'... (100,000 characters)"
    assert len(shorten("a" * 100_000)) < 540


@given(st.text(max_size=3000), st.integers(10, 600))
def test_shorten_keeps_start_and_end(text: str, limit: int) -> None:
    shown = shorten(text, limit)
    if len(text) <= limit:
        assert shown == text
    else:
        assert shown.startswith(text[: limit // 2]) and shown.endswith(text[-(limit // 2) :])
        assert f"[{len(text) - 2 * (limit // 2):,} characters cut]" in shown


LOG_LINE = re.compile(r"^\d{2}:\d{2}:\d{2} (INFO|WARNING|ERROR) jobtui\.test: ")


@settings(max_examples=200)
@given(hostile(), hostile(), hostile())
def test_a_log_line_cannot_be_forged_and_a_traceback_stays_an_indented_block(
    job_type: str, error: str, message: str
) -> None:
    formatter = SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    record = logging.LogRecord(
        "jobtui.test", logging.WARNING, __file__, 1, "job %d (%s): %s", (7, job_type, error), None
    )
    shown = formatter.format(record)
    assert "\n" not in shown and LOG_LINE.match(shown), shown
    assert shown.endswith(f"job 7 ({visible(job_type)}): {visible(error)}")
    assert_safe(shown)
    try:
        raise ValueError(message)
    except ValueError:
        record = logging.LogRecord("jobtui.test", logging.ERROR, __file__, 1, "%s", (job_type,), sys.exc_info())
    shown = formatter.format(record)
    first, *rest = shown.split("\n")
    assert LOG_LINE.match(first) and first.endswith(visible(job_type))
    assert rest and all(part.startswith("  ") for part in rest), shown  # no line of its own
    assert rest[0] == "  Traceback (most recent call last):"
    assert_safe(shown, keep="\n\t")
