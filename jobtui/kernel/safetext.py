"""Untrusted text made safe to show in a terminal, for the console, the CLI and the logs.

Job types, payloads, keys, errors, worker ids and schedule names come from other people's
code. Shown raw, an escape sequence in them retitles or blanks the operator's terminal, a
newline forges a log line, a bidirectional override reorders what the operator reads. Here
every character that a terminal does not simply draw is replaced by a visible escape, written
as Python writes it (`\\x1b`, `\\n`, `\\u202e`, `\\U000e0001`):

- every control character: C0 (U+0000-U+001F), DEL (U+007F) and C1 (U+0080-U+009F). ESC
  itself becomes visible, so no escape sequence (CSI, OSC, DCS, APC, ...) can start, and the
  one-character C1 introducers (U+009B CSI, U+009D OSC, U+0090 DCS) are escaped as well;
- every format character (Unicode category Cf): the bidirectional embeddings, overrides and
  isolates (U+202A-U+202E, U+2066-U+2069), the marks (U+200E, U+200F, U+061C), and the
  invisible ones (zero-width space and joiners U+200B-U+200D, U+2060-U+2064, U+FEFF, the
  tag characters U+E0000-U+E007F, ...). They draw nothing, so two texts that differ only by
  them look the same; escaped, an operator sees which group of jobs is which. The cost: an
  emoji sequence or a Persian word that needs a zero-width joiner shows it as `\\u200d`;
- the line and paragraph separators (U+2028, U+2029), which some viewers break lines at;
- lone surrogates (U+D800-U+DFFF), which cannot be written as UTF-8 at all.

`line` escapes newlines and tabs too (a table cell, a log line, a one-line error); `block`
keeps them (a traceback, a job explained on several lines). A backslash is left as it is, so
text holding the four characters `\\x1b` looks like text holding ESC: the display is for
reading, and `--json` keeps the exact text. Rich and Textual markup is not this module's
business: data goes into `rich.text.Text` objects, never into markup strings.
Standard library only, so the core and the log formatter can use it.
"""

from __future__ import annotations

import logging
import re

# Code points escaped, as inclusive ranges: categories Cc, Cf, Cs, Zl and Zp as of Unicode 16
# (a test checks the running Python's Unicode tables find no other). Written out rather than
# computed at import, which would slow every start of the CLI.
UNSAFE_RANGES: tuple[tuple[int, int], ...] = (
    (0x0000, 0x001F), (0x007F, 0x009F), (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C),
    (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E),
    (0x200B, 0x200F), (0x2028, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0xD800, 0xDFFF),
    (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD),
    (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
)  # fmt: skip

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _char_class(ranges: tuple[tuple[int, int], ...], keep: str = "") -> re.Pattern[str]:
    parts = []
    for low, high in ranges:
        parts.append(re.escape(chr(low)) if low == high else f"{re.escape(chr(low))}-{re.escape(chr(high))}")
    pattern = f"[{''.join(parts)}]"
    if keep:  # a class minus `keep`: the lookahead refuses those characters
        pattern = f"(?![{re.escape(keep)}]){pattern}"
    return re.compile(pattern)


_UNSAFE = _char_class(UNSAFE_RANGES)
_UNSAFE_IN_BLOCK = _char_class(UNSAFE_RANGES, keep="\n\t")


def escape_char(char: str) -> str:
    """The visible escape of one character, as Python's repr writes it.

    >>> escape_char("\\x1b"), escape_char("\\u202e"), escape_char("\\n")
    ('\\\\x1b', '\\\\u202e', '\\\\n')
    """
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escape(match: re.Match[str]) -> str:
    return escape_char(match.group())


def line(text: str) -> str:
    """`text` as one line safe for a terminal: every control and format character escaped,
    newlines and tabs included.

    >>> line("a\\x1b]0;pwned\\x07\\nb [/]")
    'a\\\\x1b]0;pwned\\\\x07\\\\nb [/]'
    """
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def block(text: str) -> str:
    """`text` safe for a terminal on several lines: as `line`, but newlines and tabs stay
    (a CRLF becomes a newline; a lone carriage return is escaped, as it would overwrite).

    >>> block("Traceback\\r\\n  \\x9b2J")
    'Traceback\\n  \\\\x9b2J'
    """
    text = text.replace("\r\n", "\n")
    return _UNSAFE_IN_BLOCK.sub(_escape, text) if _UNSAFE_IN_BLOCK.search(text) else text


def quote(value: object, limit: int = 60) -> str:
    """`value` for an error message that echoes it: its repr (so quoted and escaped), cut to
    `limit` characters of the value, with its length when cut.

    >>> quote("email.send")
    "'email.send'"
    >>> quote("x" * 100_000, limit=3)
    "'xxx'... (100,000 characters)"
    """
    if isinstance(value, str):
        if len(value) <= limit:
            return line(repr(value))
        return f"{line(repr(value[:limit]))}... ({len(value):,} characters)"
    return shorten(line(repr(value)), limit)


def shorten(text: str, limit: int = 500) -> str:
    """`text` cut in the middle to about `limit` characters, keeping its start and its end
    (where a message says what to do).

    >>> shorten("a" * 10 + "b" * 10, limit=8)
    'aaaa ... [12 characters cut] ... bbbb'
    """
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} ... [{len(text) - 2 * half:,} characters cut] ... {text[len(text) - half :]}"


class SafeFormatter(logging.Formatter):
    """A log formatter for lines that carry job data.

    The formatted line (message and arguments included) goes through `line`, so a newline or
    an escape in a job type or an error can neither forge a log line nor reach the terminal.
    A traceback or stack stays a block of lines, escaped, each of its lines indented so that
    none can pass for a log line of its own.
    """

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = line(self.formatMessage(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        extra = [record.exc_text] if record.exc_text else []
        if record.stack_info:
            extra.append(self.formatStack(record.stack_info))
        for chunk in extra:
            text += "\n" + "\n".join("  " + part for part in block(chunk).split("\n"))
        return text
