"""The console's DataSource against real PostgreSQL, read from several threads at once, as
the panes' thread workers do (a refresh, an action's count, a cancelled refresh still
running): every read gets its own results."""

from __future__ import annotations

import threading

from jobtui.tui.data import DataSource

from .helpers import BILLING, seed


def test_refreshes_and_counts_from_several_threads_get_their_own_results(dsn: str) -> None:
    s = seed(dsn)
    source = DataSource(dsn, "jobtui")
    expected_ready = source.fetch().snapshot.ready
    errors: list[BaseException] = []
    counts: list[int] = []
    ready: list[int] = []

    def refresh() -> None:
        try:
            for _ in range(40):
                ready.append(source.fetch().snapshot.ready)
        except BaseException as exc:  # reported below
            errors.append(exc)

    def count() -> None:
        try:
            for _ in range(40):
                counts.append(len(source.dead_group_ids("dead", "invoice.render", BILLING)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=refresh), threading.Thread(target=refresh), threading.Thread(target=count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    source.close()
    assert errors == []
    assert counts == [len(s.dead_billing)] * 40
    assert ready == [expected_ready] * 80
