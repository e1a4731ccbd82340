"""``python -m lab windows``: long texts classified as windows against truncation, in one run
(docs/api.md, Long texts, reads ``docs/bench/windows.json``).

- ``accuracy``: the default model in process on long reviews whose verdict comes after their
  first ``max_length`` tokens: sentences that say nothing of the verdict (``NEUTRAL``), then
  three reviews of one label from ``reviews-typical.tsv`` (never trained on); truncated, as
  served (windows, ``handler.inference.combine_rule``), and by the windows' weighted mean; and
  the short reviews alone, answered the same with windows as without;
- ``served``: the default start at 32 clients, short texts alone and a mix of 10 % texts of
  ``max_chars`` characters, in turn for ``--rounds`` rounds: tokens forwarded per second (the
  tokenizer's windows of each answered text counted), statuses, and the short texts' answers
  in the mix against those of the short load.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from bert_serve_server.archive import DEFAULT_MODEL_DIR

from handler.inference import Windows, classify, combine, model_inputs, tokenize_windows
from handler.model import apply_score_function, forward, load_model
from handler.settings import HandlerSettings
from lab.corpus import make_corpus
from lab.load import ClosedLoop, in_turn, servers, statuses
from lab.report import describe, now, tool_parser, write_json
from training import LABELS, TYPICAL_FILE, read_reviews

NEUTRAL = (
    "We arrived on a Tuesday afternoon after a four hour drive.",
    "The building is on the corner of the main street, next to a bank and a bakery.",
    "Our room was on the third floor and faced the courtyard.",
    "I had booked it two months in advance through the website.",
    "The package came in a brown cardboard box with a printed label.",
    "It weighs about two kilograms and comes in three colours.",
    "The film runs for about two hours and was shot in Canada.",
    "The story follows a family who move to a small town by the sea.",
    "My sister recommended it to me last spring.",
    "The menu lists soups, salads, pasta and a few fish dishes.",
    "We went there for dinner on a Saturday with four friends.",
    "The manual is twenty pages long and printed in five languages.",
    "The author lives in Lisbon and this is her second novel.",
    "Parking is available behind the building for a daily fee.",
    "I used it every day for three weeks before writing this.",
    "The second act takes place mostly in a train station.",
    "Delivery took six days, which is what the site said.",
    "There are two versions, one with a cable and one without.",
    "The course has twelve lessons, each about forty minutes long.",
    "We were a group of six, including two children.",
)
"""Sentences that say nothing of a verdict, to open a long review."""
PREFIXES = (12, 20, 30)
"""Neutral sentences before the verdict: about 150, 250 and 370 tokens."""
CLIENTS = 32
LONG_SHARE = 10
"""One text in this many is of ``max_chars`` characters in the mixed load."""


def long_reviews(
    reviews: list[tuple[str, str]], prefix: int, seed: int = 0
) -> list[tuple[str, str]]:
    """(text, label): ``prefix`` neutral sentences, then the review and two more of its label."""
    rng = random.Random(f"{seed}-{prefix}")
    made = []
    for text, label in reviews:
        same = [other for other, its in reviews if its == label and other != text]
        neutral = " ".join(rng.choice(NEUTRAL) for _ in range(prefix))
        made.append((f"{neutral} {text} {' '.join(rng.sample(same, 2))}", label))
    return made


def accuracy(model_dir: Path, settings: HandlerSettings) -> dict[str, Any]:
    """The share answered right, by the neutral sentences before the verdict."""
    loaded = load_model(model_dir, HandlerSettings(device="cpu", max_batch_tokens=4096), None)
    windows, length = Windows.of(settings), settings.max_length
    reviews = [(text, LABELS[label]) for text, label in read_reviews(TYPICAL_FILE)]

    def share(labels: list[str], texts: list[tuple[str, str]]) -> float:
        return round(sum(a == b for a, (_, b) in zip(labels, texts, strict=True)) / len(texts), 3)

    by_prefix = {}
    for prefix in PREFIXES:
        texts = long_reviews(reviews, prefix)
        plain = [text for text, _ in texts]
        cut, _ = classify(loaded, plain, length, 4096)
        served, stats = classify(loaded, plain, length, 4096, windows)
        by_prefix[str(prefix)] = {
            "windows_per_text": round(statistics.mean(stats.windows), 2),
            "truncated": share([p.label for p in cut], texts),
            "windows": share([p.label for p in served], texts),
            "windows_weighted_mean": share(
                [mean_label(loaded, text, length, settings.stride) for text in plain], texts
            ),
        }
    short = [text for text, _ in reviews]
    return {
        "reviews": len(reviews),
        "by_neutral_sentences": by_prefix,
        "short_answers_equal": classify(loaded, short, length, 4096)[0]
        == classify(loaded, short, length, 4096, windows)[0],
    }


def mean_label(loaded: Any, text: str, max_length: int, stride: int) -> str:
    """The label the windows' token-weighted mean of probabilities gives (the rule the
    served one, ``combine_rule``, was measured against)."""
    (rows,) = tokenize_windows(loaded.tokenizer, [text], max_length, stride)
    logits = forward(loaded, *model_inputs(loaded, rows))
    scores = apply_score_function(loaded.score_function, logits)
    combined, _ = combine(logits.tolist(), scores.tolist(), [len(r.input_ids) for r in rows])
    return str(loaded.labels[max(range(len(combined)), key=combined.__getitem__)])


def mixed_texts(settings: HandlerSettings, count: int = 400) -> list[str]:
    """Short texts of the benchmark corpus, every ``LONG_SHARE``-th replaced by a text of
    ``max_chars`` characters of review sentences."""
    short = make_corpus(count)
    rng = random.Random(1)
    texts = []
    for index, text in enumerate(short):
        if index % LONG_SHARE == LONG_SHARE - 1:
            words = " ".join(rng.choice(short) for _ in range(400))
            text = words[: settings.max_chars].rsplit(" ", 1)[0]
        texts.append(text)
    return texts


def served(
    settings: HandlerSettings, seconds: float, rounds: int, model_dir: Path
) -> dict[str, Any]:
    """Short texts alone and the mix at ``CLIENTS`` clients on the default start, in turn."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    mix = mixed_texts(settings)
    loads = {
        "short": [t for n, t in enumerate(mix) if n % LONG_SHARE != LONG_SHARE - 1],
        "mixed": mix,
    }
    windows = tokenize_windows(tokenizer, mix, settings.max_length, settings.stride)
    tokens = {
        text: sum(len(w.input_ids) for w in each) for text, each in zip(mix, windows, strict=True)
    }
    runs: dict[str, list[dict[str, Any]]] = {"short": [], "mixed": []}
    answers: dict[str, dict[str, Any]] = {"short": {}, "mixed": {}}
    failed = 0
    with servers({"default": {}}) as started:
        server = started["default"]["server"]
        for _, (name, texts) in itertools.product(range(rounds), loads.items()):
            loop = ClosedLoop(
                server.predict_url, server.headers(), in_turn(texts), CLIENTS, seconds
            )
            done = [o for o in loop.run().outcomes if o.status == "200"]
            answers[name] |= {o.job.expected: json.loads(o.body) for o in done}
            failed += len(loop.outcomes) - len(done)
            tokens_per_s = round(sum(tokens[o.job.expected] for o in done) / loop.elapsed)
            texts_per_s = round(len(done) / loop.elapsed, 1)
            counted = {"statuses": statuses(loop.outcomes), "texts_per_s": texts_per_s}
            runs[name].append(counted | {"tokens_per_s": tokens_per_s})
        sizing = server.sizing()["in_force"]
    short, mixed = answers["short"], answers["mixed"]
    common = set(short) & set(mixed)
    changes = [
        abs(short[t]["scores"][k] - mixed[t]["scores"][k])
        for t in common
        for k in short[t]["scores"]
    ]
    long_answers = [a for t, a in mixed.items() if len(t) > settings.max_chars // 2]
    median = {name: statistics.median(run["tokens_per_s"] for run in runs[name]) for name in runs}
    return {
        "clients": CLIENTS,
        "seconds": seconds,
        "sizing_in_force": sizing,
        "runs": runs,
        "mixed_over_short_tokens_per_s": round(median["mixed"] / median["short"], 3),
        "failed": failed,
        "short_texts_compared": len(common),
        "short_labels_equal": all(short[t]["label"] == mixed[t]["label"] for t in common),
        "short_largest_score_change": max(changes, default=0.0),
        "long_texts_answered": len(long_answers),
        "long_windows": sorted({a.get("windows", 1) for a in long_answers}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("windows", __doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/bench/windows.json"))
    parser.add_argument("--seconds", type=float, default=15.0, help="per load, per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    args = parser.parse_args(argv)
    settings = HandlerSettings()
    print("[windows] accuracy in process", file=sys.stderr)
    report: dict[str, Any] = {"machine": describe(), "when": now()}
    report["accuracy"] = accuracy(args.model_dir, settings)
    print("[windows] served: short and mixed loads in turn", file=sys.stderr)
    report["served"] = served(settings, args.seconds, args.rounds, args.model_dir)
    write_json(args.out, report)
    ratio = report["served"]["mixed_over_short_tokens_per_s"]
    print(json.dumps({"accuracy": report["accuracy"], "ratio": ratio}, indent=1))
    return 0
