"""The diagnosis decides from values already read (reads/diagnosis.py): tables of scenes built
from the console's fixed data (tests/tui/fixtures.py), each changed in one thing, and what the
diagnosis says of them. The integration tests stage the same causes with real workers; these
hold the wording and the order, and the cases a real fleet is slow to reach."""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Any

from jobtui.reads.diagnosis import Diagnosis, diagnose, text_of, unanswered
from jobtui.reads.fleet import Fleet
from jobtui.reads.metrics import RunningGroup
from jobtui.reads.overview import QueueLine
from jobtui.reads.scene import Scene
from jobtui.reads.why import Expiries, Facts, Running, Waiting
from tests.tui import fixtures as fx


def scene(lines: list[QueueLine], fleet: Fleet | None = None, facts: Facts | None = None, **snap: Any) -> Scene:
    return Scene.of(replace(fx.snapshot(), **snap), lines, fleet or fx.fleet(), facts or Facts())


def causes(d: Diagnosis, kind: str, name: str) -> list[str]:
    found = next((s for s in d.subjects if (s.kind, s.name) == (kind, name)), None)
    return [] if found is None else [c.cause for c in found.causes]


def line(kind: str, name: str, due: int, **fields: Any) -> QueueLine:
    return replace(QueueLine(kind, name, due, due, 0, 0, 30.0 if due else None, None, None, None), **fields)


def test_a_queue_that_nothing_holds_is_healthy_and_says_its_forecast() -> None:
    worker = fx.process("w1", "worker", "h", 1, every_queue=10, types=["email.send"])
    d = diagnose(scene([line("queue", "default", 12)], Fleet([worker]), Facts(), flows=fx.flows()))
    [subject] = d.subjects
    assert subject.healthy and not d.waiting
    assert subject.summary == "nothing holds it: drains in ~1 min at 240/min"


def test_nothing_waiting_says_nothing() -> None:
    d = diagnose(scene([line("queue", "default", 0, ready=0)]))
    assert d.subjects == [] and not d.waiting and list(text_of(d))[:1] == []


def test_a_worker_of_an_earlier_release_holding_a_queues_jobs_is_not_called_missing() -> None:
    # No registered process serves `legacy`, but a worker without a row holds its jobs: it
    # may serve it; the diagnosis says what it cannot see instead of guessing.
    facts = Facts(running=[Running("old-1", "legacy", "t", 2, 0, 5.0, 3.0)])
    d = diagnose(
        scene(
            [line("queue", "legacy", 8, running=2)], Fleet([]), facts, running=[RunningGroup("t", "old-1", 2, 0, 1.0)]
        )
    )
    assert "no_live_worker" not in causes(d, "queue", "legacy")
    assert any("old-1" in said and "does not register" in said for said in d.cannot_see)
    [legacy] = d.subjects
    assert legacy.summary.startswith("nothing seen holds it: ")
    assert legacy.note == "old-1 (no row in the fleet: an earlier release) hold its jobs; what they serve is not seen"


def test_a_queue_held_by_quiet_workers_names_who_quieted_them() -> None:
    quiet = fx.process("w1", "worker", "h", 1, queues={"bulk": 2}, state="quiet", wanted="quiet",
                       ordered_by="ops@bastion", ordered_ago=30.0)  # fmt: skip
    d = diagnose(scene([line("queue", "bulk", 5)], Fleet([quiet])))
    [cause] = next(s for s in d.subjects if s.name == "bulk").causes
    assert cause.cause == "workers_quiet" and cause.key == "9 p"
    assert "w1 on h: quiet, quieted by ops@bastion 30s ago" in cause.evidence


def test_a_worker_whose_claims_stopped_while_it_has_room() -> None:
    stuck = fx.process("w1", "worker", "h", 1, queues={"bulk": 4}, poll=1.0, claim_gap=42.0)
    idle = stuck._replace(name="w2", id=2, claim_gap=0.3)
    d = diagnose(scene([line("queue", "bulk", 5)], Fleet([stuck, idle])))
    assert causes(d, "queue", "bulk") == ["worker_not_claiming"]
    # Busy (every slot taken), the same gap is no fault: it has no room to claim into.
    busy = Facts(running=[Running("w1", "bulk", "t", 4, 0, 50.0, 40.0)])
    assert "worker_not_claiming" not in causes(diagnose(scene([line("queue", "bulk", 5)], Fleet([stuck]), busy)),
                                               "queue", "bulk")  # fmt: skip


def test_a_paused_queue_is_named_alone_and_a_paused_type_before_the_full_slots() -> None:
    worker = fx.process("w1", "worker", "h", 1, every_queue=1, types=["a", "b"])
    facts = Facts(
        waiting=[Waiting(True, "q", "a", False, 3, 9.0, 1.0), Waiting(True, "q", "b", False, 2, 9.0, 1.0)],
        due_seen=5,
        running=[Running("w1", "q", "b", 1, 0, 2.0, 2.0)],
    )
    paused = line("type", "a", 3, paused_at=fx.NOW, paused_by="ops")
    lines = [line("queue", "q", 5, running=1), paused, line("type", "b", 2)]
    d = diagnose(scene(lines, Fleet([worker]), facts))
    assert causes(d, "queue", "q") == ["paused", "saturated"]
    assert causes(d, "type", "a") == ["paused"]  # nothing of it is claimed, wherever it waits
    held = next(s for s in d.subjects if s.name == "q").causes[0]
    assert held.jobs == 3 and held.about == ("type", "a")
    # The queue itself paused: what would slow its claims is beside the point.
    d = diagnose(scene([replace(lines[0], paused_at=fx.NOW, paused_by="ops"), *lines[1:]], Fleet([worker]), facts))
    assert causes(d, "queue", "q") == ["paused", "paused"]


def test_the_commands_a_cause_suggests_name_each_queue_as_one_word_of_the_shell() -> None:
    """A name is pasted, not run: `a; touch /tmp/pwned` stays one argument."""
    name = "a; touch /tmp/pwned $(id)"
    d = diagnose(scene([line("queue", name, 5, paused_at=fx.NOW, paused_by="ops")]))
    [paused] = next(s for s in d.subjects if s.name == name).causes
    assert paused.command is not None and shlex.split(paused.command) == ["jobtui", "queue", "resume", name]
    d = diagnose(scene([line("queue", name, 5)], Fleet([])))
    [nobody] = next(s for s in d.subjects if s.name == name).causes
    assert nobody.cause == "no_live_worker" and nobody.command is not None
    assert shlex.split(nobody.command)[-2:] == ["--queues", f"{name}=10"]
    assert shlex.quote(f"{name}=N") in nobody.action


def test_the_database_not_answering_is_all_it_says() -> None:
    d = unanswered("connection refused", 12.0)
    assert d.waiting and d.subjects == [] and d.general[0].cause == "database_not_answering"
    assert d.first() == (None, d.general[0])
    told = list(text_of(d))
    assert told[:3] == ["  CRIT: the database is not answering", "      connection refused",
                        "      the figures shown are 12s old"]  # fmt: skip


def test_expiries_of_other_jobs_on_several_workers_are_a_crash_loop_only_when_far_apart() -> None:
    worker = fx.process("w1", "worker", "h", 1, every_queue=10, types=["image.resize"])

    def named(first_ago: float) -> list[str]:
        expiries = Expiries("image.resize", 2, 2, 2, ["a", "b"], 30.0, first_ago, 0)
        facts = Facts(expiries=[expiries])
        lines = [line("queue", "default", 5), line("type", "image.resize", 5)]
        return causes(diagnose(scene(lines, Fleet([worker]), facts)), "type", "image.resize")

    assert "crash_loop" not in named(40.0)  # two workers lost together
    assert "crash_loop" in named(400.0)  # lost again after a restart, on other jobs


def test_a_rates_suggestion_is_a_rate_the_command_takes_and_no_lower_than_needed() -> None:
    from jobtui.kernel.rates import parse_rate

    worker = fx.process("w1", "worker", "h", 1, every_queue=10, types=["t1"])
    for rate, due in ((1 / 60, 10), (1 / 3600, 3), (0.02, 400), (800.0, 10_000)):
        lines = [line("queue", "default", due), line("type", "t1", due, rate=rate, rate_now=rate)]
        d = diagnose(scene(lines, Fleet([worker])))
        [cause] = [c for c in next(s for s in d.subjects if s.name == "t1").causes if c.cause == "rate_limit"]
        assert cause.command is not None
        suggested = parse_rate(shlex.split(cause.command)[-1])  # raises on a rate the command refuses
        assert suggested is not None and suggested >= cause.figures["suggested_rate_per_second"] * 0.999
        assert suggested >= max(1.5 * rate, due / 15 / 60), cause.command


def test_a_worker_of_an_earlier_release_hides_only_the_types_it_runs() -> None:
    # old-1 has no row and runs jobs of `t`: it may handle `t`. Nothing says it handles
    # `orphan`, so that type is still named as one no worker handles.
    worker = fx.process("w1", "worker", "h", 1, every_queue=4, types=["email.send"])
    facts = Facts(running=[Running("old-1", "default", "t", 2, 0, 5.0, 3.0)])
    lines = [line("queue", "default", 8, running=2), line("type", "t", 4, running=2), line("type", "orphan", 4)]
    d = diagnose(scene(lines, Fleet([worker]), facts, running=[RunningGroup("t", "old-1", 2, 0, 1.0)]))
    assert "no_handler" not in causes(d, "type", "t")
    assert "no_handler" in causes(d, "type", "orphan")


def test_jobs_not_due_in_a_queue_no_worker_serves_say_nothing_will_run_them() -> None:
    worker = fx.process("w1", "worker", "h", 1, queues={"other": 2}, types=["email.send"])
    d = diagnose(scene([line("queue", "later", 0, ready=8)], Fleet([worker])))
    [found] = d.subjects
    assert [c.cause for c in found.causes] == ["not_due", "no_live_worker"], found
    assert found.causes[1].level == "warn" and "nothing will run them" in found.causes[0].action
    assert d.waiting  # held for when they come due: why's exit code 1, as for a due backlog
    served = diagnose(scene([line("queue", "other", 0, ready=3)], Fleet([worker])))
    [subject] = served.subjects
    assert [c.cause for c in subject.causes] == ["not_due"]
    assert subject.causes[0].action == "nothing to do: they come due by themselves"


def test_a_worker_full_by_its_own_count_is_not_called_a_worker_that_stopped_claiming() -> None:
    # At the refresh its claim gap is from, it counted 4 of 4 slots in flight, though none of
    # its rows runs now: sync handlers running on in their threads after a cancel hold them.
    full = fx.process("w1", "worker", "h", 1, queues={"bulk": 4}, poll=1.0, claim_gap=42.0, in_flight=4)
    assert "worker_not_claiming" not in causes(
        diagnose(scene([line("queue", "bulk", 5)], Fleet([full]))), "queue", "bulk"
    )
    room = full._replace(in_flight=3)
    assert causes(diagnose(scene([line("queue", "bulk", 5)], Fleet([room]))), "queue", "bulk") == [
        "worker_not_claiming"
    ]
