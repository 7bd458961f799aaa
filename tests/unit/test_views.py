"""The console's views that a link can name (kernel/views.py): what parses, what is refused
in one line, and that the panes named are the console's."""

from __future__ import annotations

import pytest

from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.views import PANES, OpenView, parse_view
from jobtui.tui import panes


@pytest.mark.parametrize(
    ("text", "view"),
    [
        ("workers", OpenView("workers")),
        ("Workers", OpenView("workers")),
        ("dead", OpenView("dead")),
        ("job:42", OpenView("job", "42")),
        ("job:007", OpenView("job", "7")),
        ("dead:billing.charge", OpenView("dead", "billing.charge")),
        ("queue:reports", OpenView("queue", "reports")),
        ("queue:a:b", OpenView("queue", "a:b")),
    ],
)
def test_views_that_parse(text: str, view: OpenView) -> None:
    assert parse_view(text) == view
    assert parse_view(view.text) == view


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("nowhere", "no view 'nowhere'"),
        ("job:x", "job:ID, ID a whole number"),
        ("job:0", "job:ID, ID a whole number"),
        (f"job:{2**63}", "job:ID, ID a whole number"),
        ("dead:", "give the type after the colon"),
        ("queue:a b", "give the queue after the colon"),
        ("queue:\x1b[2J", "give the queue after the colon"),
        ("dead:" + "t" * 201, "give the type after the colon"),
        ("http://evil.example", "no view"),
    ],
)
def test_views_refused_in_one_line(text: str, said: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_view(text)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_the_panes_a_view_names_are_the_consoles() -> None:
    assert set(PANES) == {pane.ID for pane in panes.ALL}
    assert {OpenView("job").pane, OpenView("queue", "q").pane, OpenView("dead", "t").pane} <= set(PANES)
