"""lab/models_start.py's pure steps: the startup budget, the memory three workers need."""

from __future__ import annotations

import json

from lab import models_start


def test_the_budget_is_the_startup_probes_period_times_its_failures() -> None:
    assert models_start.startup_budget_s() == 5 * 120


def test_three_workers_of_the_records_size_fit_in_half_of_the_memory_given() -> None:
    record = {"sizing": ["machine: 2 CPUs", "bert:1.0: a worker holds 583 MiB (measured: ...)"]}
    worker = models_start.worker_mib(record)
    memory = models_start.memory_for(3, worker)
    assert worker == 583 and memory == "3584m"
    assert 3 * worker <= int(memory[:-1]) / 2 < 3 * worker + models_start.MEMORY_STEP_MIB


def test_the_committed_image_record_has_the_worker_size() -> None:
    assert models_start.worker_mib(json.loads(models_start.IMAGE_RECORD.read_text())) > 0
