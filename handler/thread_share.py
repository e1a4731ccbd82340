"""Idle workers lend their torch threads to the busy ones of the same model (CPU only).

TorchServe's aggregator gives every request queued within ``maxBatchDelay`` to the first
free worker, so under bursty or closed-loop traffic one worker often takes a whole wave of
requests while its sibling idles, and half the CPU does nothing (docs/tune/README.md).

Each worker owns ``torch_threads`` threads' worth of CPU, represented by a lock file it
holds (``flock``) while it works on a batch. Before each forward pass a busy worker also
tries to lock the files of siblings that have been idle for at least ``lend_after_s``, and
runs that pass with their threads added to its own. So:

- the threads running at once never exceed the workers' own total (no oversubscription,
  which costs torch's spinning OpenMP threads several times their speed);
- a sibling that gets work back waits for its lock, at most one sub-batch of the borrower,
  and is never lent again while it is busy;
- a worker that dies releases its locks with its process; its slot is taken by the next one.

A slot's record alone never proves a lender: a worker that ends while idle (killed, or
stopped by a scale-down, which runs no cleanup of the handler) leaves "idle since T" behind. So a borrower
lends from a slot only while its ``worker-N.lock`` is held, which only a live worker does
(from its ``ThreadShare``, made once its model is loaded, until it exits). Finding that
lock free, the borrower holds it for an instant and clears the dead worker's record, so
it is read as unused from then on. A replacement that takes the slot after that check is
loaded already; its record says busy until its first batch, which waits for the
borrower's pass on the threads lock: the threads running at once stay within the total
of the live workers' own.

The files live in a folder the model's workers share (the extracted .mar's folder), so
servers and models never share threads with each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

MAX_SLOTS = 64
SLOT = struct.Struct("<qq")
"""Per worker slot: its own threads (0: never used) and when it went idle (ns; 0: busy)."""
DEFAULT_LEND_AFTER_S = 0.002
"""Idle this long before lending: longer than a loaded worker's gap between two batches
(answer, take the queued next batch: about 1 ms here), shorter than the time between one
worker's answer and its sibling's next forward pass at light load (about 3-4 ms here: the
client's round trip, maxBatchDelay, decoding), so a lone request runs on both threads."""
SPIN_ENV = {"GOMP_SPINCOUNT": "1000"}
"""The worker environment lending needs. After a parallel region torch's OpenMP (libgomp)
threads spin before they sleep, by default for 300,000 rounds, several ms. When the two
workers take turns at light load, the borrowing worker's spare thread still spins on the
core its sibling's next pass needs. 1,000 rounds still bridge the gaps between the operators
of one pass. libgomp reads it once, when torch is imported, and TorchServe's worker imports
torch before it loads the handler. So it is set where TorchServe is started
(``harness.server``, the image), and a worker without it logs a warning."""
DEFAULT_BORROW_FROM_MS = 10.0
"""Borrow only for a pass expected to take this long on the worker's own threads (the
handler setting ``borrow_from_ms``). Borrowed threads cost a fixed 2-3 ms per pass on a
2-core machine (OpenMP threads woken, then competing with the frontend and the client for
the cores) and save at most half of the pass: a one-layer model's lone request went from 7.0
to 10.1 ms p50 with borrowing (docs/bench/README.md, "The floor")."""
COST_WEIGHT = 0.2
"""The weight of the newest pass in the running estimate of a pass's cost per token."""


class ThreadShare:
    """One worker's view of the shared slots: claim one, mark busy/idle, borrow idle ones."""

    def __init__(
        self,
        folder: Path,
        threads: int,
        lend_after_s: float = DEFAULT_LEND_AFTER_S,
        borrow_from_ms: float = DEFAULT_BORROW_FROM_MS,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.threads = threads
        self.lend_after_ns = int(lend_after_s * 1e9)
        self.borrow_from_ms = borrow_from_ms
        self.own_ms_per_token: float | None = None
        """This worker's passes, in ms per padded token on its own threads (None: none yet)."""
        self._state_fd = os.open(folder / "slots", os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._state_fd).st_size < MAX_SLOTS * SLOT.size:
            os.ftruncate(self._state_fd, MAX_SLOTS * SLOT.size)
        self._state = mmap.mmap(self._state_fd, MAX_SLOTS * SLOT.size)
        self.slot, self._slot_fd = self._claim_slot()
        self._lock_fds: dict[int, int] = {}
        self._alive_fds: dict[int, int] = {}
        self._own_fd = self._lock_fd(self.slot)
        self._write(self.threads, idle_since=0)

    def _claim_slot(self) -> tuple[int, int]:
        """The first slot no live worker holds; held until this process ends."""
        for slot in range(MAX_SLOTS):
            fd = os.open(self.folder / f"worker-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return slot, fd
        raise RuntimeError(f"more than {MAX_SLOTS} workers share {self.folder}")

    def _lock_fd(self, slot: int) -> int:
        if slot not in self._lock_fds:
            path = self.folder / f"threads-{slot}.lock"
            self._lock_fds[slot] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._lock_fds[slot]

    def _alive(self, slot: int) -> bool:
        """Whether a live worker holds ``slot``; a dead one's record is cleared."""
        if slot not in self._alive_fds:
            path = self.folder / f"worker-{slot}.lock"
            self._alive_fds[slot] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fd = self._alive_fds[slot]
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        try:
            SLOT.pack_into(self._state, slot * SLOT.size, 0, 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return False

    def _write(self, threads: int, idle_since: int) -> None:
        SLOT.pack_into(self._state, self.slot * SLOT.size, threads, idle_since)

    def _read(self, slot: int) -> tuple[int, int]:
        threads, idle_since = SLOT.unpack_from(self._state, slot * SLOT.size)
        return int(threads), int(idle_since)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Around one batch: marked busy first (no one borrows from now on), then this
        worker's lock, which a borrower gives back after its current forward pass."""
        self._write(self.threads, idle_since=0)
        fcntl.flock(self._own_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._own_fd, fcntl.LOCK_UN)
            self._write(self.threads, idle_since=time.monotonic_ns())

    def worth_borrowing(self, tokens: int) -> bool:
        """Whether a pass of ``tokens`` padded tokens is expected to take ``borrow_from_ms``
        on this worker's own threads. Until a first pass is timed, it is. The estimate is per
        token, so a pass's fixed cost makes small passes look dearer: it errs toward
        borrowing."""
        if self.own_ms_per_token is None:
            return True
        return tokens * self.own_ms_per_token >= self.borrow_from_ms

    def record_pass(self, tokens: int, ms: float, threads: int) -> None:
        """A pass of ``tokens`` took ``ms`` on ``threads``: update the cost per token, scaled
        to this worker's own threads as if the borrowed ones had sped it up in proportion."""
        if tokens < 1 or threads < 1:
            return
        own = ms * threads / self.threads / tokens
        previous = self.own_ms_per_token
        self.own_ms_per_token = (
            own if previous is None else (1 - COST_WEIGHT) * previous + COST_WEIGHT * own
        )

    @contextlib.contextmanager
    def borrowed(self, tokens: int | None = None) -> Iterator[int]:
        """Around one forward pass inside ``busy``: yields the threads to run it with, its own
        and those of each sibling that is alive and idle long enough; only its own when the
        pass (``tokens`` padded tokens, if given) is too short to be worth borrowing for."""
        if tokens is not None and not self.worth_borrowing(tokens):
            yield self.threads
            return
        now = time.monotonic_ns()
        taken: list[int] = []
        threads = self.threads
        try:
            for slot in range(MAX_SLOTS):
                if slot == self.slot or not self._idle_threads(slot, now):
                    continue
                fd = self._lock_fd(slot)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                lent = self._idle_threads(slot, now) if self._alive(slot) else 0
                if not lent:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    continue
                taken.append(fd)
                threads += lent
            yield threads
        finally:
            for fd in taken:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _idle_threads(self, slot: int, now: int) -> int:
        """The slot's threads when its record says idle for ``lend_after_s``, else 0."""
        threads, idle_since = self._read(slot)
        if threads < 1 or idle_since == 0 or now - idle_since < self.lend_after_ns:
            return 0
        return threads

    def close(self) -> None:
        """Give the slot up (a dead process does the same implicitly)."""
        self._write(0, idle_since=0)
        self._state.close()
        for fd in [
            *self._lock_fds.values(),
            *self._alive_fds.values(),
            self._slot_fd,
            self._state_fd,
        ]:
            os.close(fd)
        self._lock_fds.clear()
        self._alive_fds.clear()


def open_thread_share(
    folder: Path, threads: int, borrow_from_ms: float = DEFAULT_BORROW_FROM_MS
) -> ThreadShare | None:
    """The worker's share, or None (with a warning) when its folder cannot be written."""
    try:
        share = ThreadShare(folder, threads, borrow_from_ms=borrow_from_ms)
    except OSError as error:
        logger.warning("idle workers will not lend threads: %s", error)
        return None
    logger.info("thread share: slot %d in %s, %d own thread(s)", share.slot, folder, threads)
    unset = [name for name in SPIN_ENV if name not in os.environ]
    if unset and "OMP_WAIT_POLICY" not in os.environ:
        logger.warning(
            "%s is not set where TorchServe started: lent threads keep spinning after each "
            "pass and slow the next one; start TorchServe with %s (docs/handler.md)",
            ", ".join(unset),
            " ".join(f"{name}={value}" for name, value in SPIN_ENV.items()),
        )
    return share
