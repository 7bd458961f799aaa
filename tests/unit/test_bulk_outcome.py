"""What a bulk run's last line says against what its question counted (core/bulk.outcome_line):
every difference is named, and none is hidden by another."""

from __future__ import annotations

from jobtui.core.bulk import BulkOutcome, outcome_line


def outcome(changed: int, busy: int = 0, *, stopped: bool = False, resumed: bool = False) -> BulkOutcome:
    return BulkOutcome(7, changed, changed + (10 if resumed else 0), list(range(busy)), stopped, resumed)


def test_as_counted() -> None:
    assert outcome_line("discard", outcome(3), 3, 0, "press d again") == "discarded 3 job(s) (bulk run 7)"


def test_fewer_than_counted_says_how_many_no_longer_matched() -> None:
    said = outcome_line("requeue", outcome(2), 3, 0, "run the command again")
    assert said == "requeued 2 of the 3 job(s) counted (bulk run 7): 1 no longer matched (changed elsewhere meanwhile)"


def test_more_than_counted_is_said_not_hidden() -> None:
    said = outcome_line("discard", outcome(4), 3, 0, "press d again")
    assert said.startswith("discarded 4 job(s) (bulk run 7): 1 more than counted, whose change")


def test_busy_stopped_and_later_each_say_how_to_go_on() -> None:
    said = outcome_line("cancel", outcome(2, busy=1, stopped=True), 5, 2, "press c again")
    assert "no longer matched" not in said  # a stopped run has not seen every job yet
    assert "; stopped: press c again to resume" in said
    assert "; 1 job(s) were held by another transaction: press c again for them" in said
    assert "; 2 job(s) matched after the count and were left: press c again for them" in said


def test_a_resumed_run_has_no_count_to_compare() -> None:
    said = outcome_line("requeue", outcome(4, resumed=True), None, 1, "run the command again")
    assert said == (
        "requeued 4 job(s) (bulk run 7, 14 in all); 1 job(s) matched after bulk run 7 began and were left:"
        " run the command again for them"
    )
