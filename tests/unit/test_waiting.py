"""The shared wait helpers, on a manual clock (the async variant on real, very short times)."""

import asyncio

import pytest

from support.waiting import eventually, eventually_async, never


class ManualTime:
    """A clock that moves only when the helper sleeps; the pauses it was asked for."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def results(*values):
    """A check returning ``values`` in turn (an exception instance is raised)."""
    it = iter(values)

    def check():
        value = next(it)
        if isinstance(value, BaseException):
            raise value
        return value
    return check


def test_eventually_returns_the_first_truthy_result():
    t = ManualTime()
    assert eventually(results(0, None, [], "ready", "later"), "ready", timeout=5,
                      clock=t.clock, sleep=t.sleep) == "ready"
    assert len(t.pauses) == 3


def test_eventually_backs_off_from_a_millisecond_to_the_interval():
    t = ManualTime()
    with pytest.raises(AssertionError):
        eventually(lambda: False, "nothing", timeout=1, interval=0.01,
                   clock=t.clock, sleep=t.sleep)
    assert t.pauses[:5] == [0.001, 0.002, 0.004, 0.008, 0.01]
    assert max(t.pauses) == 0.01


def test_eventually_times_out_naming_what_and_the_last_result():
    t = ManualTime()
    calls = []

    def check():
        calls.append(t.now)
        return 0
    with pytest.raises(AssertionError, match=r"^the leader elected: not within 2 s \(last: 0\)"):
        eventually(check, "the leader elected", timeout=2, interval=0.5,
                   clock=t.clock, sleep=t.sleep)
    assert t.now == pytest.approx(102.0)          # not a pause beyond the deadline
    assert calls[-1] == pytest.approx(102.0)      # checked once more at the deadline


def test_eventually_appends_the_report_on_timeout():
    t = ManualTime()
    with pytest.raises(AssertionError, match=r"\(last: None\)\nbroker 1: dead$"):
        eventually(lambda: None, "x", timeout=1, report=lambda: "\nbroker 1: dead",
                   clock=t.clock, sleep=t.sleep)


def test_an_ignored_exception_counts_as_not_yet_and_is_reported_at_the_deadline():
    t = ManualTime()
    assert eventually(results(OSError("refused"), 7), "up", ignoring=OSError,
                      clock=t.clock, sleep=t.sleep) == 7
    with pytest.raises(AssertionError, match=r"last: OSError\('refused'\)") as failed:
        eventually(results(*[OSError("refused")] * 1000), "up", timeout=1, ignoring=(OSError,),
                   clock=t.clock, sleep=t.sleep)
    assert isinstance(failed.value.__cause__, OSError)


def test_an_exception_not_ignored_fails_at_once():
    t = ManualTime()
    with pytest.raises(KeyError):
        eventually(results(None, KeyError("bug"), True), "x", ignoring=OSError,
                   clock=t.clock, sleep=t.sleep)
    assert len(t.pauses) == 1


def test_never_polls_for_the_whole_period_including_its_end():
    t = ManualTime()
    seen = []
    never(lambda: seen.append(t.now), "a record tiered", during=1, interval=0.1,
          clock=t.clock, sleep=t.sleep)
    assert seen[0] == 100.0 and seen[-1] == pytest.approx(101.0)
    assert t.now == pytest.approx(101.0)


def test_never_fails_as_soon_as_the_check_is_truthy():
    t = ManualTime()
    with pytest.raises(AssertionError, match=r"^a record tiered \(after 0\.00 s: \{'tiered': 5\}\)"):
        never(results(False, None, {"tiered": 5}, False), "a record tiered", during=10,
              clock=t.clock, sleep=t.sleep)
    assert len(t.pauses) == 2


def test_eventually_async_lets_the_loop_run_while_it_waits():
    async def main():
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, done.set)
        assert await eventually_async(done.is_set, "the callback ran", timeout=1)
        with pytest.raises(AssertionError, match=r"^never: not within 0\.02 s \(last: False\)"):
            await eventually_async(lambda: False, "never", timeout=0.02)
    asyncio.run(main())
