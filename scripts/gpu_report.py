"""The GPU report: the default start, batchSize 1, bf16, tf32, workers per GPU swept around the
rule's choice, LitServe configured like ours, the lone request eager and captured, the in-process
ceiling and the served fp32 scores against the CPU's, on a bert-base-shaped model
(``lab.gpu_report`` says what runs, in what order, and its budget). Writes ``results.json`` and
``gpu.png`` into ``--out``.

    python scripts/gpu_report.py --out docs/gpu          # on a GPU host (docs/gpu/README.md)
    python scripts/gpu_report.py --smoke --out /tmp/gpu  # the CPU, a tiny model, every section
"""

import sys

from lab.gpu_report import main

if __name__ == "__main__":
    sys.exit(main())
