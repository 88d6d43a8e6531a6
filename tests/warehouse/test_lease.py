"""The pipeline lease: one holder, stale leases taken over, fencing of a writer that lost it."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from common.errors import LeaseHeldError, LeaseLostError
from tests.conftest import REPO_ROOT
from warehouse.lease import LeaseRow, LeaseSettings, PipelineLease, owner_is_dead
from warehouse.state_store import StateStore

NO_WAIT = LeaseSettings(ttl_seconds=30, wait_seconds=0)


def set_lease(store: StateStore, **values: object) -> None:
    with store.transaction(guarded=False) as session:
        session.execute(update(LeaseRow).where(LeaseRow.name == "p").values(**values))


def test_one_holder_and_a_clear_message_for_the_second(state_store_url: str) -> None:
    store = StateStore(state_store_url)
    first = PipelineLease(store, "p", "run r1", NO_WAIT)
    second = PipelineLease(StateStore(state_store_url), "p", "run r2", NO_WAIT)
    with first:
        assert first.token == 1
        with pytest.raises(LeaseHeldError, match=r"pipeline 'p' is busy: run r1 holds") as held:
            second.acquire()
        assert first.owner in str(held.value)
        first.check()
    with second:
        assert second.token == 2  # every grant fences out the previous holder


def test_a_busy_lease_is_waited_for(state_store_url: str) -> None:
    store = StateStore(state_store_url)
    holder = PipelineLease(store, "p", "run r1", NO_WAIT)
    holder.acquire()
    try:
        # Expire the holder's grant from outside: the waiter takes over at its next poll.
        set_lease(store, expires_at=datetime.now(UTC) - timedelta(seconds=1))
        waiter = PipelineLease(
            StateStore(state_store_url), "p", "run r2", LeaseSettings(30, 5, poll_seconds=0.1)
        )
        with waiter:
            assert waiter.token == 2
            with pytest.raises(LeaseLostError, match="was lost"):
                holder.check()
    finally:
        # Stop the holder's heartbeat: left running, it renews against a dropped
        # database after the test, for the rest of the session.
        holder.release()


def test_lease_of_a_killed_process_is_taken_over_at_once(state_store_url: str) -> None:
    # A child takes the lease and dies without releasing it (as under SIGKILL).
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys\n"
            "from warehouse.state_store import StateStore\n"
            "from warehouse.lease import LeaseSettings, PipelineLease\n"
            "lease = PipelineLease(StateStore(sys.argv[1]), 'p', 'run killed',"
            " LeaseSettings(ttl_seconds=3600))\n"
            "lease.acquire()\n"
            "print(lease.owner, flush=True)\n"
            "os._exit(9)\n",
            state_store_url,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 9, child.stderr
    dead_owner = child.stdout.strip()
    assert owner_is_dead(dead_owner)
    lease = PipelineLease(StateStore(state_store_url), "p", "run r2", NO_WAIT)
    with lease:
        assert lease.token == 2


def test_a_live_holder_on_another_host_keeps_the_lease_until_it_expires(
    state_store_url: str,
) -> None:
    store = StateStore(state_store_url)
    seed = PipelineLease(store, "p", "seed", NO_WAIT)
    seed.acquire()
    try:
        set_lease(store, owner="elsewhere:1:1:x", expires_at=datetime.now(UTC) + timedelta(hours=1))
        with pytest.raises(LeaseHeldError, match="elsewhere"):
            PipelineLease(store, "p", "run r2", NO_WAIT).acquire()
        set_lease(store, expires_at=datetime.now(UTC) - timedelta(seconds=1))
        lease = PipelineLease(store, "p", "run r3", NO_WAIT)
        with lease:
            assert lease.token == 2
    finally:
        seed.release()


def test_a_fenced_out_writer_writes_nothing(state_store_url: str) -> None:
    store = StateStore(state_store_url)
    stale = PipelineLease(store, "p", "run r1", NO_WAIT)
    stale.acquire()
    store.save_operator_state("stage", {"step": 1})
    # The holder pauses past its expiry; another run takes over and writes.
    set_lease(store, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    other_store = StateStore(state_store_url)
    with PipelineLease(other_store, "p", "run r2", NO_WAIT):
        other_store.save_operator_state("stage", {"step": 7})
        # The paused writer resumes: every write and every commit check fails.
        with pytest.raises(LeaseLostError):
            store.save_operator_state("stage", {"step": 2})
        with pytest.raises(LeaseLostError):
            store.complete_step("stage", 5, 2, {"step": 2})
        with pytest.raises(LeaseLostError):
            stale.check()
    assert other_store.operator_state("stage") == {"step": 7}
    assert other_store.offset("stage").step_seq == 0
    stale.release()  # releasing a lost lease leaves the new holder's grant alone


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="ttl_seconds must be > 0"):
        LeaseSettings(ttl_seconds=0)
    with pytest.raises(ValueError, match="wait_seconds must be >= 0"):
        LeaseSettings(wait_seconds=-1)
