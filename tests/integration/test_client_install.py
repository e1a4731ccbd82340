"""`pip install` of this project into a clean venv gives the client and the `bert-serve`
command, with requests and tqdm and nothing of a server, and the command classifies against a
stub server. The wheel is built from a copy of what the distribution holds (pyproject.toml,
README.md, bert_serve/), so the build leaves nothing in the checkout; pip fetches requests and
tqdm from the package index (or its cache)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import venv
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

CLIENT_REQUIREMENTS = {"requests", "tqdm", "urllib3", "idna", "certifi", "charset-normalizer"}
SCORES = {"negative": 0.1, "positive": 0.9}
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


class StubHandler(BaseHTTPRequestHandler):
    """Answers POST /predictions/bert as the served model would, for a single text or a list."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prediction = {"label": "positive", "score": 0.9, "scores": SCORES}
        answer: dict[str, Any] = (
            {"results": [prediction] * len(body["texts"])} if "texts" in body else prediction
        )
        data = json.dumps(answer).encode()
        status = 200 if self.path == "/predictions/bert" else 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv with only this project's wheel installed, the way a user installs it."""
    root = tmp_path_factory.mktemp("client-install")
    source, wheels = root / "source", root / "wheels"
    shutil.copytree(ROOT / "bert_serve", source / "bert_serve", ignore=IGNORED)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*build, "--quiet", "-w", str(wheels), str(source)], check=True, timeout=300, cwd=root
    )
    (wheel,) = wheels.glob("bert_serve-*.whl")
    packed = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {name for name in packed if not name.endswith(".dist-info")} == {"bert_serve"}
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*install, str(wheel)], check=True, timeout=300, cwd=root)
    return root / "venv"


def installed(client_venv: Path) -> set[str]:
    listing = subprocess.run(
        [str(client_venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {entry["name"].lower() for entry in json.loads(listing.stdout)}


def test_the_clean_install_holds_the_client_and_its_two_dependencies(client_venv: Path) -> None:
    extra = installed(client_venv) - CLIENT_REQUIREMENTS - {"bert-serve", "pip", "setuptools"}
    assert not extra, f"the client pulled in {sorted(extra)}"


def test_bert_serve_classify_works_without_torch(client_venv: Path, stub_url: str) -> None:
    command = client_venv / "bin" / "bert-serve"
    help_text = subprocess.run(
        [str(command), "classify", "--help"], capture_output=True, text=True, timeout=60
    )
    assert help_text.returncode == 0 and "--file" in help_text.stdout
    done = subprocess.run(
        [str(command), "classify", "--url", stub_url, "A fine film."],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["label"] == "positive"
    in_process = (
        "import sys\n"
        "from bert_serve.cli import main\n"
        f"status = main(['classify', '--url', {stub_url!r}, '--no-progress', '--file', '-'])\n"
        "assert 'torch' not in sys.modules and 'bert_serve_server' not in sys.modules and 'lab' not in sys.modules\n"
        "sys.exit(status)\n"
    )
    lines = subprocess.run(
        [str(client_venv / "bin" / "python"), "-c", in_process],
        input="one\ntwo\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lines.returncode == 0, lines.stderr
    assert [json.loads(line)["label"] for line in lines.stdout.splitlines()] == ["positive"] * 2
