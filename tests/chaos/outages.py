"""Outages of a given length, the fixed waits the chaos tests share: an outage that begins a
given time into a job, and a partition that lasts a given time however long what runs within
it takes. Their lengths are what the tests are about, so these waits are on the clock."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from tests.netns import Topology
from tests.waits import hold


def outage_into_a_job(offset: float, seconds: float, down: Callable[[], None], up: Callable[[], None]) -> None:
    """`offset` seconds into a job that has just started, an outage of `seconds`: `down`,
    then `up` (also when interrupted)."""
    hold(offset, "the point in the job at which the outage begins")
    down()
    try:
        hold(seconds, "the outage")
    finally:
        up()


@contextlib.contextmanager
def cut_off_for(net: Topology, host: int, seconds: float) -> Iterator[float]:
    """Host `host` cut off for `seconds` from the cut (or for the block, if that takes longer):
    the block runs within the partition; yields the monotonic time of the cut."""
    with net.cut_off(host) as cut:
        yield cut
        hold(cut + seconds - time.monotonic(), "the rest of the partition")
