"""The leadership lease (``ZkSessionLease``, ``ALWAYS_HELD``) as kazoo's states drive it, and
the exponential backoff AlterPartition retries use. No ZooKeeper, no sleeps: the ZooKeeper
client's reports are called directly, in the orders kazoo makes them."""

from __future__ import annotations

import random

import pytest

from strata.cluster.zk.session_lease import ZkSessionLease
from strata.common.backoff import ExponentialBackoff
from strata.common.leadership_lease import ALWAYS_HELD


def held(lease) -> bool:
    return not lease.in_doubt()


class Recorder:
    """A listener that records ``in_doubt()`` as it reads it when called."""

    def __init__(self, lease):
        self.lease = lease
        self.seen: list[bool] = []
        lease.add_listener(lambda: self.seen.append(lease.in_doubt()))


def test_one_broker_is_never_in_doubt():
    assert not ALWAYS_HELD.in_doubt()
    ALWAYS_HELD.add_listener(lambda: pytest.fail("ALWAYS_HELD never changes"))
    assert not ALWAYS_HELD.in_doubt()


def test_the_lease_is_in_doubt_until_the_first_connection():
    lease = ZkSessionLease()
    assert lease.in_doubt()
    lease.connected()
    assert held(lease)


def test_a_suspended_connection_puts_the_lease_in_doubt_and_the_same_session_back_holds_it():
    lease = ZkSessionLease()
    lease.connected()
    heard = Recorder(lease)
    lease.suspended()
    assert lease.in_doubt()
    lease.suspended()            # kazoo may report it again: no second notice
    lease.connected()            # the same session: nothing expired, the lease is held
    assert held(lease)
    assert heard.seen == [True, False]


def test_after_an_expiry_the_lease_is_held_only_once_the_new_sessions_handlers_ran():
    lease = ZkSessionLease()
    lease.connected()
    heard = Recorder(lease)
    lease.suspended()
    token = lease.expired()
    lease.connected()            # a new session, but the broker has not re-registered yet
    assert lease.in_doubt()
    lease.session_initialized(token)
    assert held(lease)
    assert heard.seen == [True, False]


def test_handlers_of_an_earlier_session_do_not_hold_the_lease_after_a_later_expiry():
    lease = ZkSessionLease()
    lease.connected()
    first = lease.expired()
    lease.connected()
    second = lease.expired()     # lost again before the first new session's handlers finished
    lease.connected()
    lease.session_initialized(first)
    assert lease.in_doubt()
    lease.session_initialized(second)
    assert held(lease)


def test_the_new_sessions_handlers_do_not_hold_a_suspended_connection():
    lease = ZkSessionLease()
    lease.connected()
    token = lease.expired()
    lease.connected()
    lease.suspended()
    lease.session_initialized(token)
    assert lease.in_doubt()
    lease.connected()
    assert held(lease)


def test_a_closed_client_leaves_the_lease_in_doubt_for_good():
    lease = ZkSessionLease()
    lease.connected()
    heard = Recorder(lease)
    lease.close()
    lease.connected()
    assert lease.in_doubt()
    assert heard.seen == [True]


def test_listeners_are_called_through_notify_and_one_failing_does_not_stop_the_others():
    queued = []
    lease = ZkSessionLease(notify=queued.append)
    calls = []
    lease.add_listener(lambda: 1 / 0)
    lease.add_listener(lambda: calls.append(lease.in_doubt()))
    lease.connected()
    assert calls == []           # not on the reporting thread
    for task in queued:
        task()
    assert calls == [False]


# ---- ExponentialBackoff -----------------------------------------------------------------------

def test_the_backoff_doubles_from_the_first_delay_up_to_the_cap():
    b = ExponentialBackoff(100, 1000, jitter=0)
    assert [b.backoff_ms(n) for n in range(7)] == [100, 200, 400, 800, 1000, 1000, 1000]
    assert b.backoff_ms(10_000) == 1000    # no overflow however long the failures last


def test_the_jitter_spreads_each_delay_and_never_passes_the_cap():
    b = ExponentialBackoff(100, 1000, jitter=0.2, rng=random.Random(7))
    for n, base in enumerate([100, 200, 400, 800]):
        delays = {b.backoff_ms(n) for _ in range(200)}
        assert min(delays) >= base * 0.8 and max(delays) <= base * 1.2
        assert len(delays) > 10           # spread, not one value
    assert all(800 <= b.backoff_ms(9) <= 1000 for _ in range(200))


def test_a_backoff_out_of_range_is_refused():
    for args in [(-1, 10), (10, 100, 0.5), (10, 100, 2.0, 1.0)]:
        initial, cap, *rest = args
        kw = dict(zip(("multiplier", "jitter"), rest))
        with pytest.raises(ValueError):
            ExponentialBackoff(initial, cap, **kw)
