"""The soak oracle's rules for which master version may answer a tuple (no Spark)."""

from __future__ import annotations

from tests.soak.trial import (
    Command,
    Crash,
    Outcome,
    StageSpec,
    StreamTuple,
    TrialPlan,
    _allowed,
)

# 0 deliver, 1 run (arrival, m@1), 2 master, 3 run (m@2), 4 backfill of interval 0 (m@3),
# 5 master, 6 drain (m@4)
COMMANDS = (
    Command("deliver"),
    Command("run"),
    Command("master"),
    Command("run", 1),
    Command(
        "backfill",
        1,
        ("backfill", "--start", "2024-01-01T00:00:00+00:00", "--end", "2024-01-01T01:00:00+00:00"),
    ),
    Command("master"),
    Command("drain", 2),
)
VERSIONS = {c: {"m": v} for c, v in enumerate((1, 1, 1, 2, 3, 3, 4))}


def plan(late_wait: str | None) -> TrialPlan:
    return TrialPlan(
        1, "/nowhere", 2, COMMANDS, Crash(1, "x"), (), "embedded", "baseline", late_wait, "auto",
        "sqlite",
    )  # fmt: skip


def stage(late: bool, short_wait: bool = False, in_state: bool = False) -> StageSpec:
    return StageSpec("enrich", "out", "m", ("mk", "name"), late, short_wait, in_state)


def arrived(interval: int) -> StreamTuple:
    return StreamTuple(1, 7, "v1", interval, 1)


def test_a_live_tuple_is_answered_from_its_arrival_version_unless_backfilled() -> None:
    has_key = dict.fromkeys((1, 2, 3, 4), True)
    assert _allowed(plan(None), stage(False), arrived(1), VERSIONS, has_key) == [Outcome(1)]
    # A backfill of its interval after it was answered re-joins it with the backfill's.
    assert _allowed(plan(None), stage(False), arrived(0), VERSIONS, has_key) == [Outcome(3)]


def test_a_late_tuple_is_answered_from_the_first_step_version_with_its_key() -> None:
    has_key = {1: False, 2: False, 3: False, 4: True}
    # Waiting at the backfill (not re-joined there), found at the drain's version 4.
    assert _allowed(plan("2h"), stage(True), arrived(0), VERSIONS, has_key) == [Outcome(4)]
    has_key = {1: False, 2: True, 3: True, 4: True}
    # Found by the run at version 2, then re-joined by the backfill at version 3.
    assert _allowed(plan("2h"), stage(True), arrived(0), VERSIONS, has_key) == [Outcome(3)]
    never = dict.fromkeys((1, 2, 3, 4), False)
    assert _allowed(plan("2h"), stage(True), arrived(1), VERSIONS, never) == [Outcome(None)]


def test_a_short_wait_may_expire_a_late_tuple_at_any_step_before_its_key_arrives() -> None:
    has_key = {1: False, 2: False, 3: False, 4: True}
    allowed = _allowed(plan("1s"), stage(True, short_wait=True), arrived(1), VERSIONS, has_key)
    assert allowed == [Outcome(4), Outcome(2, unmatched=True)]


def test_ssbj_may_answer_a_late_tuple_from_any_later_version_with_its_key_or_keep_it() -> None:
    """SSBJ keeps a late tuple in its state: it returns for a newer version and spends a
    cycle against it, so a version that came during its cycle may be skipped, and a
    backfill of its interval leaves it to the live steps if it waited then."""
    ssbj = stage(True, in_state=True)
    has_key = {1: False, 2: True, 3: False, 4: True}
    allowed = _allowed(plan("2h"), ssbj, arrived(1), VERSIONS, has_key)
    assert allowed == [Outcome(2), Outcome(4), Outcome(None)]
    # Interval 0 is backfilled at version 3 after it arrived: the backfill answers it if its
    # first cycle still ran, or re-joins its answer from version 2; if it waited then, the
    # live steps answer it (version 4) or it still waits.
    allowed = _allowed(plan("2h"), ssbj, arrived(0), VERSIONS, has_key)
    assert set(allowed) == {Outcome(3), Outcome(4), Outcome(None)}


# 0 deliver, 1 run (arrival of interval 0, m@1), 2 master, 3 stream of interval 1 (m@2),
# 4 master, 5 drain (m@3)
STREAMED = (
    Command("deliver"),
    Command("run"),
    Command("master"),
    Command("stream", 1, ("stream",), (1,)),
    Command("master"),
    Command("drain", 2),
)
STREAMED_VERSIONS = {c: {"m": v} for c, v in enumerate((1, 1, 1, 2, 2, 3))}


def streamed_plan(late_wait: str) -> TrialPlan:
    return TrialPlan(
        1, "/nowhere", 2, STREAMED, Crash(3, "x"), (), "embedded", "baseline", late_wait, "auto",
        "sqlite", stream=True,
    )  # fmt: skip


def test_a_stream_steps_in_each_micro_batch_at_the_version_before_it() -> None:
    """A tuple the stream delivers arrives there; its later micro-batches step at the same
    version, so they cannot find a late key but may expire a short wait. A tuple waiting
    since an earlier run is answered in the stream if its version has the key."""
    plan = streamed_plan("1s")
    assert plan.streamed == {1: 3}
    delivered = StreamTuple(1, 7, "v1", 1, 3)
    has_key = {1: False, 2: False, 3: True}
    short = stage(True, short_wait=True)
    assert _allowed(plan, short, delivered, STREAMED_VERSIONS, has_key) == [
        Outcome(3),
        Outcome(2, unmatched=True),
    ]
    assert _allowed(streamed_plan("2h"), stage(True), delivered, STREAMED_VERSIONS, has_key) == [
        Outcome(3)
    ]
    waiting = StreamTuple(2, 7, "v2", 0, 1)
    has_key = {1: False, 2: True, 3: True}
    assert _allowed(plan, stage(True), waiting, STREAMED_VERSIONS, has_key) == [Outcome(2)]
