"""A stand-in for TorchServe's Java frontend, so ``control.stop`` can be tested without Java:
``python fake_frontend.py STATE_DIR MODE WORKERS org.pytorch.serve.ModelServer``.

Its command line names the frontend's class, so ``Server.pid`` takes it for TorchServe's (the
real check reads ``/proc/<pid>/cmdline``). It starts WORKERS children (``sleep``, as its
workers) and only then writes its pid where TorchServe does (``STATE_DIR/tmp/.model_server.pid``),
so a test that sees the pid file sees the workers too. MODE says what it does on SIGTERM:

- ``ignore``: nothing; it and its workers ignore SIGTERM (a frontend that hangs in its stop);
- ``exit``: it stops its workers and exits 0, as TorchServe's frontend does;
- ``orphan``: it exits 0 and leaves its workers running, which ignore SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(state_dir: Path, mode: str, workers: int) -> None:
    ignore = mode in ("ignore", "orphan")
    children = [
        subprocess.Popen(
            ["sleep", "300"],
            # a disposition of SIG_IGN survives exec: the worker ignores SIGTERM too
            preexec_fn=(lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)) if ignore else None,
        )
        for _ in range(workers)
    ]

    def stopped(signum: int, frame: object) -> None:
        if mode == "exit":
            for child in children:
                child.terminate()
                child.wait()
        os._exit(0)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else stopped)
    pid_file = state_dir / "tmp" / ".model_server.pid"
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    partial = pid_file.with_suffix(".partial")
    partial.write_text(str(os.getpid()))
    partial.rename(pid_file)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
