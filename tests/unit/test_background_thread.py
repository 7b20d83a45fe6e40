"""BackgroundThread: one lazily started thread for best-effort work."""

from __future__ import annotations

import threading

from strata.common.scheduler import BackgroundThread


def test_work_runs_in_submission_order_on_one_named_thread():
    bg = BackgroundThread("test-bg")
    seen: list[tuple[int, str]] = []
    done = threading.Event()
    for i in range(3):
        assert bg.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert bg.submit(done.set)
    assert done.wait(5)
    bg.close()
    assert [i for i, _ in seen] == [0, 1, 2]
    assert len({name for _, name in seen}) == 1 and seen[0][1].startswith("test-bg")


def test_close_cancels_what_has_not_started_and_waits_for_what_has():
    bg = BackgroundThread("test-bg")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocker() -> None:
        started.set()
        release.wait(5)
        ran.append("blocker")

    bg.submit(blocker)
    bg.submit(lambda: ran.append("queued"))
    assert started.wait(5)
    threading.Timer(0.05, release.set).start()
    bg.close()
    assert ran == ["blocker"]
    # a later submit starts a new thread
    again = threading.Event()
    assert bg.submit(again.set) and again.wait(5)
    bg.close()


def test_work_that_raises_is_logged_and_the_work_after_it_still_runs(caplog):
    bg = BackgroundThread("test-bg")
    done = threading.Event()

    def hint(segment: str) -> None:
        raise OSError(f"{segment} is gone")

    with caplog.at_level("DEBUG", logger="strata.common.scheduler"):
        assert bg.submit(hint, "seg-7")
        assert bg.submit(done.set)
        assert done.wait(5)
        bg.close()
    assert any("hint('seg-7',) failed: seg-7 is gone" in r.getMessage() for r in caplog.records)
