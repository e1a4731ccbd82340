"""Tokenize, plan, collate and forward, without TorchServe; the real model where answers matter."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from handler import inference
from handler.inference import classify, collate, plan_sub_batches, tokenize
from handler.model import label_names, load_model, select_device
from handler.settings import HandlerSettings
from handler.values import TextInput
from tests.architectures import ARCHITECTURES


@given(
    st.lists(st.integers(min_value=2, max_value=128), max_size=64),
    st.integers(min_value=128, max_value=4096),
)
def test_plan_covers_every_item_once_within_budget(lengths: list[int], budget: int) -> None:
    """Every index lands in exactly one group, and each group's padded size fits the budget."""
    groups = plan_sub_batches(lengths, budget)
    assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
    for group in groups:
        assert len(group) * max(lengths[i] for i in group) <= budget


def test_plan_keeps_one_group_when_everything_fits() -> None:
    """A batch under the budget stays one forward pass."""
    assert plan_sub_batches([5, 9, 3], 27) == [[2, 0, 1]]
    assert plan_sub_batches([], 100) == []


def test_plan_isolates_a_long_text_from_short_ones() -> None:
    """One long text no longer makes fifteen short ones pay for its padding."""
    groups = plan_sub_batches([10] * 15 + [128], 256)
    assert groups[-1] == [15]
    assert sum(len(g) for g in groups[:-1]) == 15


def test_collate_pads_to_the_longest_row_only() -> None:
    ids, mask = collate([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_tokenize_flags_truncation(tiny_model_dir: Path) -> None:
    """Texts over max_length are cut to exactly max_length tokens and flagged."""
    loaded = load_model(tiny_model_dir, HandlerSettings(), gpu_id=None)
    items = tokenize(loaded.tokenizer, ["short text", "word " * 300], max_length=16)
    assert [item.truncated for item in items] == [False, True]
    assert len(items[1].input_ids) == 16
    assert items[1].input_ids[-1] == loaded.tokenizer.sep_token_id


def test_device_falls_back_to_cpu_without_a_gpu() -> None:
    """auto takes the assigned GPU only when CUDA is there; cuda without one is a start error."""
    if torch.cuda.is_available():
        assert select_device("auto", 0) == torch.device("cuda", 0)
    else:
        assert select_device("auto", 0) == torch.device("cpu")
        with pytest.raises(ValueError, match="cuda"):
            select_device("cuda", 0)
    assert select_device("auto", None) == torch.device("cpu")
    assert select_device("cpu", 0) == torch.device("cpu")


def test_label_names_come_from_config_unless_overridden() -> None:
    assert label_names({0: "neg", 1: "pos"}, 2, ()) == ("neg", "pos")
    assert label_names({0: "LABEL_0", 1: "LABEL_1"}, 2, ("bad", "good")) == ("bad", "good")
    with pytest.raises(ValueError, match="3 labels"):
        label_names({0: "a", 1: "b"}, 2, ("a", "b", "c"))


@pytest.fixture(scope="module")
def real_model(real_model_dir: Path):
    return load_model(real_model_dir, HandlerSettings(), gpu_id=None)


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("An absolute delight from start to finish.", "positive"),
        ("A tedious, joyless mess.", "negative"),
        ("I would happily stay at this hotel again, the staff were wonderful.", "positive"),
        ("The battery died within a week and support never answered my emails.", "negative"),
    ],
)
def test_real_model_classifies_held_out_sentences(real_model, text: str, label: str) -> None:
    """The packaged model really classifies sentences it never saw in training."""
    predictions, _ = classify(real_model, [text], max_length=128, max_batch_tokens=4096)
    assert predictions[0].label == label
    assert predictions[0].score > 0.5


def test_real_model_scores_do_not_depend_on_batch_mates(real_model) -> None:
    """Alone, in one padded batch, or in length groups: the same probabilities within 1e-4."""
    texts = [
        "Fine.",
        "It was okay, I guess, though the ending felt rushed and the middle sagged.",
        "Brilliant! " * 40,
        "Not for me.",
        "The service was slow but the food made up for it.",
    ]
    alone = [classify(real_model, [t], 128, 4096)[0][0].scores for t in texts]
    together, stats = classify(real_model, texts, 128, 4096)
    grouped, grouped_stats = classify(real_model, texts, 128, 128)
    assert len(stats.sub_batches) == 1 and len(grouped_stats.sub_batches) > 1
    for single, batched, split in zip(alone, together, grouped, strict=True):
        for label, probability in single.items():
            assert batched.scores[label] == pytest.approx(probability, abs=1e-4)
            assert split.scores[label] == pytest.approx(probability, abs=1e-4)


def test_eager_attention_matches_sdpa(tiny_model_dir: Path) -> None:
    """eager attention loads and matches sdpa within 1e-4."""
    texts = ["short", "a somewhat longer sentence to classify", "word " * 50]
    reference, _ = classify(load_model(tiny_model_dir, HandlerSettings(), None), texts, 128, 256)
    predictions, _ = classify(
        load_model(tiny_model_dir, HandlerSettings(attention="eager"), None), texts, 128, 256
    )
    for got, expected in zip(predictions, reference, strict=True):
        assert sum(got.scores.values()) == pytest.approx(1.0, abs=1e-5)
        assert got.scores == pytest.approx(expected.scores, abs=1e-4)


def test_long_texts_are_tokenized_in_bounded_chunks_with_the_same_tokens(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tokenizer keeps a whole text's overflow until its call returns: no call may hold
    more than TOKENIZE_CHUNK_CHARS characters (a long text alone), and the tokens kept are
    those of one call over everything."""
    loaded = load_model(tiny_model_dir, HandlerSettings(), gpu_id=None)
    long = "a long review of a film that goes on " * 260
    texts: list[TextInput] = [long + str(i) for i in range(8)]
    texts += ["short", (long, "a pair"), "x " * 20_000, "another short one"]
    monkeypatch.setattr(inference, "TOKENIZE_CHUNK_CHARS", 30_000)
    backend = loaded.tokenizer.backend_tokenizer
    whole = backend.encode_batch(texts, add_special_tokens=True)
    calls: list[int] = []

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(backend, name)

        def encode_batch(self, batch: list[TextInput], **kwargs: Any) -> Any:
            calls.append(
                sum(len(t) if isinstance(t, str) else len(t[0]) + len(t[1]) for t in batch)
            )
            return backend.encode_batch(batch, **kwargs)

    spied = type("Tok", (), {"backend_tokenizer": Spy(), "truncation_side": "right"})()
    items = tokenize(spied, texts, max_length=64)
    assert len(calls) > 1 and all(size <= 30_000 or size == 40_000 for size in calls), calls
    expected = tokenize(loaded.tokenizer, texts, max_length=64)
    assert [item.input_ids for item in items] == [item.input_ids for item in expected]
    assert [item.truncated for item in items] == [True] * 8 + [False, True, True, False]
    assert len(whole) == len(texts)


def test_tokenizing_the_largest_batch_holds_little_memory(tiny_model_dir: Path) -> None:
    """1,024 texts of ~9,600 characters (a batch of 16 full lists) added 334 MiB of peak RSS
    when tokenized in one call; in chunks, the texts themselves and a few MiB."""
    script = f"""
import resource
import sys
sys.path.insert(0, {str(Path(__file__).parents[2])!r})
from handler.inference import tokenize
from handler.model import load_model
from handler.settings import HandlerSettings
from pathlib import Path
loaded = load_model(Path({str(tiny_model_dir)!r}), HandlerSettings(), gpu_id=None)
texts = [("a long review of a film that goes on and on " * 220) + str(i) for i in range(1024)]
tokenize(loaded.tokenizer, texts[:8], 128)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
items = tokenize(loaded.tokenizer, texts, 128)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert all(len(item.input_ids) == 128 for item in items)
print((after - before) / 1024)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    grown_mib = float(done.stdout.split()[-1])
    assert grown_mib < 100, f"tokenizing grew peak RSS by {grown_mib:.0f} MiB"


PAIR_WORDS = ["unaffable", "running", "a", "film", ",", "!", "don't", "héllo", "😀", "  ", "東京"]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
@pytest.mark.parametrize("side", ["right", "left"])
def test_pairs_are_truncated_as_the_tokenizer_truncates_them(
    architecture_dir: Any, name: str, side: str
) -> None:
    """tokenize_pairs cuts each side itself (linear in the text); its tokens equal the
    tokenizer's own longest-first truncation of the whole pair, on every architecture's
    tokenizer, both truncation sides, odd and even budgets, either side the longer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(architecture_dir(name))
    tokenizer.truncation_side = side
    chooser = random.Random(f"{name}-{side}")

    def text(words: int) -> str:
        suffixes = ["", "", "!", "ing", "s"]
        return " ".join(chooser.choice(PAIR_WORDS) + chooser.choice(suffixes) for _ in range(words))

    for _ in range(60):
        first, second = text(chooser.randint(1, 90)), text(chooser.randint(1, 90))
        max_length = chooser.choice([16, 17, 31, 64])
        (ours,) = tokenize(tokenizer, [(first, second)], max_length)
        theirs = tokenizer(first, second, truncation=True, max_length=max_length)
        assert ours.input_ids == theirs["input_ids"], (first, second, max_length)
        if "token_type_ids" in theirs:
            assert ours.token_type_ids == theirs["token_type_ids"]
        whole = tokenizer(first, second, truncation=False)["input_ids"]
        assert ours.truncated == (len(whole) > max_length)


def test_a_long_pair_costs_what_its_sides_cost(tiny_model_dir: Path) -> None:
    """The backend's own pair truncation crosses every overflow of one side with every overflow
    of the other: one pair of two 10,000-character texts took 5-8 s and 2.4 GiB. Cut first, two
    such pairs take about as long as their four sides alone."""
    loaded = load_model(tiny_model_dir, HandlerSettings(), gpu_id=None)
    side = "😀" + "!" * 9_999
    started = time.perf_counter()
    tokenize(loaded.tokenizer, [side] * 4, 128)
    singles_s = time.perf_counter() - started
    started = time.perf_counter()
    items = tokenize(loaded.tokenizer, [(side, side)] * 2, 128)
    pairs_s = time.perf_counter() - started
    assert all(len(item.input_ids) == 128 and item.truncated for item in items)
    assert pairs_s < 5 * singles_s + 1.0, (pairs_s, singles_s)


def test_a_gpu_pass_is_waited_for_asleep_not_spinning(monkeypatch: pytest.MonkeyPatch) -> None:
    """From a GPU, the logits' copy is queued and the worker waits on a blocking event (the
    host thread sleeps: cudaEventBlockingSync); on the CPU they are returned as they are."""
    from handler.model import to_host

    done: list[object] = []

    class Event:
        def __init__(self, blocking: bool = False) -> None:
            done.append(("event", blocking))

        def record(self) -> None:
            done.append("record")

        def synchronize(self) -> None:
            done.append("synchronize")

    class OnTheGpu:
        device = torch.device("cuda", 0)

        def to(self, where: str, non_blocking: bool = False) -> str:
            done.append(("copy", where, non_blocking))
            return "on the host"

    monkeypatch.setattr(torch.cuda, "Event", Event)
    assert to_host(OnTheGpu()) == "on the host"  # type: ignore[arg-type]
    assert done == [("copy", "cpu", True), ("event", True), "record", "synchronize"]
    logits = torch.ones(2, 3)
    assert to_host(logits) is logits
