"""The causes a backlog can have, each checked on a `Scene` (scene.py): what holds a queue or a
type now, with the evidence that shows it (figures with their units and ages) and the action
that fixes it. Each check says what it saw and nothing more; where the evidence is missing,
the diagnosis says what it cannot see (diagnosis.py).

A cause is about a queue, a type, or the database; the diagnosis gives it to every queue and
type whose due jobs it holds.

Names in the commands a cause suggests are quoted for a POSIX shell: a queue named
`a; rm -rf ~` is a name to paste, not a second command.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from shlex import quote
from typing import Any

from jobtui.kernel.rates import rate_at_least, rate_text
from jobtui.reads.fleet import Process
from jobtui.reads.metrics import TURN_KINDS
from jobtui.reads.scene import Key, Scene, names, plural, secs
from jobtui.reads.why import EXPIRY_WINDOW

# Most likely first: what stops every claim, then what stops some, then what slows them.
RANK = {
    "database_not_answering": 0,
    "paused": 10,
    # A crash loop before the workers it killed: their loss is what it does.
    "crash_loop": 15,
    "no_live_worker": 20,
    "workers_quiet": 20,
    "workers_stopping": 20,
    "workers_lost": 20,
    "no_handler": 30,
    "database": 50,
    "worker_not_claiming": 60,
    "concurrency_limit": 70,
    "rate_limit": 80,
    "saturated": 90,
    "some_workers_lost": 95,
    "not_due": 100,
}
# A worker that polls every `poll` seconds and has gone this long without an answered claim
# (at least NOT_CLAIMING_MIN seconds) while it has free slots is not claiming.
NOT_CLAIMING_POLLS = 10
NOT_CLAIMING_MIN = 5.0
# A claim running longer than this, or a lock waited for this long, holds the claims up.
SLOW = 2.0
# A turn at a limit's or a rate's lock lasts one claim's transaction, milliseconds: waited
# this long, something else holds that lock (a session left open on a bucket's row).
TURN_STUCK = 5.0
# A lease expiry counts toward a crash loop as long as why.py reads them back.
CRASH_MINUTES = round(EXPIRY_WINDOW / 60)
# Workers lost together (one host, one kill) have their leases reaped within about a lease
# of one another. Expiries of other jobs on several workers this far apart came back after a
# restart: the type kills what runs it. (The same job expiring again says so sooner.)
CRASH_SPREAD = 120.0
# A limit or a rate suggested drains the backlog in this many minutes besides the arrivals.
DRAIN_MINUTES = 15


@dataclass(frozen=True, slots=True)
class Cause:
    """One thing that holds due jobs, as an operator reads it."""

    cause: str  # one of RANK
    about: Key  # ("queue", NAME), ("type", NAME) or ("database", "")
    text: str  # one line, naming what it is about
    level: str  # crit, warn or info
    evidence: tuple[str, ...]  # what was seen, each a figure with its unit and age
    action: str  # what fixes it
    key: str | None = None  # where the console does it: "7 p" is pane 7, then p on the line
    command: str | None = None  # the command that does it
    goto: str | None = None  # the console's view of the fix: queue:NAME, type:NAME, workers, dead:TYPE
    figures: Mapping[str, Any] = field(default_factory=dict)
    jobs: int | None = None  # the subject's due jobs it holds (None: all of them)

    @property
    def rank(self) -> int:
        return RANK[self.cause]


def _due_text(n: int, estimated: bool) -> str:
    return f"~{n:,}" if estimated else f"{n:,}"


# -- a queue or a type paused ------------------------------------------------------------------


def paused(s: Scene, kind: str, name: str) -> Cause | None:
    line = s.line(kind, name)
    if line is None or not line.paused:
        return None
    pause = s.pauses.get((kind, name))
    by = (pause.paused_by if pause else None) or line.paused_by or "?"
    ago = pause.paused_ago if pause else None
    audit = f" (audit row {pause.audit_id})" if pause and pause.audit_id is not None else " (no audit row found)"
    evidence = [f"paused by {by} {secs(ago)} ago{audit}" if ago is not None else f"paused by {by}{audit}"]
    evidence.append(f"{_due_text(line.due, 'due' in line.estimated)} due jobs wait; the oldest {secs(line.oldest_age)}")
    return Cause(
        "paused", (kind, name), f"{kind} {name} is paused (by {by})", "crit", tuple(evidence),
        "resume it on every worker (u: with a ramp) once what it was paused for is fixed",
        key="7 p", command=f"jobtui {kind} resume {quote(name)}", goto=f"{kind}:{name}",
        figures={"paused_by": by, "paused_seconds_ago": ago, "audit_id": pause.audit_id if pause else None},
    )  # fmt: skip


# -- the workers that serve a queue --------------------------------------------------------------


def _serving_text(s: Scene) -> str:
    live = [p for p in s.fleet.live if p.claims]
    if not live:
        return "no live worker is registered"
    parts = [f"{p.name} serves {p.queues_text()}" for p in live[:4]]
    return "live workers: " + "; ".join(parts) + (f"; and {len(live) - 4} more" if len(live) > 4 else "")


def serving(s: Scene, queue: str) -> list[Cause]:
    """No live worker claims from `queue` now: none serves it, or those that do are quiet,
    stopping or lost. Workers of a release before the registry holding its jobs may serve it:
    then nothing is said (the diagnosis says it cannot see them)."""
    if s.fleet.serving(queue):
        return []
    if s.run_by_unregistered(queue=queue):
        return []
    line = s.line("queue", queue)
    due = (
        ""
        if line is None
        else f"{_due_text(line.due, 'due' in line.estimated)} due, the oldest {secs(line.oldest_age)}"
    )
    registered = [p for p in s.fleet.processes if p.claims and p.serves(queue)]
    quiet = [p for p in registered if p.live and p.state == "quiet"]
    stopping = [p for p in registered if p.live and p.state == "stopping"]
    lost = [p for p in registered if p.lost]
    if quiet:
        said = [f"{p.name} on {p.host}: quiet" + (f", quieted by {p.ordered_by} {secs(p.ordered_ago)} ago"
                if p.ordered_by else "") for p in quiet]  # fmt: skip
        return [Cause(
            "workers_quiet", ("queue", queue), f"every live worker serving queue {queue} is quiet", "crit",
            (*said, due), "resume them (9, then p on each), or start a worker for the queue",
            key="9 p", command=f"jobtui workers resume {quote(quiet[0].name)}", goto="workers",
            figures={"workers": [p.name for p in quiet]},
        )]  # fmt: skip
    if stopping:
        said = [f"{p.name} on {p.host}: stopping, {p.in_flight} in flight" for p in stopping]
        return [Cause(
            "workers_stopping", ("queue", queue), f"every live worker serving queue {queue} is stopping", "crit",
            (*said, due), f"start a worker that serves it: jobtui worker --app APP --queues {quote(queue + '=N')}",
            goto="workers", figures={"workers": [p.name for p in stopping]},
        )]  # fmt: skip
    if lost:
        return [_lost(s, queue, lost, every=True, due=due)]
    return [Cause(
        "no_live_worker", ("queue", queue), f"no live worker serves queue {queue}", "crit",
        (due, _serving_text(s)),
        f"start a worker that serves it (jobtui worker --app APP --queues {quote(queue + '=N')};"
        " no --queues serves every queue), or add it to a worker's --queues",
        command=f"jobtui worker --app APP --queues {quote(queue + '=10')}", goto="workers",
    )]  # fmt: skip


def _lost(s: Scene, queue: str, lost: list[Process], *, every: bool, due: str = "") -> Cause:
    said = []
    for p in lost[:4]:
        held = s.held_by(p.name, queue)
        jobs, expired = sum(r.jobs for r in held), sum(r.expired for r in held)
        hold = f"; it holds {plural(jobs, 'job')} of the queue, {expired} past their lease" if jobs else ""
        late = f"its row not refreshed for {secs(p.seen_ago)} (lost after {secs(p.lost_after)})"
        said.append(f"{p.name} on {p.host}: {late}{hold}")
    if every:
        text, level, cause = f"every worker serving queue {queue} is lost (not answering)", "crit", "workers_lost"
    else:
        are = "is" if len(lost) == 1 else "are"
        text, level = f"{plural(len(lost), 'worker')} serving queue {queue} {are} lost, holding its jobs", "warn"
        cause = "some_workers_lost"
    return Cause(
        cause, ("queue", queue), text, level, (*said, *([due] if due else [])),
        "see to the process on its host (frozen, stopped, killed or cut off) and restart it; its jobs go back to"
        " ready once their leases expire, through another worker's reaper",
        goto="workers", figures={"workers": [p.name for p in lost], "seen_seconds_ago": [p.seen_ago for p in lost]},
    )  # fmt: skip


def some_lost(s: Scene, queue: str) -> Cause | None:
    """Workers serving `queue` lost while others still serve it, holding jobs of it: those wait
    for their leases to expire."""
    if not s.fleet.serving(queue):
        return None
    lost = [p for p in s.fleet.lost if p.claims and p.serves(queue) and s.held_by(p.name, queue)]
    return _lost(s, queue, lost, every=False) if lost else None


def not_claiming(s: Scene, queue: str) -> list[Cause]:
    """Live workers serving `queue` whose rows are fresh, with free slots for it, that had
    gone without an answered claim for NOT_CLAIMING_POLLS polls at their last refresh."""
    found = []
    for p in s.fleet.serving(queue):
        if p.poll is None or p.claim_gap is None:
            continue
        bound = max(NOT_CLAIMING_MIN, NOT_CLAIMING_POLLS * p.poll)
        free = s.free(p, queue)
        # Full by its own count at that refresh, the refresh its claim gap is from: a worker
        # full of jobs, or of sync handlers that run on in their threads after their jobs were
        # cancelled or their leases lost (no longer its running rows), does not claim.
        if p.claim_gap <= bound or free <= 0 or p.in_flight >= p.slots_for(queue):
            continue
        since = "no claim answered since it started" if not p.claimed else "its last answered claim"
        found.append(Cause(
            "worker_not_claiming", ("queue", queue), f"worker {p.name} is alive but not claiming", "crit",
            (f"its row was refreshed {secs(p.seen_ago)} ago; at that refresh, {since} was {secs(p.claim_gap)} before"
             f" (it polls every {secs(p.poll)})",
             f"it has {free} of {p.slots_for(queue)} slots free for queue {queue}"),
            "a claim stuck (see the database), or a producer that stopped: stop it (9, then x) and let it restart",
            key="9 x", command=f"jobtui workers stop {quote(p.name)}", goto="workers",
            figures={"worker": p.name, "claim_gap_seconds": p.claim_gap, "poll_seconds": p.poll, "free_slots": free},
        ))  # fmt: skip
    return found


# -- what slows the claims of a served queue ------------------------------------------------------


def saturated(s: Scene, queue: str) -> Cause | None:
    """Every slot of the live workers serving `queue` is busy."""
    servers = s.fleet.serving(queue)
    capacity = sum(p.slots_for(queue) for p in servers)
    if not servers or capacity <= 0 or sum(s.free(p, queue) for p in servers) > 0:
        return None
    busy = names([f"{p.name} {s.busy(p, queue)}/{p.slots_for(queue)}" for p in servers])
    evidence = [f"all {plural(capacity, 'slot')} serving queue {queue} are busy: {busy}"]
    now, hour = s.run_time("queue", queue, True), s.run_time("queue", queue, False)
    running = s.running_age(queue)
    took = now[0] if now else None
    if now and hour:
        evidence.append(f"its jobs take {secs(now[0])} now ({plural(now[1], 'job')} sampled of the last 5 min),"
                        f" {secs(hour[0])} over the hour before ({plural(hour[1], 'job')} sampled)")  # fmt: skip
    elif now:
        evidence.append(f"its jobs take {secs(now[0])} now ({plural(now[1], 'job')} sampled of the last 5 min);"
                        " none sampled in the hour before")  # fmt: skip
    elif running is not None:
        before = f"; {secs(hour[0])} over the hour before ({plural(hour[1], 'job')} sampled)" if hour else ""
        evidence.append(f"no job of it done in the last 5 min; those running have run {secs(running)} on average"
                        f" so far{before}")  # fmt: skip
        took = running
    pace = s.pace("queue", queue)
    figures: dict[str, Any] = {"slots": capacity, "run_seconds_now": took,
                               "run_seconds_hour": hour[0] if hour else None}  # fmt: skip
    action = (
        f"give it more slots: more workers serving it (jobtui worker --app APP --queues {quote(queue + '=N')}),"
        " or more --concurrency"
    )
    if pace is not None:
        evidence.append(
            f"{pace.enqueued:,.0f}/min enqueued, {pace.done:,.0f}/min done over the last {secs(pace.window)}"
        )
        figures.update(enqueued_per_minute=pace.enqueued, done_per_minute=pace.done)
        if took is not None and pace.enqueued > 0:
            needed = math.ceil(pace.enqueued / 60.0 * took)
            figures["slots_needed"] = needed
            if needed > capacity:
                evidence.append(f"about {needed} slots keep up with {pace.enqueued:,.0f}/min at {secs(took)} a job:"
                                f" {needed - capacity} more than now")  # fmt: skip
                action = f"add {needed - capacity} slots serving it (more workers, or more --concurrency)"
    line = s.line("queue", queue)
    ahead = s.forecast("queue", queue, line.due if line is not None else 0)
    level = "crit" if ahead.state in ("growing", "stalled") else "warn"
    return Cause("saturated", ("queue", queue), f"every slot serving queue {queue} is busy", level, tuple(evidence),
                 action, goto="workers", figures=figures)  # fmt: skip


def _per_job(s: Scene, kind: str, name: str) -> float | None:
    """Seconds a job of a queue or type runs: the done ones of the last 5 minutes, else the hour."""
    found = s.run_time(kind, name, True) or s.run_time(kind, name, False)
    return found[0] if found else None


def limit(s: Scene, queue: str) -> Cause | None:
    """The queue's global limit is reached while jobs are due."""
    line = s.line("queue", queue)
    if line is None or line.max_running is None or line.due <= 0 or line.running < line.max_running:
        return None
    cap = line.max_running
    waits = s.snap.lock_waits_by_kind.get("queue_limit", 0)
    evidence = [f"{line.running:,} running of a limit of {cap:,} across every worker"]
    if waits:
        evidence.append(f"{plural(waits, 'claim')} waiting for their turn under the limit")
    pace, took = s.pace("queue", queue), _per_job(s, "queue", queue)
    per_slot = (pace.done / cap if pace is not None and pace.done > 0 and cap > 0
                else 60.0 / took if took else None)  # fmt: skip
    figures: dict[str, Any] = {"limit": cap, "running": line.running}
    command = None
    action = "raise the limit (7, then l on its line)"
    if pace is not None:
        evidence.append(
            f"{pace.enqueued:,.0f}/min enqueued, {pace.done:,.0f}/min done over the last {secs(pace.window)}"
        )
    if per_slot:
        arrivals = pace.enqueued if pace is not None else 0.0
        wanted = max(cap + 1, math.ceil((arrivals + line.due / DRAIN_MINUTES) / per_slot))
        figures.update(done_per_minute_per_job=per_slot, suggested_limit=wanted)
        evidence.append(f"each running job gets through {per_slot:,.1f}/min")
        action = (f"raise the limit to {wanted} (7, then l on its line): at that pace it keeps up"
                  f"{' with the arrivals' if pace is not None else ''} and drains the {line.due:,} due in"
                  f" ~{DRAIN_MINUTES} min")  # fmt: skip
        command = f"jobtui queue limit {quote(queue)} {wanted}"
    text = f"the limit of {cap:,} running at once holds queue {queue}" if cap else f"a limit of 0 holds queue {queue}"
    return Cause("concurrency_limit", ("queue", queue), text, "warn", tuple(evidence), action, key="7 l",
                 command=command, goto=f"queue:{queue}", figures=figures)  # fmt: skip


def rated(s: Scene, kind: str, name: str) -> Cause | None:
    """The queue's or type's rate lets through fewer jobs than wait: more are due than the
    rate's burst (two seconds' worth), so claims wait for tokens."""
    line = s.line(kind, name)
    if line is None or line.due <= 0 or (line.rate is None and not line.ramping):
        return None
    now = line.rate_now if line.rate_now is not None else line.rate
    if now is None or line.due <= max(1.0, 2.0 * now):
        return None
    evidence = [f"{line.due:,} due; the rate lets {rate_text(now)} through, across every worker"]
    ramp_left = None
    if line.ramping and line.ramp_until is not None:
        ramp_left = max(0.0, (line.ramp_until - s.snap.taken_at).total_seconds())
        top = f"to {rate_text(line.rate)}" if line.rate else "until it lets every job through"
        evidence.append(f"a resume's ramp raises it {top} over {secs(ramp_left)} more")
    waits = s.snap.lock_waits_by_kind.get("rate_limit", 0)
    if waits:
        evidence.append(f"{plural(waits, 'claim')} waiting for the rate's bucket")
    pace = s.pace(kind, name)
    arrivals = pace.enqueued if pace is not None else 0.0
    if pace is not None:
        evidence.append(
            f"{pace.enqueued:,.0f}/min enqueued, {pace.done:,.0f}/min done over the last {secs(pace.window)}"
        )
    wanted = max(now * 1.5, (arrivals + line.due / DRAIN_MINUTES) / 60.0)
    wanted = rate_at_least(wanted) if wanted < 10 else float(math.ceil(wanted))
    action = (f"raise the rate to {rate_text(wanted)} (7, then t on its line): it keeps up"
              f"{' with the arrivals' if pace is not None else ''} and drains the {line.due:,} due in"
              f" ~{DRAIN_MINUTES} min, if what it protects allows")  # fmt: skip
    if ramp_left is not None:
        action = (f"wait: the ramp lets the backlog back in slowly, by design, for {secs(ramp_left)} more; set a rate"
                  " (7, then t) to hold it after")  # fmt: skip
    # The rate as the command takes it: no thousands separator.
    command = (
        None if ramp_left is not None else f"jobtui {kind} rate {quote(name)} {rate_text(wanted).replace(',', '')}"
    )
    return Cause(
        "rate_limit", (kind, name), f"the rate of {rate_text(now)} holds {kind} {name}", "warn", tuple(evidence),
        action, key="7 t", command=command, goto=f"{kind}:{name}",
        figures={"rate_per_second": now, "suggested_rate_per_second": wanted},
    )  # fmt: skip


# -- a type ---------------------------------------------------------------------------------------


def unhandled(s: Scene, job_type: str) -> Cause | None:
    """No live worker's app handles `job_type`. A worker of a release before the registry that
    runs jobs of the type may handle it: then nothing is said, as for a queue (`serving`)."""
    line = s.line("type", job_type)
    if s.fleet.handling(job_type) or line is None or line.due <= 0:
        return None
    if s.run_by_unregistered(job_type=job_type):
        return None
    if not any(p.claims for p in s.fleet.live):
        return None  # no live worker at all: each queue says so
    types = sorted({t for p in s.fleet.live if p.claims for t in p.types})
    return Cause(
        "no_handler", ("type", job_type), f"no live worker's app handles type {job_type}", "crit",
        (f"{_due_text(line.due, 'due' in line.estimated)} due, the oldest {secs(line.oldest_age)}",
         f"the live workers handle {names(types, 6)}" if types else "no live worker is registered"),
        f"deploy workers whose app registers {job_type}, or cancel its jobs"
        f" (jobtui bulk cancel --type {quote(job_type)})",
        goto="workers",
    )  # fmt: skip


def unhandled_here(s: Scene, queue: str, job_type: str) -> Cause | None:
    """Workers serve `queue`, and others handle `job_type`, but none that serves the queue handles the type."""
    servers = s.fleet.serving(queue)
    handlers = s.fleet.handling(job_type)
    if not servers or not handlers or any(p.handles(job_type) for p in servers):
        return None
    where = names(sorted({q for p in handlers for q in p.queues if p.every_queue is None}) or ["every queue"])
    return Cause(
        "no_handler", ("queue", queue), f"no live worker serving queue {queue} handles type {job_type}", "crit",
        (f"{names([p.name for p in servers])} serve {queue}; their apps lack {job_type}",
         f"{names([p.name for p in handlers])} handle {job_type}, serving {where}"),
        f"give a worker that handles {job_type} the queue {queue} (--queues {queue}=N), or deploy the handler to"
        f" the workers of {queue}",
        goto="workers", figures={"type": job_type},
    )  # fmt: skip


def crash_loop(s: Scene, job_type: str) -> Cause | None:
    """Jobs of `job_type` keep ending in lease expiries: the same jobs again, or on several
    workers at moments far apart. Workers that died together, once, are lost, not looping."""
    e = s.expiries.get(job_type)
    if e is None or e.expiries < 2:
        return None
    if e.jobs >= e.expiries and (e.workers < 2 or e.first_ago - e.latest_ago < CRASH_SPREAD):
        return None
    evidence = [f"{plural(e.expiries, 'lease expiry', 'lease expiries')} of {plural(e.jobs, 'job')} in the last"
                f" {CRASH_MINUTES} min, on {plural(e.workers, 'worker')} ({names(e.worker_names)}), the latest"
                f" {secs(e.latest_ago)} ago" + (f"; {e.dead} went dead" if e.dead else "")]  # fmt: skip
    restarted = [p for p in s.fleet.processes if p.claims and (p.lost or p.up < CRASH_MINUTES * 60)]
    if restarted:
        evidence.append(
            f"{plural(len(restarted), 'worker')} of the fleet lost or started in the last {CRASH_MINUTES} min"
        )
    return Cause(
        "crash_loop", ("type", job_type), f"type {job_type} is in a crash loop: its workers die running it", "crit",
        tuple(evidence),
        "pause the type (7, then p on its line) and look at its jobs; cancel the one that kills its worker",
        key="7 p", command=f"jobtui type pause {quote(job_type)}", goto=f"type:{job_type}",
        figures={"expiries": e.expiries, "jobs": e.jobs, "workers": e.worker_names, "latest_seconds_ago": e.latest_ago},
    )  # fmt: skip


# -- the database ---------------------------------------------------------------------------------


def database(s: Scene) -> Cause | None:
    """Sessions wait for locks on jobtui's tables (a limit's or a rate's turn only when it has
    lasted past TURN_STUCK), or claims run slow."""
    snap, claims = s.snap, s.facts.claims
    alarming = {
        k: n
        for k, n in snap.lock_waits_by_kind.items()
        if n and (k not in TURN_KINDS or snap.longest_lock_wait_by_kind.get(k, 0.0) >= TURN_STUCK)
    }
    longest = max((snap.longest_lock_wait_by_kind.get(k, 0.0) for k in alarming), default=0.0)
    locked = bool(alarming) and longest >= SLOW
    slow = claims.claims > 0 and claims.longest >= SLOW and (bool(alarming) or claims.waiting == 0)
    if not locked and not slow:
        return None
    evidence = []
    if alarming:
        kinds = ", ".join(f"{k} {n}" for k, n in alarming.items())
        evidence.append(f"{plural(sum(alarming.values()), 'session')} wait for locks on jobtui's tables ({kinds}),"
                        f" the longest {secs(longest)}")  # fmt: skip
    if claims.claims:
        evidence.append(f"{plural(claims.claims, 'claim')} running, {claims.waiting} waiting for a lock, the longest"
                        f" for {secs(claims.longest)}")  # fmt: skip
    if snap.oldest_xact_age is not None:
        evidence.append(f"the oldest open transaction: pid {snap.oldest_xact_pid}, open {secs(snap.oldest_xact_age)}")
    holder = f" (pid {snap.oldest_xact_pid} holds the oldest transaction)" if snap.oldest_xact_pid else ""
    text = "claims wait for locks on jobtui's tables" if locked else "claims run slowly in the database"
    return Cause(
        "database", ("database", ""), text, "crit", tuple(evidence),
        f"find what holds the lock in pg_locks and pg_stat_activity{holder} and end it (pg_terminate_backend)",
        figures={"lock_waits": alarming, "longest_lock_wait_seconds": longest, "claims": claims.claims,
                 "claims_waiting": claims.waiting, "longest_claim_seconds": claims.longest},
    )  # fmt: skip


def not_answering(error: str, stale: float | None) -> Cause:
    """The database does not answer: nothing can be read, so nothing else can be said."""
    old = "no figures read yet" if stale is None else f"the figures shown are {secs(stale)} old"
    return Cause(
        "database_not_answering",
        ("database", ""),
        "the database is not answering",
        "crit",
        (error, old),
        "see to the database server and the network to it; workers wait and claim again once it answers",
    )


# -- not a backlog ------------------------------------------------------------------------------


def not_due(s: Scene, kind: str, name: str) -> Cause | None:
    """Ready jobs of which none is due: delayed, or retrying after a back-off."""
    line = s.line(kind, name)
    if line is None or line.due > 0 or line.ready <= 0:
        return None
    evidence = []
    for retrying, what in ((False, "delayed (run_at in the future)"), (True, "retrying after a failed attempt")):
        seen = s.later(kind, name, retrying)
        if seen:
            jobs = sum(w.jobs for w in seen)
            first, last = min(w.first for w in seen), max(w.last for w in seen)
            evidence.append(
                f"{plural(jobs, 'job')} {what}: the first due in {secs(first)}, the last seen in {secs(last)}"
            )
    if not evidence:
        evidence.append(f"none of them among the first {s.facts.scan} not due in claim order: they come due later")
    wait, whose = ("waits", "its") if line.ready == 1 else ("wait", "their")
    return Cause(
        "not_due", (kind, name), f"not a backlog: {plural(line.ready, 'job')} of {kind} {name} {wait} for {whose} time",
        "info", tuple(evidence), "nothing to do: they come due by themselves",
        command=f"jobtui jobs --{kind} {quote(name)} --status ready",
    )  # fmt: skip


def locked_out(message: str) -> Cause:
    """A queue table stayed locked past the read's lock timeout: nothing else could be read."""
    return Cause(
        "database",
        ("database", ""),
        "a queue table is locked: claims wait behind it",
        "crit",
        (message,),
        "find the session holding the table's lock (ALTER TABLE, VACUUM FULL, LOCK TABLE) and end it",
    )
