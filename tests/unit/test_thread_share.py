"""Idle workers lend their threads: each ThreadShare here stands for one worker process
(flock locks belong to open files, so two shares in one process exclude each other too)."""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from handler.thread_share import ThreadShare


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ThreadShare, ThreadShare]]:
    first = ThreadShare(tmp_path, threads=1, lend_after_s=0.0)
    second = ThreadShare(tmp_path, threads=2, lend_after_s=0.0)
    yield first, second
    first.close()
    second.close()


def idle(*shares: ThreadShare) -> None:
    """Each share through one batch, so each is marked idle from now."""
    for share in shares:
        with share.busy():
            pass


def test_each_worker_claims_its_own_slot(pair: tuple[ThreadShare, ThreadShare]) -> None:
    first, second = pair
    assert {first.slot, second.slot} == {0, 1}


def test_a_busy_worker_borrows_an_idle_siblings_threads(
    pair: tuple[ThreadShare, ThreadShare],
) -> None:
    first, second = pair
    idle(second)
    with first.busy(), first.borrowed() as threads:
        assert threads == 1 + 2


def test_a_pass_too_short_to_gain_runs_on_the_workers_own_threads(
    pair: tuple[ThreadShare, ThreadShare],
) -> None:
    """The first pass borrows (nothing is known yet); once a pass of 100 tokens took 2 ms on
    3 threads (2 x 3 / 1 / 100 = 0.06 ms per token on its own thread), 100 tokens (6 ms) run
    alone and 200 (12 ms, past the 10 ms threshold) borrow again."""
    first, second = pair
    idle(second)
    with first.busy():
        with first.borrowed(100) as threads:
            assert threads == 3
        first.record_pass(100, 2.0, threads)
        assert first.own_ms_per_token == pytest.approx(0.06)
        with first.borrowed(100) as threads:
            assert threads == 1
        with first.borrowed(200) as threads:
            assert threads == 3


def test_a_threshold_of_zero_borrows_for_every_pass(tmp_path: Path) -> None:
    first = ThreadShare(tmp_path, threads=1, lend_after_s=0.0, borrow_from_ms=0.0)
    second = ThreadShare(tmp_path, threads=1, lend_after_s=0.0)
    idle(second)
    first.record_pass(100, 0.5, 1)
    with first.busy(), first.borrowed(1) as threads:
        assert threads == 2
    first.close()
    second.close()


def test_the_cost_estimate_follows_the_recent_passes(
    pair: tuple[ThreadShare, ThreadShare],
) -> None:
    """A running average: one slow pass moves it a fifth of the way, and nothing counts a
    pass of no tokens."""
    first, _ = pair
    first.record_pass(100, 1.0, 1)
    first.record_pass(100, 6.0, 1)
    assert first.own_ms_per_token == pytest.approx(0.8 * 0.01 + 0.2 * 0.06)
    first.record_pass(0, 50.0, 1)
    assert first.own_ms_per_token == pytest.approx(0.8 * 0.01 + 0.2 * 0.06)


def test_a_sibling_that_never_ran_a_batch_lends_nothing(
    pair: tuple[ThreadShare, ThreadShare],
) -> None:
    """A worker is busy from its start until its first batch ends (it may still be loading)."""
    first, _ = pair
    with first.busy(), first.borrowed() as threads:
        assert threads == 1


def test_a_busy_sibling_lends_nothing(pair: tuple[ThreadShare, ThreadShare]) -> None:
    first, second = pair
    idle(first, second)
    with second.busy(), first.busy(), first.borrowed() as threads:
        assert threads == 1


def test_a_sibling_idle_for_less_than_the_lending_delay_lends_nothing(tmp_path: Path) -> None:
    first = ThreadShare(tmp_path, threads=1, lend_after_s=60.0)
    second = ThreadShare(tmp_path, threads=1, lend_after_s=60.0)
    idle(second)
    with first.busy(), first.borrowed() as threads:
        assert threads == 1
    first.close()
    second.close()


def test_threads_are_lent_to_one_borrower_at_a_time(tmp_path: Path) -> None:
    shares = [ThreadShare(tmp_path, threads=1, lend_after_s=0.0) for _ in range(3)]
    idle(shares[2])
    with shares[0].busy(), shares[1].busy():
        with shares[0].borrowed() as first, shares[1].borrowed() as second:
            assert sorted([first, second]) == [1, 2]
    for share in shares:
        share.close()


def test_borrowed_threads_are_given_back_after_the_pass(
    pair: tuple[ThreadShare, ThreadShare],
) -> None:
    first, second = pair
    idle(second)
    with first.busy():
        with first.borrowed():
            pass
        with second.busy(), first.borrowed() as threads:
            assert threads == 1


def test_a_lender_that_gets_work_waits_for_the_borrowers_pass_then_is_not_lent_again(
    pair: tuple[ThreadShare, ThreadShare],
) -> None:
    first, second = pair
    idle(second)
    entered, release = threading.Event(), threading.Event()

    def second_gets_a_batch() -> None:
        with second.busy():
            entered.set()
            release.wait(10)

    with first.busy():
        waiter = threading.Thread(target=second_gets_a_batch)
        with first.borrowed() as threads:
            assert threads == 3
            waiter.start()
            assert not entered.wait(0.2), "the lender ran while its threads were lent"
        assert entered.wait(5), "the lender did not get its threads back"
        with first.borrowed() as threads:
            assert threads == 1
        release.set()
        waiter.join(10)


def hold_a_slot_then_wait(folder: str, ready: object) -> None:
    share = ThreadShare(Path(folder), threads=1, lend_after_s=0.0)
    with share.busy():
        ready.set()  # type: ignore[attr-defined]
        time.sleep(60)


def test_a_dead_workers_slot_and_threads_are_free_again(tmp_path: Path) -> None:
    ready = multiprocessing.get_context("spawn").Event()
    worker = multiprocessing.get_context("spawn").Process(
        target=hold_a_slot_then_wait, args=(str(tmp_path), ready)
    )
    worker.start()
    try:
        assert ready.wait(30)
        survivor = ThreadShare(tmp_path, threads=1, lend_after_s=0.0)
        assert survivor.slot == 1
        worker.kill()
        worker.join(10)
        replacement = ThreadShare(tmp_path, threads=1, lend_after_s=0.0)
        assert replacement.slot == 0
        idle(replacement)
        with survivor.busy(), survivor.borrowed() as threads:
            assert threads == 2
        survivor.close()
        replacement.close()
    finally:
        worker.kill()
        worker.join(10)


def serve_one_batch_then_idle(folder: str, ready: object) -> None:
    """A worker that ran a batch and now idles, lending its thread, until it is killed."""
    share = ThreadShare(Path(folder), threads=1, lend_after_s=0.0)
    idle(share)
    ready.set()  # type: ignore[attr-defined]
    time.sleep(60)


@contextlib.contextmanager
def idle_worker_process(folder: Path) -> Iterator[multiprocessing.process.BaseProcess]:
    """A real worker process, idle after one batch; SIGKILLed at the end if still alive."""
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    worker = context.Process(target=serve_one_batch_then_idle, args=(str(folder), ready))
    worker.start()
    try:
        assert ready.wait(30), "the worker process did not start"
        yield worker
    finally:
        worker.kill()
        worker.join(10)


def kill(worker: multiprocessing.process.BaseProcess) -> None:
    """SIGKILL, as TorchServe stops a worker: no close(), its slot record left as it was."""
    worker.kill()
    worker.join(10)
    assert worker.exitcode == -signal.SIGKILL


def test_a_worker_killed_while_idle_lends_nothing(tmp_path: Path) -> None:
    """Its record still says idle; only its slot's lock tells it is gone. Until a
    replacement claims the slot (after loading its model on its own threads), a busy
    sibling must run on its own threads alone, or more threads than cores run."""
    busy_sibling = ThreadShare(tmp_path, threads=1, lend_after_s=0.0)
    with idle_worker_process(tmp_path) as lender:
        with busy_sibling.busy(), busy_sibling.borrowed() as threads:
            assert threads == 2, "the live idle worker should lend its thread"
        kill(lender)
        for _ in range(3):
            with busy_sibling.busy(), busy_sibling.borrowed() as threads:
                assert threads == 1, "a dead worker's thread was borrowed"
        replacement = ThreadShare(tmp_path, threads=1, lend_after_s=0.0)
        with busy_sibling.busy(), busy_sibling.borrowed() as threads:
            assert threads == 1, "a replacement lends nothing before its first batch ends"
        idle(replacement)
        with busy_sibling.busy(), busy_sibling.borrowed() as threads:
            assert threads == 2, "the replacement lends once it idles"
        replacement.close()
    busy_sibling.close()


def test_after_a_scale_down_the_removed_workers_threads_are_never_lent(tmp_path: Path) -> None:
    """Scaling three workers down to two kills one while idle and starts no replacement:
    the survivor borrows its live sibling's thread, never the removed worker's."""
    survivor = ThreadShare(tmp_path, threads=1, lend_after_s=0.0)
    with idle_worker_process(tmp_path) as kept, idle_worker_process(tmp_path) as removed:
        with survivor.busy(), survivor.borrowed() as threads:
            assert threads == 3
        kill(removed)
        for _ in range(3):
            with survivor.busy(), survivor.borrowed() as threads:
                assert threads == 2, "the removed worker's thread was borrowed"
            time.sleep(0.05)
        assert kept.is_alive()
    survivor.close()


def test_threads_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ThreadShare(tmp_path, threads=0)


def test_a_worker_runs_its_forward_on_an_idle_siblings_threads_too(tiny_worker) -> None:
    """The handler wiring: a worker alone keeps to its torch_threads; with an idle sibling
    registered beside it (as a second worker of the model would be), it borrows its thread
    for a pass worth it. The tiny model's passes are far below the default borrow_from_ms,
    so at the default they stay on the worker's own thread; at 0 they borrow."""
    import torch

    from tests.worker_harness import Sent, predict

    worker = tiny_worker(torch_threads=1)
    share = worker.handler.thread_share
    assert share is not None and share.threads == 1
    predict(worker.service, [Sent(b"a text on its own")])
    assert torch.get_num_threads() == 1
    sibling = ThreadShare(share.folder, threads=1, lend_after_s=0.0)
    idle(sibling)
    time.sleep(share.lend_after_ns / 1e9)
    predict(worker.service, [Sent(b"a short pass beside an idle sibling")])
    assert torch.get_num_threads() == 1 and share.own_ms_per_token is not None
    share.borrow_from_ms = 0.0
    predict(worker.service, [Sent(b"a text with an idle sibling")])
    assert torch.get_num_threads() == 2
    sibling.close()
    predict(worker.service, [Sent(b"the sibling is gone")])
    assert torch.get_num_threads() == 1


def test_share_idle_threads_false_keeps_each_worker_to_its_own(tiny_worker) -> None:
    assert tiny_worker(torch_threads=1, share_idle_threads=False).handler.thread_share is None


def test_a_folder_that_cannot_be_made_leaves_each_worker_its_own(tmp_path: Path) -> None:
    from handler.thread_share import open_thread_share

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert open_thread_share(blocker / ".thread-share", threads=1) is None


def test_a_worker_started_without_the_spin_setting_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """libgomp reads its spin count once, before the handler loads: the handler can only warn."""
    from handler.thread_share import SPIN_ENV, open_thread_share

    for name in [*SPIN_ENV, "OMP_WAIT_POLICY"]:
        monkeypatch.delenv(name, raising=False)
    share = open_thread_share(tmp_path / "unset", threads=1)
    assert share is not None
    share.close()
    assert any("GOMP_SPINCOUNT" in record.getMessage() for record in caplog.records)
    caplog.clear()
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    share = open_thread_share(tmp_path / "set", threads=1)
    assert share is not None
    share.close()
    assert not [record for record in caplog.records if record.levelname == "WARNING"]
