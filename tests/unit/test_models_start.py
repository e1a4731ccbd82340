"""`make models-start`'s pure steps (lab/image.py): the startup budget, the memory three
workers need."""

from __future__ import annotations

import json

from lab import image


def test_the_budget_is_the_startup_probes_period_times_its_failures() -> None:
    assert image.startup_budget_s() == 5 * 120


def test_three_workers_of_the_records_size_fit_in_half_of_the_memory_given() -> None:
    record = {"sizing": ["machine: 2 CPUs", "bert:1.0: a worker holds 583 MiB (measured: ...)"]}
    worker = image.worker_mib(record)
    memory = image.memory_for(3, worker)
    assert worker == 583 and memory == "3584m"
    assert 3 * worker <= int(memory[:-1]) / 2 < 3 * worker + image.MEMORY_STEP_MIB


def test_the_committed_image_record_has_the_worker_size() -> None:
    assert image.worker_mib(json.loads(image.IMAGE_RECORD.read_text())) > 0
