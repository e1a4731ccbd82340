"""`make metrics` reads the handler's histograms from TorchServe's Prometheus text: p50/p99 as
the bucket that holds them, scaled back to milliseconds, requests and tokens."""

from __future__ import annotations

from bert_serve_server.live_metrics import (
    buckets,
    histogram_delta,
    parse_metrics,
    quantile,
    summary,
)

BOUNDS = ["0.005", "0.01", "0.025", "0.05", "0.075", "0.1", "0.25", "0.5", "0.75", "1.0"]
BOUNDS += ["2.5", "5.0", "7.5", "10.0", "+Inf"]


def exposition(name: str, cumulative: list[int], model: str = "bert") -> str:
    """A histogram as TorchServe's frontend (the Prometheus Java client) writes it."""
    labels = f'ModelName="{model}",Level="Model",Hostname="vm",'
    lines = [f"# TYPE {name} histogram"]
    lines += [
        f'{name}_bucket{{{labels}le="{bound}",}} {float(count)}'
        for bound, count in zip(BOUNDS, cumulative, strict=True)
    ]
    lines += [f"{name}_count{{{labels}}} {float(cumulative[-1])}"]
    return "\n".join(lines)


def test_buckets_are_read_in_order_per_model() -> None:
    counts = [0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3]
    text = exposition("ForwardSeconds", counts) + "\n" + exposition("ForwardSeconds", [9] * 15, "x")
    found = buckets(parse_metrics(text), "ForwardSeconds")
    assert [bound for bound, _ in found][:2] == [0.005, 0.01]
    assert found[-1] == (float("inf"), 3.0)
    assert [count for _, count in found] == counts


def test_quantile_is_the_bucket_that_holds_it() -> None:
    cumulative = [(0.005, 0.0), (0.01, 90.0), (0.025, 99.0), (0.05, 100.0), (float("inf"), 100.0)]
    assert quantile(cumulative, 0.5) == (0.005, 0.01)
    assert quantile(cumulative, 0.99) == (0.01, 0.025)
    assert quantile(cumulative + [(float("inf"), 100.0)], 1.0) == (0.025, 0.05)
    assert quantile([(0.005, 0.0), (float("inf"), 4.0)], 0.5) == (0.005, float("inf"))
    assert quantile([(0.005, 0.0), (float("inf"), 0.0)], 0.5) is None
    assert quantile([], 0.5) is None


def test_the_summary_shows_what_happened_between_two_scrapes() -> None:
    """Only the interval counts: earlier observations in the same buckets are subtracted."""
    zero = [0] * 15
    before = parse_metrics(
        "\n".join(
            [
                exposition("HandlerSeconds", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 5, 5, 5, 5]),
                exposition("BatchSizeHundreds", [0, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]),
                exposition("ForwardSeconds", zero),
                exposition("BatchTokensThousands", zero),
            ]
        )
    )
    after = parse_metrics(
        "\n".join(
            [
                exposition("HandlerSeconds", [0, 0, 0, 90, 99, 100, 100] + [100] * 3 + [105] * 5),
                exposition("BatchSizeHundreds", [0, 5, 5, 5, 5, 5, 105] + [105] * 8),
                exposition("ForwardSeconds", zero),
                exposition("BatchTokensThousands", zero),
            ]
        )
    )
    assert dict(histogram_delta(before, after, "HandlerSeconds"))[2.5] == 100
    text = summary(before, after, 1.0)
    assert "handler p50 <= 50ms p99 <= 75ms" in text, text
    assert "batch size p50 <= 25 p99 <= 25" in text, text
    assert "forward -" in text and "batch tokens -" in text


def test_a_models_series_are_read_apart_and_by_version() -> None:
    """Two models, and two versions of one, on one server: each read on its own."""
    text = "\n".join(
        f'Batches{{ModelName="{model}",ModelVersion="{version}",Level="Model",Hostname="vm",}} {n}'
        for model, version, n in (("nli", "1", 2.0), ("nli", "2", 5.0), ("toxicity", "1.0", 7.0))
    )
    assert parse_metrics(text, "nli") == {("Batches", ""): 7.0}
    assert parse_metrics(text, "nli", "2") == {("Batches", ""): 5.0}
    assert parse_metrics(text, "toxicity") == {("Batches", ""): 7.0}
