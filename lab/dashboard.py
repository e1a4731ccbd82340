"""Draw the Grafana dashboard's panels from a real run's Prometheus data (Grafana itself has no
Debian package here): the series tests/integration/test_operating.py fetched with the
dashboard's own queries, one chart per panel (per model for the model rows).

    OPERATING_DATA=build/operating.json .venv/bin/python -m pytest tests/integration/test_operating.py
    .venv/bin/python -m lab dashboard-picture build/operating.json docs/operating/dashboard.png
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from bert_serve_server.config import ROOT

from lab.report import pyplot, tool_parser

COLUMNS = 3
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
DASHBOARD = ROOT / "deploy" / "grafana" / "bert-serve.json"
UNITS = {"reqps": "requests/s", "s": "seconds", "decmbytes": "MB", "percent": "%", "short": ""}


def legend(template: str, metric: dict[str, str]) -> str:
    return LEGEND_LABEL.sub(lambda match: metric.get(match.group(1), ""), template).strip()


def title(entry: dict[str, Any]) -> str:
    """The panel's title, with its model for a per-model panel."""
    return str(entry["panel"]) + (f" ({entry['model']})" if entry["model"] else "")


def charts(data: dict[str, Any]) -> dict[str, list[tuple[str, list[float], list[float]]]]:
    """Panel title (with its model) -> its lines: (legend, seconds into the run, values)."""
    out: dict[str, list[tuple[str, list[float], list[float]]]] = {}
    for entry in data["panels"]:
        lines = out.setdefault(title(entry), [])
        for each in entry["series"]:
            times = [float(t) - data["start"] for t, _ in each["values"]]
            values = [float(v) for _, v in each["values"]]
            lines.append((legend(entry["legend"], each["metric"]), times, values))
    return out


def units() -> dict[str, str]:
    """Panel title -> its unit in words, from the dashboard itself."""
    board = json.loads(DASHBOARD.read_text())
    return {
        panel["title"]: UNITS.get(panel["fieldConfig"]["defaults"].get("unit", ""), "")
        for panel in board["panels"]
        if panel["type"] != "row"
    }


def draw(data: dict[str, Any], out: Path) -> None:
    plt = pyplot()
    panels = charts(data)
    unit_of = units()
    panel_of = {title(entry): entry["panel"] for entry in data["panels"]}
    rows = math.ceil(len(panels) / COLUMNS)
    figure, axes = plt.subplots(rows, COLUMNS, figsize=(6 * COLUMNS, 3.2 * rows), squeeze=False)
    for axis, (shown, lines) in zip(axes.flat, panels.items(), strict=False):
        axis.set_title(shown, fontsize=10)
        for label, times, values in lines:
            finite = [(t, v) for t, v in zip(times, values, strict=True) if math.isfinite(v)]
            axis.plot([t for t, _ in finite], [v for _, v in finite], label=label, linewidth=1.2)
        if lines:
            axis.legend(fontsize=7, loc="upper left")
        else:
            axis.text(0.5, 0.5, "no samples (no GPU)", ha="center", transform=axis.transAxes)
        axis.set_xlabel("seconds into the run", fontsize=8)
        axis.set_ylabel(unit_of.get(panel_of[shown], ""), fontsize=8)
        axis.tick_params(labelsize=7)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.suptitle("bert-serve dashboard: the panels' queries on a real run's Prometheus data")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("dashboard-picture", __doc__)
    parser.add_argument("data", type=Path, help="the JSON test_operating.py wrote (OPERATING_DATA)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    draw(json.loads(args.data.read_text()), args.out)
    return 0
