"""Durations as people write them, and the mistakes they make."""

from __future__ import annotations

import pytest

from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import InvalidInput


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("30", 30.0),
        ("2.5", 2.5),
        ("0s", 0.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("2d", 172800.0),
        ("250ms", 0.25),
        ("1ms", 0.001),
        ("1h30m", 5400.0),
        ("1m30s", 90.0),
        ("1d2h3m4s", 93784.0),
        ("1s500ms", 1.5),
        ("1.5h", 5400.0),
        ("0.5m", 30.0),
        ("  45s ", 45.0),
        ("5M", 300.0),
        ("1H30M", 5400.0),
        ("250MS", 0.25),
        ("3650d", 3650 * 86400.0),  # exactly ten years
        ("315360000", 315360000.0),
        ("1e3", 1000.0),
    ],
)
def test_good_durations(text: str, seconds: float) -> None:
    result = parse_duration(text)
    assert isinstance(result, float)
    assert result == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "s",
        "ms",
        "m5",
        "5x",
        "5 m",
        "1h 30m",
        "30s5",
        "1.5.5s",
        "five",
        "-5",
        "-5s",
        "-0.5",
        "+",
        "inf",
        "-inf",
        "nan",
        "1e400",
        "3651d",
        "315360001",
        "87600h1s",
        "5y",
        "5w",
        "1h-30m",
        "1,5s",
        "0x10",
    ],
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(InvalidInput, match="bad duration"):
        parse_duration(text)


def test_message_shows_an_example() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_duration("soon")
    message = str(info.value)
    assert "'soon'" in message and "30s" in message
    assert "\n" not in message
