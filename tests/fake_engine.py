"""A stand-in for podman or docker, so lab/image.py's whole run can be tested where no
container engine works: ``python fake_engine.py STATE_DIR VERB ARGS...``.

``run`` starts a stub of the image in a process of its own, answering on the published host
ports as the image does (``served``); ``inspect``, ``exec`` (the management API's model
description, the readiness probe: not ready at first), ``kill``, ``stats``, ``logs`` and ``rm``
act on it. On SIGTERM the stub answers every connection it was sent (those still in the listen
backlog too), then exits 0 and records that, as the image's entrypoint does. As an engine
does, ``inspect`` reads the stub's process: a stub that died without recording its exit (a
signal) is not running, with code 137; ``logs`` holds what the stub wrote to stderr.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Reply = tuple[int, Any]


def served(method: str, path: str, body: Any) -> Reply:
    """What the image answers, in the shapes image-test reads."""
    if path == "/ping":
        return 200, {"status": "Healthy"}
    if (method, path) == ("GET", "/metrics"):
        return 200, "ts_inference_requests_total 3\nts_queue_latency_microseconds 9\n"
    if path == "/v2/models/bert/infer":
        return 200, {"outputs": [{"name": "label", "shape": [2], "data": ["positive", "negative"]}]}
    if isinstance(body, dict) and "texts" in body:
        results = [
            {"error": {"code": "empty_text"}} if not text else {"label": "positive"}
            for text in body["texts"]
        ]
        return 200, {"results": results}
    text = body.get("text", "") if isinstance(body, dict) else str(body)
    return 200, {"label": "negative" if "joyless" in text else "positive"}


def handler(answer: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def reply(self, method: str) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode()
            status, reply = answer(method, self.path, body)
            data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.reply("GET")

        def do_POST(self) -> None:  # noqa: N802
            self.reply("POST")

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


class StubServer(ThreadingHTTPServer):
    """One published port. Counts the connections it holds, from accept to the end of the
    answer, so that a stop can wait for every connection it was sent, the listen backlog's
    included."""

    # socketserver's default listen backlog is 5: with more clients connecting at once, the
    # kernel leaves the rest half-open outside the accept queue, where the count below cannot
    # see them, and the stop resets them. The image's clients are at most 256.
    request_queue_size = 1024

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), handler(served))
        self.lock = threading.Lock()
        self.open = 0

    def get_request(self) -> tuple[Any, Any]:
        # serve_forever calls this only when a connection waits, so accept does not block
        with self.lock:
            request = super().get_request()
            self.open += 1
        return request

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        with self.lock:
            self.open -= 1

    def idle(self) -> bool:
        """No connection being answered and none waiting to be accepted."""
        with self.lock:
            return self.open == 0 and not select.select([self.socket], [], [], 0)[0]


# The stop waits until every server has been idle for this long: what was sent before the
# signal is answered, a connection still in the listen backlog included. The image test's
# clients send nothing new once the signal is sent, so the only connections after it are
# those a client had already begun (one event-loop turn, milliseconds); 0.5 s is over 100x that
# even on a loaded 2-core machine. The wait itself is exact: it counts, it does not guess.
QUIET_S = 0.5
# A drain still running this long after SIGTERM writes every thread's stack to the stub's log
# (the image test's grace is 90 s): a hung stop then says where it hangs.
STACKS_AFTER_S = 30.0


def serve(exit_file: Path, ports: list[int]) -> None:
    """The stub image: one server per published port until SIGTERM, then, as the entrypoint
    drains, every connection it was sent answered, then exit 0. Any other end of its own
    records exit code 1 (the traceback is in its log)."""
    try:
        drain_on_sigterm([StubServer(port) for port in ports])
    except BaseException:
        exit_file.write_text("1")
        raise
    exit_file.write_text("0")


def drain_on_sigterm(servers: list[StubServer]) -> None:
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    faulthandler.dump_traceback_later(STACKS_AFTER_S)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < QUIET_S:
        time.sleep(0.02)
        if not all(server.idle() for server in servers):
            quiet_since = time.monotonic()
    for server in servers:
        server.shutdown()
        server.server_close()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan stays one where PID 1 reaps none)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Box:
    """One container: the stub's pid (``name.json``), its stderr (``name.log``) and, once it
    stopped, its exit code (``name.exit``), in the state folder."""

    def __init__(self, state: Path, name: str) -> None:
        self.record = state / f"{name}.json"
        self.exit_file = state / f"{name}.exit"
        self.log = state / f"{name}.log"

    @property
    def pid(self) -> int:
        return int(json.loads(self.record.read_text())["pid"]) if self.record.exists() else 0

    @property
    def running(self) -> bool:
        return self.record.exists() and not self.exit_file.exists() and alive(self.pid)

    @property
    def exit_code(self) -> str:
        """The stub's own record of its exit; 137, as an engine says, for one killed."""
        return self.exit_file.read_text() if self.exit_file.exists() else "137"


KNOWN_MODEL_TYPES = ("bert",)


def model_type(archive: str) -> str:
    with zipfile.ZipFile(archive) as mar:
        return str(json.loads(mar.read("model/config.json"))["model_type"])


def run(state: Path, args: list[str]) -> str:
    name = args[args.index("--name") + 1]
    box = Box(state, name)
    mounted = [args[i + 1].split(":")[0] for i, arg in enumerate(args) if arg == "--volume"]
    unknown = [kind for kind in map(model_type, mounted) if kind not in KNOWN_MODEL_TYPES]
    if unknown:  # the start's measurement fails to load it, and the container exits 1
        box.record.write_text(json.dumps({"pid": 0, "log": failed_load(unknown[0])}))
        box.exit_file.write_text("1")
        return name
    ports = [args[i + 1].split(":")[1] for i, arg in enumerate(args) if arg == "--publish"]
    command = [sys.executable, __file__, str(state), "serve", str(box.exit_file), *ports]
    with box.log.open("ab") as log:
        stub = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
        )
    box.record.write_text(json.dumps({"pid": stub.pid}))
    return name


def failed_load(kind: str) -> str:
    return (
        "measure: bert.mar (rates) failed:\nTraceback (most recent call last):\n"
        '  File "/tmp/handler/model.py", line 89, in load_model\n'
        f"ValueError: model type `{kind}` is not known\n"
        f"sizing: model bert:1.0 refused: ValueError: model type `{kind}` is not known"
    )


def logs(state: Path, args: list[str]) -> str:
    """The stub's stderr; or the log of a start that failed."""
    box = Box(state, args[-1])
    if box.record.exists() and "log" in json.loads(box.record.read_text()):
        return str(json.loads(box.record.read_text())["log"])
    return box.log.read_text() if box.log.exists() else ""


def inspect(state: Path, args: list[str]) -> str:
    box = Box(state, args[-1])
    return {
        "{{.State.Running}}": "true" if box.running else "false",
        "{{.State.Pid}}": str(box.pid),
        "{{.State.ExitCode}}": "0" if box.running else box.exit_code,
    }[args[args.index("--format") + 1]]


def exec_(state: Path, args: list[str]) -> str:
    """exec NAME python3.11 -c CODE method path body base: the model's description, or
    TorchServe's refusal of a workflow; exec NAME ls -A /tmp: an empty /tmp; exec NAME
    python3.11 -c INSTALLED_PACKAGES: what an image of the server package alone holds."""
    if args[1] == "ls":
        return ""
    if args[1:4] == ["python3.11", "-m", "bert_serve_server"] and args[4] != "ready":
        return f"{args[4]}: the stub's answer"  # status, models, url, predict-url
    if args[1:5] == ["python3.11", "-m", "bert_serve_server", "ready"]:
        # the readiness probe: not ready at its first call (the workers loading), then ready
        polls = state / f"{args[0]}.ready-polls"
        count = int(polls.read_text()) if polls.exists() else 0
        polls.write_text(str(count + 1))
        if count == 0:
            sys.exit(1)
        return ""
    if "find_spec" in args[3]:  # lab.image.INSTALLED_PACKAGES: the server package alone
        return json.dumps({"dists": ["bert-serve-server"], "importable": ["bert_serve_server"]})
    if args[4] == "POST" and args[5].startswith("/workflows?"):
        return "404\n" + json.dumps({"code": 404, "type": "WorkflowNotFoundException"})
    assert args[4:6] == ["GET", "/models/bert"], args
    return "200\n" + json.dumps([{"workers": [{"status": "READY"}] * 2, "batchSize": 8}])


def kill(state: Path, args: list[str]) -> str:
    box = Box(state, args[-1])
    if not box.running:  # as podman: "can only kill running containers"
        sys.exit(f"{args[-1]} is not running (exit code {box.exit_code})")
    os.kill(box.pid, signal.SIGTERM)
    return ""


def rm(state: Path, args: list[str]) -> str:
    box = Box(state, args[-1])
    if box.running:
        os.kill(box.pid, signal.SIGKILL)
    return ""


VERBS = {
    "run": run,
    "inspect": inspect,
    "exec": exec_,
    "kill": kill,
    "rm": rm,
    "cp": lambda state, args: "",
    "image": lambda state, args: "123456",  # image inspect --format {{.Size}} IMAGE
    "logs": logs,
}


if __name__ == "__main__":
    if sys.argv[2] == "serve":
        serve(Path(sys.argv[3]), [int(port) for port in sys.argv[4:]])
    else:
        print(VERBS[sys.argv[2]](Path(sys.argv[1]), sys.argv[3:]))
