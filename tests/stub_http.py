"""A throwaway local HTTP server for tests that stand in for one of TorchServe's endpoints."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[str, int], tuple[int, bytes]]
"""(path, the client's port) -> (status, body) for each GET or POST."""


@dataclass(frozen=True)
class Seen:
    """One request as the stub received it."""

    path: str
    client_port: int
    headers: dict[str, str]


@contextmanager
def stub_server(
    answer: Answer, keep_alive: bool = False, seen: list[Seen] | None = None
) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` answering each GET or POST with ``answer``, until the block
    ends; ``keep_alive`` speaks HTTP/1.1, so a client can send several requests on one
    connection; ``seen`` collects every request received."""

    class Stub(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if seen is not None:
                seen.append(Seen(self.path, self.client_address[1], dict(self.headers.items())))
            status, body = answer(self.path, self.client_address[1])
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815 (http.server's name)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Stub) as url:
        yield url


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` served by ``handler`` on a thread, until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
