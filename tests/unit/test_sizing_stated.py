"""What a deployment states is run as stated: environment variables (bert_serve_server/sizing.py),
a saved plan (nothing measured), the edges of stated heaps and workers, the CPUs a
pod is paid for (probe.py), the command line's refusals (sizing.py) and the settings table
that lists the variables. Machines and measurements are faked; no model is loaded."""

from __future__ import annotations

import json
import threading
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from bert_serve_server import control, probe, rules, sizing
from bert_serve_server.config import effective_properties, properties_text, read_properties
from bert_serve_server.rules import Machine
from bert_serve_server.sizing import Stated, StatedValueError, quantity_bytes, read_stated

from tests.conftest import ROOT

GIB = 2**30
MIB = 2**20
WORKER = probe.WorkerMemory(peak_bytes=640 * MIB, uss_bytes=600 * MIB, pss_bytes=620 * MIB)


def fp32_chosen(*args: object) -> probe.PrecisionChoice:
    """The precision ``auto`` settles on, as a start would measure it (not measured here)."""
    return probe.PrecisionChoice("fp32", "fp32: not measured in this test")


RATE = 50.0


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An 8-core, 16 GiB machine whose worker holds ``WORKER`` and classifies ``RATE`` texts/s
    at every size; records each measurement ("rates ..." or "memory")."""
    calls: list[str] = []

    def rates(
        mar: str, mtime_ns: int, sizes: tuple[int, ...], threads: int, gpus: int, *_: object
    ) -> Any:
        calls.append(f"rates {sizes} x{threads}")
        return dict.fromkeys(sizes, RATE)

    def memory(mar: str, mtime_ns: int, **_: object) -> probe.WorkerMemory:
        calls.append("memory")
        return WORKER

    monkeypatch.setattr(sizing, "read_machine", lambda gpus: Machine(8, 16 * GIB, gpus))
    monkeypatch.setattr(sizing, "measured_rates", rates)
    monkeypatch.setattr(sizing, "measured_precision", fp32_chosen)
    monkeypatch.setattr(sizing, "measured_memory", memory)
    return calls


def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any measurement from here on fails the test: no child process may start."""

    def refuse(*args: object) -> Any:
        raise AssertionError(f"a measurement was started: {args}")

    monkeypatch.setattr(probe, "in_fresh_process", refuse)
    monkeypatch.setattr(sizing, "measured_rates", refuse)
    monkeypatch.setattr(sizing, "measured_precision", refuse)
    monkeypatch.setattr(sizing, "measured_device_load", refuse)
    monkeypatch.setattr(sizing, "measured_memory", refuse)


def store(tmp_path: Path) -> dict[str, str]:
    """The shipped config serving a .mar with a model folder in ``tmp_path``."""
    with zipfile.ZipFile(tmp_path / "bert.mar", "w") as archive:
        archive.writestr("model/config.json", "{}")
    return effective_properties({"model_store": str(tmp_path)})


def entry_of(resolved: sizing.Resolved) -> dict[str, Any]:
    (entry,) = json.loads(resolved.properties["models"])["bert"].values()
    return dict(entry)


def test_environment_variables_are_read_with_their_units() -> None:
    stated = read_stated(
        {
            "BERT_SERVE_CORES": "2.5",
            "BERT_SERVE_MEMORY": "4Gi",
            "BERT_SERVE_WORKERS": "2",
            "BERT_SERVE_HEAP": "2g",
            "BERT_SERVE_QUEUE": " ",
            "OTHER": "9",
        }
    )
    assert stated == Stated(cores=2.5, memory_bytes=4 * GIB, workers=2, heap_mib=2048)
    assert quantity_bytes("1536Mi") == 1536 * MIB and quantity_bytes("2G") == 2 * 10**9
    assert read_stated({"BERT_SERVE_HEAP": "512"}).heap_mib == 512, "MiB without a unit"
    assert read_stated({"BERT_SERVE_HEAP": "1G"}).heap_mib == 1024, "as -Xmx reads it"
    for bad in ({"BERT_SERVE_WORKERS": "0"}, {"BERT_SERVE_MEMORY": "lots"}):
        with pytest.raises(StatedValueError, match=next(iter(bad))):
            read_stated(bad)


def test_stated_settings_win_and_say_so(measured: list[str], tmp_path: Path) -> None:
    """Workers, threads, batch size, queue and heap from the environment: run as stated,
    printed as stated, and nothing measured that they decide (the rate is not needed)."""
    stated = Stated(workers=2, threads=3, batch_size=16, queue=500, heap_mib=1024)
    resolved = sizing.resolve(store(tmp_path), gpus=0, stated=stated)
    assert {k: entry_of(resolved)[k] for k in ("minWorkers", "maxWorkers", "batchSize")} == {
        "minWorkers": 2,
        "maxWorkers": 2,
        "batchSize": 16,
    }
    assert resolved.torch_threads == 3
    assert resolved.properties["job_queue_size"] == "500"
    assert rules.heap_mib_in(resolved.properties["vmargs"]) == 1024
    for line in ("workers 2 (BERT_SERVE_WORKERS)", "threads 3 (BERT_SERVE_THREADS)"):
        assert f"stated: {line}" in resolved.reasons
    assert measured == []


def test_stated_cores_and_memory_replace_the_machines(measured: list[str], tmp_path: Path) -> None:
    resolved = sizing.resolve(store(tmp_path), gpus=0, stated=Stated(cores=2, memory_bytes=4 * GIB))
    assert (entry_of(resolved)["minWorkers"], resolved.torch_threads) == (2, 1)
    heap = rules.heap_mib_in(resolved.properties["vmargs"])
    assert heap is not None
    assert (
        heap + 2 * sizing.budgeted_bytes(WORKER) / MIB + rules.FRONTEND_NON_HEAP_BYTES / MIB <= 4096
    )


def test_a_saved_plan_is_used_as_stated_and_nothing_is_measured(
    measured: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One start measures and writes its plan; another, given the plan (BERT_SERVE_PLAN),
    writes the same config and threads without starting any measurement."""
    config = tmp_path / "config.properties"
    config.write_text(properties_text(store(tmp_path)))
    plan, first, second = tmp_path / "plan.json", tmp_path / "first", tmp_path / "second"
    assert (
        sizing.main(
            ["--out", str(first), "--plan-out", str(plan), "--", "--ts-config", str(config)], {}
        )
        == 0
    )
    assert measured, "the first start measured"
    saved = json.loads(plan.read_text())
    assert saved["models"]["bert"]["1.0"]["minWorkers"] == 8 and saved["why"]
    no_measuring(monkeypatch)
    environ = {"BERT_SERVE_PLAN": str(plan)}
    assert sizing.main(["--out", str(second), "--", "--ts-config", str(config)], environ) == 0
    planned, measured_here = read_properties(second), read_properties(first)
    assert json.loads(planned.pop("models")) == json.loads(measured_here.pop("models"))
    assert planned == measured_here


def test_a_plan_is_taken_even_on_another_machine(measured: list[str], tmp_path: Path) -> None:
    """Every replica runs the plan, whatever its node: a 2-core machine keeps 8 workers."""
    plan = tmp_path / "plan.json"
    resolved = sizing.resolve(store(tmp_path), gpus=0)
    sizing.write_plan(plan, resolved, store(tmp_path))
    measured.clear()
    elsewhere = sizing.resolve(store(tmp_path), gpus=0, stated=Stated(cores=2, plan=plan))
    assert entry_of(elsewhere)["minWorkers"] == 8
    assert elsewhere.properties["job_queue_size"] == resolved.properties["job_queue_size"]
    assert measured == []
    assert any(reason.startswith("plan ") for reason in elsewhere.reasons)


def test_xms_without_xmx_is_a_floor_for_the_derived_heap(
    measured: list[str], tmp_path: Path
) -> None:
    """-Xms4g alone: the heap sized here would be smaller, and an -Xmx under -Xms stops the
    JVM; the -Xmx added is at least -Xms."""
    properties = store(tmp_path) | {"vmargs": "-Xms4g", "job_queue_size": "100"}
    resolved = sizing.resolve(properties, gpus=0)
    vmargs = resolved.properties["vmargs"]
    assert vmargs.startswith("-Xms4g -XX:+UseG1GC -Xmx") and rules.heap_mib_in(vmargs) == 4096
    assert any("-Xms" in reason for reason in resolved.reasons)


def test_an_xmx_under_xms_is_refused(measured: list[str], tmp_path: Path) -> None:
    with pytest.raises(rules.StatedError, match="JVM refuses"):
        sizing.resolve(store(tmp_path) | {"vmargs": "-Xms2g -Xmx1g"}, gpus=0)


@pytest.mark.parametrize("vmargs", ["-Xmx256m", "-Xmx200m", "-Xmx260m"])
def test_a_small_stated_heap_is_refused_not_given_a_queue_of_one(
    measured: list[str], tmp_path: Path, vmargs: str
) -> None:
    """A heap at or near the frontend's own 256 MiB holds fewer 1 MiB requests than the 8
    workers take at once: refused with the heap that would do, not run with a queue of 1."""
    request = rules.queued_request_bytes(2**20)
    least = rules.heap_holding(8 * request, rules.G1, request)
    assert least == 273, "8 bodies of 1 MiB, 2 MiB each in G1's 1 MiB regions"
    with pytest.raises(rules.StatedError, match=f"state at least {least} MiB"):
        sizing.resolve(store(tmp_path) | {"vmargs": vmargs}, gpus=0)


def test_stated_workers_that_leave_no_room_for_a_queue_are_refused(
    measured: list[str], tmp_path: Path
) -> None:
    """2 workers stated in a 1536 MiB pod whose workers hold 736 MiB each (budgeted): the heap
    that memory leaves holds no 1 MiB request past the frontend's own (it ran with a queue of
    1, and nearly every request got a 503); refused with what would run. A stated queue is
    the operator's to answer for: it runs."""
    pod = Stated(cores=2, memory_bytes=1536 * MIB, workers=2)
    with pytest.raises(rules.StatedError, match="the workers' 1472 MiB leave a heap of 256 MiB"):
        sizing.resolve(store(tmp_path), gpus=0, stated=pod)
    queued = sizing.resolve(store(tmp_path), gpus=0, stated=replace(pod, queue=64))
    assert queued.properties["job_queue_size"] == "64"
    assert (
        entry_of(sizing.resolve(store(tmp_path), gpus=0, stated=replace(pod, workers=1)))[
            "minWorkers"
        ]
        == 1
    )


def test_a_small_heap_is_refused_by_the_command_line_in_one_line(
    measured: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.properties"
    config.write_text(properties_text(store(tmp_path) | {"vmargs": "-Xmx256m"}))
    assert sizing.main(["--out", str(tmp_path / "out"), "--", "--ts-config", str(config)], {}) == 1
    assert capsys.readouterr().err.startswith("sizing: a heap of 256 MiB is stated")


def test_max_workers_alone_caps_the_workers(measured: list[str], tmp_path: Path) -> None:
    properties = store(tmp_path)
    models = json.loads(properties["models"])
    models["bert"]["1.0"]["maxWorkers"] = 3
    resolved = sizing.resolve(properties | {"models": json.dumps(models)}, gpus=0)
    assert (entry_of(resolved)["minWorkers"], entry_of(resolved)["maxWorkers"]) == (3, 3)
    assert resolved.torch_threads == 2, "8 cores shared by 3 workers"
    assert any("stated maxWorkers" in reason for reason in resolved.reasons)


def test_a_config_with_continuation_lines_is_sized(measured: list[str], tmp_path: Path) -> None:
    """TorchServe's documented multi-line models= (Java properties' continuation lines)."""
    store(tmp_path)
    config = tmp_path / "config.properties"
    config.write_text(
        f"model_store : {tmp_path}\n"
        "models={\\\n"
        '    "bert": {\\\n'
        '        "1.0": {"marName": "bert.mar", "maxBatchDelay": 1}\\\n'
        "    }\\\n"
        "}\n"
        "max_request_size 1048576\n"
    )
    out = tmp_path / "sized.properties"
    assert sizing.main(["--out", str(out), "--", "--ts-config", str(config)], {}) == 0
    (entry,) = json.loads(read_properties(out)["models"])["bert"].values()
    assert entry["minWorkers"] == 8 and entry["maxBatchDelay"] == 1


def test_a_config_without_models_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.properties"
    config.write_text(f"model_store={tmp_path}\n")
    assert sizing.main(["--out", str(tmp_path / "out"), "--", "--ts-config", str(config)], {}) == 1
    assert "the config has no models= entry" in capsys.readouterr().err
    with pytest.raises(sizing.SizingError, match="no models="):
        sizing.resolve(read_properties(config), gpus=0)


def test_ts_config_file_is_refused_and_model_store_followed(
    measured: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TorchServe reads TS_CONFIG_FILE over any --ts-config, so the sized file would not run:
    refused. --model-store replaces the config's model_store, as TorchServe takes it."""
    config = tmp_path / "config.properties"
    config.write_text(properties_text(store(tmp_path) | {"model_store": "/nowhere"}))
    out = tmp_path / "out"
    args = ["--out", str(out), "--", "--ts-config", str(config), "--model-store", str(tmp_path)]
    assert sizing.main(args, {"TS_CONFIG_FILE": str(config)}) == 1
    assert "TS_CONFIG_FILE" in capsys.readouterr().err
    assert sizing.main(args, {}) == 0
    assert read_properties(out)["model_store"] == str(tmp_path)
    assert entry_of(sizing.Resolved(read_properties(out), 1, ()))["minWorkers"] == 8


def test_an_smt_pod_gets_the_threads_it_pays_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2-CPU pod pinned to both hyperthreads of one core: 1 worker (one physical core) with
    2 torch threads (the CPUs paid for), not 1 x 1."""
    topology = tmp_path / "cpu"
    for cpu, core in ((0, 0), (1, 0)):
        folder = topology / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text("0\n")
        (folder / "core_id").write_text(f"{core}\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("200000 100000\n")
    monkeypatch.setattr(probe.os, "sched_getaffinity", lambda pid: {0, 1})
    machine = probe.read_machine(0, cgroup, topology)
    assert (machine.cores, machine.cpus) == (1, 2)
    workers, _ = rules.workers_for(machine, GIB)
    assert (workers, rules.threads_for(machine, workers)) == (1, 2)


@pytest.mark.parametrize(("request_cpus", "weight"), [(2, 79), (0.5, 20), (4, 157)])
def test_with_no_quota_the_cpu_request_sizes_not_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request_cpus: float, weight: int
) -> None:
    """No CPU limit on a 64-CPU node: the kubelet's cpu.weight for the pod's request (runc's
    1 + (shares - 2) * 9999 / 262142) sizes the pod, at least one CPU; weight 100 is the
    kernel's default and no request."""
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("max 100000\n")
    (cgroup / "cpu.weight").write_text(f"{weight}\n")
    assert probe.cgroup_cpu_request(cgroup) == pytest.approx(request_cpus, abs=0.03)
    monkeypatch.setattr(probe.os, "sched_getaffinity", lambda pid: set(range(64)))
    machine = probe.read_machine(0, cgroup, tmp_path / "no-topology")
    assert machine.cpus == max(1, request_cpus) and machine.cores == max(1, request_cpus)
    (cgroup / "cpu.weight").write_text("100\n")
    assert probe.read_machine(0, cgroup, tmp_path / "no-topology").cpus == 64


def test_a_gpu_caps_the_queue_at_what_it_drains() -> None:
    """Many workers on one GPU drain what the GPU does, a batch per device time, not the
    workers' sum: the queue is a patient minute of that."""
    load = rules.DeviceLoad(8, device_s=0.010, cpu_s=0.030, gpu_bytes=GIB, context_bytes=0)
    assert load.gpu_texts_per_s == 800
    machine = Machine(16, 128 * GIB, gpus=1, gpu_memory_bytes=80 * GIB)
    models = [sizing.Served("bert", "1.0", {"minWorkers": 4}, Path("/nowhere.mar"))]
    drained = sizing.gpu_capped_drains(machine, models, {"bert:1.0": 500.0}, {"bert:1.0": load})
    assert drained[0] == (4, 200.0)
    assert drained[1] and "what 1 GPU(s) drain" in drained[1][0]


def test_a_pid_file_is_trusted_only_for_a_torchserve_process(tmp_path: Path) -> None:
    """A stale pid file whose pid now names another process (here: this test's) names no
    server; a process whose command line names TorchServe's frontend class does."""
    import os

    from bert_serve_server.control import Server, is_frontend

    server = Server(tmp_path, {})
    server.tmp_dir.mkdir()
    (server.tmp_dir / ".model_server.pid").write_text(f"{os.getpid()}\n")
    assert server.pid() is None
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cmdline").write_bytes(b"java\0-cp\0x\0org.pytorch.serve.ModelServer\0")
    assert is_frontend(42, proc) and not is_frontend(43, proc)


def test_a_local_start_refuses_ts_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make serve`` writes and names its sized config; TorchServe would read TS_CONFIG_FILE
    in its place, so the start refuses it and says why."""
    from bert_serve_server.control import Server, ServerError, check_startable

    monkeypatch.setenv("TS_CONFIG_FILE", str(tmp_path / "other.properties"))
    with pytest.raises(ServerError, match="TS_CONFIG_FILE is set"):
        check_startable(Server(tmp_path, {}))


def test_a_measurement_is_remembered_in_the_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With BERT_SERVE_MEASURE_CACHE set, an archive's content is measured once across
    processes: a second ask (another process, the same folder), or an ask for a copy at another
    path, reads the first answer; other content or other arguments measure again."""
    started: list[tuple[str, list[Any]]] = []

    def fresh(what: str, mar: Path, args: list[Any], cap_bytes: int | None = None) -> Any:
        started.append((what, args))
        return {"answer": len(started)}

    def archive(name: str, content: bytes) -> tuple[str, int]:
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(content)
        return str(path), path.stat().st_mtime_ns

    monkeypatch.setattr(probe, "in_fresh_process", fresh)
    monkeypatch.setenv(probe.CACHE_ENV, str(tmp_path / "cache"))
    mar, mtime = archive("bert.mar", b"one")
    assert probe.remembered("memory", mar, mtime, [2]) == {"answer": 1}
    assert probe.remembered("memory", mar, mtime, [2]) == {"answer": 1}
    assert probe.remembered("memory", *archive("copy/bert.mar", b"one"), [2]) == {"answer": 1}
    assert probe.remembered("memory", *archive("other.mar", b"two"), [2]) == {"answer": 2}
    assert probe.remembered("rates", mar, mtime, [2]) == {"answer": 3}
    assert len(list((tmp_path / "cache").glob("*.json"))) == 3
    monkeypatch.delenv(probe.CACHE_ENV)
    assert probe.remembered("memory", mar, mtime, [2]) == {"answer": 4}


def test_starts_asking_at_once_share_one_measurement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two starts that ask for the same measurement at once (the suite's processes, a user's
    starts side by side) measure once: the second waits for the first's answer rather than
    measuring beside it, on half the machine."""
    started: list[str] = []

    def fresh(what: str, mar: Path, args: list[Any], cap_bytes: int | None = None) -> Any:
        started.append(threading.current_thread().name)
        time.sleep(0.5)  # long enough for the other ask to arrive while this one measures
        return {"answer": len(started)}

    mar = tmp_path / "bert.mar"
    mar.write_bytes(b"one")
    monkeypatch.setattr(probe, "in_fresh_process", fresh)
    monkeypatch.setenv(probe.CACHE_ENV, str(tmp_path / "cache"))
    together = threading.Barrier(2)
    answers: list[Any] = []

    def ask() -> None:
        together.wait()
        answers.append(probe.remembered("rates", str(mar), mar.stat().st_mtime_ns, [2]))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert answers == [{"answer": 1}, {"answer": 1}] and len(started) == 1, started


def test_a_starts_plan_stated_to_another_start_is_sized_the_same(
    measured: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What one start chose (its ``in_force`` report: every model's workers and batch size, the
    queue, the heap), stated to another start of the same config, is sized the same without
    measuring."""
    properties = store(tmp_path)
    first = sizing.resolve(properties)
    assert measured
    in_force = sizing.report(first)
    overrides = {"models": json.dumps(in_force["models"]), "vmargs": in_force["vmargs"]}
    if in_force.get("job_queue_size"):
        overrides["job_queue_size"] = str(in_force["job_queue_size"])
    no_measuring(monkeypatch)
    second = sizing.resolve(properties | overrides)
    assert entry_of(second) == entry_of(first)
    for key in ("job_queue_size", "vmargs"):
        assert second.properties[key] == first.properties[key]


def test_auto_precision_is_measured_once_stated_or_planned_and_handed_to_the_workers(
    measured: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """An archive whose precision is ``auto`` gets the start's measured choice in its entry,
    with the reason; the plan states it; ``BERT_SERVE_PRECISION`` wins over both; ``size``
    prints it for the workers after the threads."""
    choices: list[int] = []

    def chosen(mar: str, mtime_ns: int, gpus: int) -> probe.PrecisionChoice:
        choices.append(gpus)
        return probe.PrecisionChoice("bf16", "bf16: measured faster")

    monkeypatch.setattr(sizing, "measured_precision", chosen)
    config = tmp_path / "config.properties"
    config.write_text(properties_text(store(tmp_path)))
    plan = tmp_path / "plan.json"
    args = ["--out", str(tmp_path / "sized"), "--plan-out", str(plan), "--", "--ts-config"]
    assert sizing.main([*args, str(config)], {}) == 0
    printed = capsys.readouterr()
    assert printed.out.splitlines()[1] == "bert:1.0=bf16"
    assert "bert:1.0: precision auto -> bf16: bf16: measured faster" in printed.err
    assert entry_of_file(tmp_path / "sized")["precision"] == "bf16" and choices == [0]
    assert json.loads(plan.read_text())["models"]["bert"]["1.0"]["precision"] == "bf16"
    no_measuring(monkeypatch)
    planned = sizing.resolve(store(tmp_path), gpus=0, stated=Stated(plan=plan))
    assert entry_of(planned)["precision"] == "bf16"
    pinned = sizing.resolve(store(tmp_path), gpus=0, stated=Stated(plan=plan, precision="fp32"))
    assert entry_of(pinned)["precision"] == "fp32"
    assert sizing.chosen_precisions(pinned.properties) == "bert:1.0=fp32"
    with pytest.raises(StatedValueError, match="BERT_SERVE_PRECISION"):
        read_stated({"BERT_SERVE_PRECISION": "auto"})


def test_an_archive_that_states_its_precision_is_not_measured_for_it(
    measured: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_measuring(monkeypatch)
    monkeypatch.setattr(sizing, "measured_rates", lambda *args: dict.fromkeys(args[2], RATE))
    monkeypatch.setattr(sizing, "measured_memory", lambda *args, **kwargs: WORKER)
    properties = store(tmp_path)
    with zipfile.ZipFile(tmp_path / "bert.mar", "a") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"configFile": "c.yaml"}}))
        archive.writestr("c.yaml", "handler:\n  precision: fp32\n")
    resolved = sizing.resolve(properties, gpus=0, stated=Stated(precision="bf16"))
    assert (
        "precision" not in entry_of(resolved)
        and sizing.chosen_precisions(resolved.properties) == ""
    )


def entry_of_file(path: Path) -> dict[str, Any]:
    (entry,) = json.loads(read_properties(path)["models"])["bert"].values()
    return dict(entry)


def test_every_variable_a_start_or_stop_reads_is_in_the_settings_table() -> None:
    """docs/configuration.md's table is the one place a deployment learns what it can state:
    each ``BERT_SERVE_*`` variable the server reads has a row there."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    rows = "\n".join(line for line in page.splitlines() if line.startswith("| `BERT_SERVE_"))
    read = {*control.START_VARIABLES, control.STOP_ENV, probe.TIMEOUT_ENV, probe.CACHE_ENV}
    assert {name for name in read if f"`{name}`" not in rows} == set()
