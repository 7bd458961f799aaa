"""Done jobs per minute, kept between the snapshots of one reader (`DoneHistory`), and the
calendar minute the database's date_bin gives a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

Row = dict[str, Any]

# Minutes of done jobs a DoneHistory reads again on every snapshot. finished_at is the time
# the outcome statement started; it commits milliseconds later, so a minute that ended this
# long ago has all its rows (the archiver deletes only far older ones), unless a transaction
# older than that is still open: then its start bounds what is settled (DoneHistory.update).
UNSETTLED_MINUTES = 5
MINUTE = timedelta(minutes=1)


def calendar_minute(at: datetime) -> datetime:
    """The calendar minute `at` falls in, as the database's date_bin gives it."""
    return at.astimezone(UTC).replace(second=0, microsecond=0)


TypeAttempts = tuple[str, int]  # (job type, attempts used)


class DoneHistory:
    """Done jobs per minute, type and attempts, kept between the snapshots of one reader.

    The first snapshot reads the whole last hour from the index; later ones read only the
    last UNSETTLED_MINUTES and keep the rest, so a reader refreshing every second pays for a
    few minutes of done jobs instead of an hour of them. Not shared between threads.
    """

    def __init__(self) -> None:
        self._settled: dict[datetime, dict[TypeAttempts, int]] = {}  # minute -> (type, attempts) -> jobs
        self._read_from: datetime | None = None  # first minute not settled yet

    @property
    def read_from(self) -> datetime | None:
        return self._read_from

    def update(
        self, taken_at: datetime, rows: list[Row], oldest_open: datetime | None = None
    ) -> dict[datetime, dict[TypeAttempts, int]]:
        """Fold in the rows (minute, type, attempts, jobs, recent) of one snapshot; return
        every minute of the last hour.

        `oldest_open` is when the oldest open transaction started: an outcome statement
        waiting on a lock (an index build, a LOCK TABLE) commits rows stamped with its
        start, so no minute from then on is settled while it is open.
        """
        current = calendar_minute(taken_at)
        window_start = current - 59 * MINUTE
        settle_before = current - UNSETTLED_MINUTES * MINUTE
        if oldest_open is not None:
            settle_before = min(settle_before, calendar_minute(oldest_open))
        fresh: dict[datetime, dict[TypeAttempts, int]] = {}
        for r in rows:
            counts = fresh.setdefault(calendar_minute(r["minute"]), {})
            key = (str(r["type"]), int(r["attempts"]))
            counts[key] = counts.get(key, 0) + int(r["jobs"])
        minutes = {m: c for m, c in self._settled.items() if m >= window_start}
        minutes.update(fresh)
        self._settled = {m: c for m, c in minutes.items() if m < settle_before}
        self._read_from = settle_before
        return minutes
