"""The pieces of `make image-test` that need no container engine (lab/image.py): the request
checks against stub servers that answer right and
wrong, the management API read through an engine's `exec`, and the memory bookkeeping.
tests/integration/test_image.py runs the whole thing against a real image."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from bert_serve_server.config import free_port

from lab import image
from lab.image import CHECKS, CONTAINER_CHECKS, Target, run_checks
from tests import fake_engine
from tests.fake_engine import Reply, handler, served
from tests.stub_http import serving


def misbehaving(method: str, path: str, body: Any) -> Reply:
    """Every answer a little wrong: labels flipped, the empty item accepted, no v2, no metrics."""
    if (method, path) == ("GET", "/metrics"):
        return 200, "# nothing exported\n"
    if path == "/v2/models/bert/infer":
        return 404, {"code": 404, "type": "ModelNotFoundException"}
    if isinstance(body, dict) and "texts" in body:
        return 200, {"results": [{"label": "positive"} for _ in body["texts"]]}
    if isinstance(body, dict) and "text_pair" in body:
        return 400, {"error": {"code": "invalid_option"}}
    text = body.get("text", "") if isinstance(body, dict) else body
    return 200, {"label": "positive" if "joyless" in text else "negative"}


@contextmanager
def stub(answer: Callable[[str, str, Any], Reply]) -> Iterator[str]:
    with serving(handler(answer)) as url:
        yield url


def test_every_check_passes_on_an_image_that_answers_right() -> None:
    with stub(served) as url:
        outcomes = run_checks(Target(url, url))
    assert outcomes == {name: [] for name, _ in CHECKS}


def test_every_check_reports_what_a_misbehaving_image_got_wrong() -> None:
    """Each check finds its own problem, and one failure does not hide the others."""
    with stub(misbehaving) as url:
        outcomes = run_checks(Target(url, url))
    assert all(outcomes.values()), outcomes
    assert [problem.split(":")[0] for problem in outcomes["the README's examples"]] == [
        "raw text",
        "JSON text",
    ]
    assert "404" in outcomes["Open Inference Protocol (v2) over HTTP"][0]
    assert len(outcomes["Prometheus /metrics"]) == 2


def test_a_check_that_cannot_connect_is_an_outcome_not_a_crash() -> None:
    down = f"http://127.0.0.1:{free_port()}"
    outcomes = run_checks(Target(down, down))
    assert all("ConnectionError" in problems[0] for problems in outcomes.values())


FAKE_ENGINE = """\
import json, sys
args = sys.argv[1:]
assert args[:2] == ["exec", "box"] and args[2:4] == ["python3.11", "-c"], args
method, path, body, base = args[5:]
assert (method, path, base) == ("GET", "/models/bert", "http://127.0.0.1:8081"), args
print(200)
print(json.dumps([{"workers": [{"status": state} for state in sys.argv[0].split("-")[-1][:-3].split("_")]}]))
"""


@pytest.mark.parametrize(("states", "ready"), [("READY_READY", True), ("READY_UNLOADING", False)])
def test_workers_ready_reads_the_management_api_inside_the_container(
    tmp_path: Path, states: str, ready: bool
) -> None:
    engine = tmp_path / f"engine-{states}.py"
    engine.write_text(FAKE_ENGINE)
    container = image.Container(
        [sys.executable, str(engine)], "bert-serve:x", "box", 1, 2,
        {"management_address": "http://127.0.0.1:8081"}, {"cpus": "2", "memory": "1536m"},
    )  # fmt: skip
    assert image.workers_ready(container) is ready


def test_the_container_keeps_management_inside_and_publishes_inference_and_metrics() -> None:
    addresses = image.container_addresses()
    assert addresses["management_address"].startswith("http://127.0.0.1:")
    assert addresses["inference_address"].startswith("http://0.0.0.0:")
    assert addresses["metrics_address"].startswith("http://0.0.0.0:")


def test_process_roles() -> None:
    assert image.process_role("/usr/bin/java -cp x org.pytorch.serve.ModelServer") == "frontend"
    assert image.process_role("python3.11 /x/ts/model_service_worker.py --sock") == "worker"
    assert image.process_role("/bin/sh /usr/local/bin/bert-serve-entrypoint") == "sh"


def test_a_process_memory_in_mib() -> None:
    own = image.process_memory(psutil.Process(os.getpid()))
    assert own["rss_mib"] >= own["pss_mib"] > 0 and own["pid"] == os.getpid()


def test_the_grace_period_is_the_deployments(tmp_path: Path) -> None:
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text(
        "spec:\n  template:\n    spec:\n      terminationGracePeriodSeconds: 45\n"
    )
    assert image.grace_period_s(deployment) == 45


def test_the_whole_run_against_a_fake_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_image_test's steps in order against tests/fake_engine.py, whose `run` starts a
    stub of the image: the readiness probe not ready, then READY, the checks, the burst
    through the load generator, memory from the host, patient clients (fewer and shorter
    here), SIGTERM under load and exit code 0; the container is removed; then one whose model
    cannot load."""
    monkeypatch.setattr(image, "PATIENT_CLIENTS", 8)
    monkeypatch.setattr(image, "PATIENT_S", 1.0)
    monkeypatch.setattr(image, "ARCHIVE_SOURCE", tiny_archive(tmp_path / "bert.mar"))
    engine = [sys.executable, fake_engine.__file__, str(tmp_path)]
    said: list[str] = []
    result = image.run_image_test("bert-serve:x", engine, say=said.append)
    assert result["checks"] == [name for name, _ in (*CHECKS, *CONTAINER_CHECKS)]
    assert result["checks"][-1] == (
        "the server's commands work in the image: status, models, url, predict-url"
    )
    assert result["image_bytes"] == 123456 and result["stop_s"] < result["grace_s"]
    assert result["processes"] and result["processes"][0]["pss_mib"] > 0
    assert said[0].startswith("start with the pod's limits")
    stopped = [n for n, line in enumerate(said) if line.startswith("stopped with exit code 0")]
    assert stopped and "cannot load" in said[stopped[0] + 1]
    assert result["limits"] == image.pod_limits() and result["sized_from"] == image.sized_from()
    assert result["probe_not_ready_polls"] == 1 and not result["lost_under_stop"]
    assert set(result["patient"]["statuses"]) == {"200"}
    assert f"burst of {image.BURST_REQUESTS}" in said
    assert (tmp_path / f"bert-serve-image-test-{os.getpid()}.exit").read_text() == "0"
    assert result["unloadable"]["exit_code"] == 1
    assert image.UNKNOWN_MODEL_TYPE in result["unloadable"]["cause"]


def tiny_archive(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/config.json", json.dumps({"model_type": "bert"}))
        archive.writestr("handler/__init__.py", "")
    return path


def test_the_fake_engine_sees_its_stub_killed_as_an_engine_would(tmp_path: Path) -> None:
    """A stub that dies without recording its exit (SIGKILL from outside) is not running, its
    exit code is 137 and a stop of it fails at once, as with podman; before, it stayed
    "running" and a stop waited out the whole grace period. Its orphan stays a zombie where
    PID 1 reaps none, which counts as dead too."""
    engine = [sys.executable, fake_engine.__file__, str(tmp_path)]
    container = image.Container.of(engine, "bert-serve:x")
    container.start()
    try:
        pid = int(container.state("Pid"))
        assert container.state("Running") == "true"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while fake_engine.alive(pid):
            assert time.monotonic() < deadline, "SIGKILL did not end the stub"
            time.sleep(0.1)
        assert (container.state("Running"), container.state("ExitCode")) == ("false", "137")
        with pytest.raises(RuntimeError, match="not running"):
            container.run("kill", "--signal", "TERM", container.name)
    finally:
        container.remove()  # a stub still running (an assertion failed first) is killed


@pytest.mark.parametrize("known", [True, False])
def test_a_model_that_cannot_load_must_exit_non_zero_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, known: bool
) -> None:
    """Step 8 against the fake engine: the copy it mounts declares a type the engine's stub
    does not know, so the start fails with a traceback; a stub that knows it (a copy the step
    failed to break) keeps running and answering, and the step must say so."""
    engine = [sys.executable, fake_engine.__file__, str(tmp_path)]
    first = image.Container.of(engine, "bert-serve:x")
    monkeypatch.setattr(image, "ARCHIVE_SOURCE", tiny_archive(tmp_path / "bert.mar"))
    monkeypatch.setattr(image, "READY_TIMEOUT_S", 3.0)
    if known:
        monkeypatch.setattr(fake_engine, "KNOWN_MODEL_TYPES", ("bert", image.UNKNOWN_MODEL_TYPE))
        monkeypatch.setattr(
            image.Container, "run", lambda self, *args, **options: fake_run(tmp_path, args)
        )
        with pytest.raises(image.ImageTestFailed, match="still running"):
            image.unloadable_start(first, say=lambda line: None)
    else:
        got = image.unloadable_start(first, say=lambda line: None)
        assert got["exit_code"] == 1 and "`bert-serve-unknown`" in got["cause"]


def fake_run(state: Path, args: tuple[str, ...]) -> str:
    """The fake engine's verbs in this process (so a test can change what its stub knows)."""
    return fake_engine.VERBS[args[0]](state, list(args[1:]))


class PackagesContainer:
    """A container whose exec answers the installed-packages probe with ``found``."""

    name = "probe"

    def __init__(self, found: dict[str, list[str]]) -> None:
        self.found = found

    def run(self, *args: str, timeout: float = 120) -> str:
        assert args[:3] == ("exec", "probe", "python3.11") and args[4] == image.INSTALLED_PACKAGES
        return json.dumps(self.found)


@pytest.mark.parametrize(
    ("found", "problem"),
    [
        ({"dists": ["bert-serve-server"], "importable": ["bert_serve_server"]}, None),
        ({"dists": ["bert-serve-server"], "importable": ["bert_serve_server", "lab"]}, "lab"),
        ({"dists": [], "importable": ["bert_serve_server"]}, "distributions"),
        ({"dists": ["bert-serve", "bert-serve-server"], "importable": []}, "bert-serve"),
    ],
)
def test_the_image_must_hold_the_server_package_alone(found, problem) -> None:
    problems = image.installed_packages(PackagesContainer(found))  # type: ignore[arg-type]
    assert (not problems) == (problem is None)
    if problem:
        assert problem in " ".join(problems)
