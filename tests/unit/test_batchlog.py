"""``lab.batchlog.logged_batches``: the batch sizes a worker logged over a window of the model
log, whose last lines TorchServe's frontend may write after the answers have gone out."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from lab.batchlog import logged_batches

LINE = "2026-11-29T08:00:00,000 [INFO ] W-9000-bert_1.0-stdout MODEL_LOG - batch_size={} valid={}\n"


def test_the_window_waits_for_lines_written_after_the_answers(tmp_path: Path) -> None:
    """Counted at once, the window holds one batch of 2; the batch of 3 written 0.3 s later is
    waited for, and a line still being written (no newline yet) is left to the next window."""
    log = tmp_path / "model_log.log"
    log.write_text("earlier line\n" + LINE.format(2, 2))
    start = len("earlier line\n")

    def late() -> None:
        time.sleep(0.3)
        with log.open("a") as out:
            out.write(LINE.format(3, 3) + "batch_size=4 val")

    writer = threading.Thread(target=late)
    writer.start()
    sizes, end = logged_batches(log, start, 5)
    writer.join()
    assert sizes == [2, 3]
    assert end == log.stat().st_size - len("batch_size=4 val")
    with log.open("a") as out:
        out.write("id=4\n")
    assert logged_batches(log, end, 4) == ([4], log.stat().st_size)


def test_a_window_that_never_fills_returns_what_it_holds(tmp_path: Path) -> None:
    log = tmp_path / "model_log.log"
    log.write_text(LINE.format(1, 1))
    began = time.monotonic()
    assert logged_batches(log, 0, 2, within_s=0.2) == ([1], log.stat().st_size)
    assert time.monotonic() - began >= 0.2
