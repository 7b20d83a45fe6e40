"""Many new partition states (a topic created, a restart) are applied side by side (issue 50):
the logs are opened and the leaders' epochs flushed on several threads, each partition's
steps in order, with the same outcome as one by one."""

from __future__ import annotations

import threading

import pytest

from strata.cluster.image import PartitionState
from strata.common.scheduler import ImmediateScheduler
from strata.common.types import TopicPartition
from strata.log.log_config import LogConfig
from strata.log.log_manager import LogManager
from strata.replication import replica_manager as rm_module
from strata.replication.replica_manager import ReplicaManager

ME = 1
COUNT = 3 * rm_module.PARALLEL_APPLY_MIN


@pytest.fixture
def rm(tmp_path):
    manager = LogManager([tmp_path], LogConfig({}), scheduler=ImmediateScheduler())
    manager.startup()
    yield ReplicaManager(manager, lambda topic: COUNT, broker_id=ME, clustered=True)
    manager.shutdown()


def states(epoch: int = 0) -> dict[TopicPartition, PartitionState]:
    """COUNT partitions of "t", a third led here, every one replicated on 1, 2, 3."""
    return {TopicPartition("t", p): PartitionState(1 + p % 3, epoch, (1, 2, 3), (1, 2, 3), epoch)
            for p in range(COUNT)}


def test_many_new_states_open_their_logs_on_several_threads_at_once(rm):
    # two logs opened at the same time, else the barrier breaks: one by one would never pass it
    barrier = threading.Barrier(2, timeout=30)
    threads: set[str] = set()
    get_log = rm.get_log

    def opening(tp, create=None):
        threads.add(threading.current_thread().name)
        if tp.partition < 2:
            barrier.wait()
        return get_log(tp, create=create)

    rm.get_log = opening
    change = rm.apply_states(states())
    assert len(threads) > 1 and threading.current_thread().name not in threads
    led = [tp for tp, st in states().items() if st.leader == ME]
    assert list(change.became_leader) == led and change.stopped_leading == ()


def test_applied_side_by_side_every_partition_ends_as_one_by_one_would_leave_it(rm):
    rm.apply_states(states())
    rm.apply_states(states(epoch=3))   # a new epoch for every partition, all logs open
    for tp, st in states(epoch=3).items():
        assert rm.state(tp) == st and rm.is_leader(tp) == (st.leader == ME)
        cache = get_cache(rm, tp)
        # a leader stamped epoch 0 then 3 at its log end (0); a follower stamps nothing
        assert cache.latest_epoch() == (3 if st.leader == ME else None)
    gone = rm.apply_states({tp: None for tp in states()})
    assert sorted(gone.stopped_leading) == sorted(tp for tp, st in states().items()
                                                  if st.leader == ME)
    assert all(rm.state(tp) is None for tp in states())


def test_a_few_states_are_applied_on_the_callers_thread(rm):
    threads: set[str] = set()
    get_log = rm.get_log

    def opening(tp, create=None):
        threads.add(threading.current_thread().name)
        return get_log(tp, create=create)

    rm.get_log = opening
    few = dict(list(states().items())[:rm_module.PARALLEL_APPLY_MIN - 1])
    rm.apply_states(few)
    assert threads == {threading.current_thread().name}


def get_cache(rm, tp):
    return rm.get_log(tp).leader_epoch_cache
