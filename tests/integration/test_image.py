"""The container image, built and answering: `make image pod-test image-test` (scripts/image.sh;
then the Deployment as one pod under podman kube play: patient clients through the proxy, a
killed frontend, SIGTERM while clients open new connections, with 1 worker and with every sizing
value stated (2 workers, run and said), lab/pod.py; then python -m lab image-test, under the
pod's CPU and memory limits: the readiness probe false while the workers load, READY, the
README's requests, a list, a pair, v2, /metrics, the health check, memory, 256 patient clients
none refused, SIGTERM under load within the grace period with no accepted request lost; a
container whose model cannot load; the containers are always removed). The pod's start measures
the model as written; the image test's first container starts on what it measured
(``MEASURED``), as a container restarted in its pod does, sparing the second minute-long
measurement of the same image under the same limits.

Skips, saying why, where no container engine works (scripts/container_engine.sh): no podman,
or a docker client without an engine, and where a package archive the build fetches from
(Debian's mirror, PyPI) cannot be reached (scripts/image.sh says so). Otherwise a failed build
is a failure.

It runs after every other test (``runs_last``), and the build runs in its own process group,
killed whole when it runs past TIMEOUT_S, so a hung build leaves nothing running behind it.
Under `make test` the images are built beside the other tests (scripts/test.sh): their names
are in ``BERT_SERVE_TEST_IMAGES``, the build's output in ``BERT_SERVE_TEST_IMAGE_LOG`` and its
exit status in ``BERT_SERVE_TEST_IMAGE_STATUS``, judged here as this test's own build would be.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from bert_serve_server import probe, rules, sizing

from lab.image import pod_limits
from tests.conftest import ROOT, start_memory

# alone (scripts/test.sh): the pod's limits, 256 patient clients, stops within the grace
pytestmark = pytest.mark.alone

# From nothing (debootstrap base + first build + run) 7 to 12 min on a loaded machine of this
# project; a rebuild with nothing changed plus the run, 2.5 min (deploy/README.md).
TIMEOUT_S = 30 * 60
ARCHIVE_UNREACHABLE = re.compile(r"image: a package archive could not be reached.*")


def run_process_group(command: list[str], timeout_s: float) -> tuple[int, str]:
    """Run ``command`` in a session of its own; past ``timeout_s`` kill that whole group
    (make, the engine's client, debootstrap, pip) and fail with the output so far."""
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{' '.join(command)} ran past {timeout_s:.0f} s:\n{output[-6000:]}")
    return process.returncode, output


def built_beside() -> tuple[tuple[str, str], int, str] | None:
    """The images scripts/test.sh built beside the other tests, with that build's exit status
    and output; None where no build was made for this test."""
    names = os.environ.get("BERT_SERVE_TEST_IMAGES", "").split()
    if not names:
        return None
    image, proxy_image = names
    status = int(os.environ.get("BERT_SERVE_TEST_IMAGE_STATUS", "-1"))  # -1: never waited for
    log = Path(os.environ["BERT_SERVE_TEST_IMAGE_LOG"])
    output = log.read_text(errors="replace") if log.is_file() else f"{log} is missing"
    return (image, proxy_image), status, output


def check_build(returncode: int, output: str) -> None:
    """A build (or run) that failed for an unreachable package archive is a skip, saying so;
    any other failure fails the test with the end of its output."""
    unreachable = ARCHIVE_UNREACHABLE.search(output)
    if returncode != 0 and unreachable:
        pytest.skip(unreachable.group(0))
    assert returncode == 0, output[-6000:]


@pytest.mark.runs_last
def test_image_builds_answers_and_stops_cleanly() -> None:
    engine = subprocess.run(
        ["bash", "scripts/container_engine.sh"], cwd=ROOT, capture_output=True, text=True
    )
    if engine.returncode != 0:
        pytest.skip(f"no container engine: {engine.stderr.strip()}")
    built = built_beside()
    tag = f"test-{os.getpid()}"
    image, proxy_image = built[0] if built else (f"bert-serve:{tag}", f"bert-serve-proxy:{tag}")
    out = ROOT / "build" / "image" / f"image-test-{os.getpid()}.json"
    pod_out = ROOT / "build" / "image" / f"pod-test-{os.getpid()}.json"
    measured = ROOT / "build" / "image" / f"measured-{os.getpid()}"
    try:
        if built:
            check_build(*built[1:])
        returncode, output = run_process_group(
            ["make", "--no-print-directory", *([] if built else ["image"]), "pod-test",
             "image-test", f"IMAGE={image}", f"PROXY_IMAGE={proxy_image}", f"IMAGE_TEST_OUT={out}",
             f"POD_TEST_OUT={pod_out}", f"MEASURED={measured}"],
            TIMEOUT_S,
        )  # fmt: skip
        check_build(returncode, output)
        result = json.loads(out.read_text())
        assert result["ready_s"] > 0 and result["stop_s"] < result["grace_s"]
        roles = [process["role"] for process in result["processes"]]
        assert roles.count("frontend") == 1, roles
        # the entrypoint sized the workers for the container: this machine's cores and the
        # pod's limits, which the test ran under
        assert result["limits"] == pod_limits()
        cores = min(probe.read_machine(gpus=0).cores, float(result["limits"]["cpus"]))
        memory = int(result["limits"]["memory"].removesuffix("m")) * 2**20
        worker_bytes = sizing.budgeted_bytes(start_memory())
        expected = rules.workers_for(rules.Machine(cores, memory, 0), worker_bytes)[0]
        assert roles.count("worker") == expected, (roles, expected)
        assert result["probe_not_ready_polls"] > 0 and not result["lost_under_stop"]
        assert result["unloadable"]["exit_code"] != 0
        assert result["measured"].startswith("carried in") and any(measured.iterdir())
        pod = json.loads(pod_out.read_text())
        stated = pod["two_workers"]["stated"]
        assert (stated["workers"], stated["batchSize"]) == (2, 4), stated
        for stop in (pod["stop"], pod["two_workers"]["stop"]):
            assert set(stop["statuses"]) == {"200"} and stop["stop_s"] <= pod["grace_s"], stop
    finally:
        subprocess.run(
            [*engine.stdout.split(), "rmi", "--force", image, proxy_image],
            capture_output=True,
            timeout=120,
        )
        out.unlink(missing_ok=True)
        pod_out.unlink(missing_ok=True)
        shutil.rmtree(measured, ignore_errors=True)
