"""Tokenize the valid texts of a batch together, run them in groups by length whose padded
size stays under ``max_batch_tokens`` (so a long text does not pad its short batch-mates),
score them; per-request options are applied afterwards (``with_options``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from handler.model import LoadedModel, apply_score_function, forward, head_kind
from handler.settings import HandlerSettings
from handler.values import BatchStats, Prediction, ScoreOptions, TextInput, TokenizedText

TOKENIZE_CHUNK_CHARS = 1 << 18
"""Characters per call of the tokenizer. It tokenizes each text whole before it truncates and
keeps the overflow until the call returns (about 34 bytes a character): a batch of long lists
in one call held hundreds of MiB. Per chunk it holds about 9 MiB, and a chunk of short texts
still has hundreds of them for its threads."""


def tokenize(tokenizer: Any, texts: Sequence[TextInput], max_length: int) -> list[TokenizedText]:
    """The batch in a few calls of the Rust backend (chunks of ``TOKENIZE_CHUNK_CHARS``), not
    padded, truncated as transformers' ``truncation=True`` does (reconfigured each call, as it
    does); only the tokens kept are kept. Pairs go through ``tokenize_pairs``."""
    pairs = [i for i, text in enumerate(texts) if not isinstance(text, str)]
    tokenized = dict(
        zip(pairs, tokenize_pairs(tokenizer, [texts[i] for i in pairs], max_length), strict=True)  # type: ignore[misc]
    )
    backend = tokenizer.backend_tokenizer
    backend.enable_truncation(
        max_length, strategy="longest_first", direction=tokenizer.truncation_side
    )
    backend.no_padding()
    singles = [i for i, text in enumerate(texts) if isinstance(text, str)]
    for run in chunks(singles, [len(texts[i]) for i in singles], TOKENIZE_CHUNK_CHARS):
        encodings = backend.encode_batch([texts[i] for i in run], add_special_tokens=True)
        for index, encoding in zip(run, encodings, strict=True):
            tokenized[index] = TokenizedText(
                input_ids=list(encoding.ids),
                truncated=bool(encoding.overflowing),
                token_type_ids=list(encoding.type_ids),
                special_tokens_mask=list(encoding.special_tokens_mask),
            )
    return [tokenized[i] for i in range(len(texts))]


def tokenize_pairs(
    tokenizer: Any, pairs: Sequence[tuple[str, str]], max_length: int
) -> list[TokenizedText]:
    """Pairs truncated as ``truncation=True`` (longest first) does, at a cost linear in their
    length. The backend's own pair truncation combines every overflow of one side with every
    overflow of the other: one pair of two 10,000-character texts took seconds and GiB. So
    each side is tokenized alone, untruncated; ``longest_first`` says how many tokens each
    keeps; each side is cut at the end of the word holding its last kept token (at the start
    of the word holding its first, truncating left); the cut pair is encoded untruncated, and
    the special tokens and each side's kept tokens are kept."""
    if not pairs:
        return []
    backend = tokenizer.backend_tokenizer
    backend.no_truncation()
    backend.no_padding()
    left = tokenizer.truncation_side == "left"
    budget = max_length - backend.num_special_tokens_to_add(True)
    tokenized: list[TokenizedText] = []
    sizes = [len(first) + len(second) for first, second in pairs]
    for run in chunks(range(len(pairs)), sizes, TOKENIZE_CHUNK_CHARS):
        sides = [side for i in run for side in pairs[i]]
        alone = backend.encode_batch(sides, add_special_tokens=False)
        whole = [(len(alone[j].ids), len(alone[j + 1].ids)) for j in range(0, len(alone), 2)]
        kept = [longest_first(*lengths, budget) for lengths in whole]
        limits = [k for pair in kept for k in pair]
        cut = [_cut_side(*each, left) for each in zip(sides, alone, limits, strict=True)]
        del alone
        pairs_cut = list(zip(cut[::2], cut[1::2], strict=True))
        encodings = backend.encode_batch(pairs_cut, add_special_tokens=True)
        tokenized += [
            _kept_tokens(encoding, keep, left, keep != lengths)
            for encoding, keep, lengths in zip(encodings, kept, whole, strict=True)
        ]
    return tokenized


def longest_first(first: int, second: int, budget: int) -> tuple[int, int]:
    """The tokens each side of a pair keeps under ``budget`` (the tokenizers library's
    ``TruncationStrategy::LongestFirst``): the shorter whole if the longer can take the rest,
    else half each, the extra one of an odd budget to the longer (the second when equal)."""
    if first + second <= budget:
        return first, second
    short, long = sorted((first, second))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    return (long, short) if first > second else (short, long)


def _cut_side(text: str, encoding: Any, keep: int, left: bool) -> str:
    """The text up to the end of the word of its ``keep``-th token (from the end of the word
    before the one of its ``keep``-th last, truncating left): words tokenize alone, so the cut
    text's tokens begin (end) with the ones kept."""
    count = len(encoding.ids)
    if keep >= count:
        return text
    words, offsets = encoding.word_ids, encoding.offsets
    if left:
        j = count - keep
        while j > 0 and words[j - 1] == words[count - keep]:
            j -= 1
        # from the end of the word before, with the white space a byte-level BPE joins to it
        return text[offsets[j - 1][1] :] if j > 0 else text
    j = keep - 1
    while j + 1 < count and words[j + 1] == words[keep - 1]:
        j += 1
    return text[: offsets[j][1]]


def _kept_tokens(
    encoding: Any, kept: tuple[int, int], left: bool, truncated: bool
) -> TokenizedText:
    """A cut pair's encoding without the tokens past each side's kept ones (the rest of the
    word a cut ended in)."""
    sequence_ids = encoding.sequence_ids
    totals = [sequence_ids.count(0), sequence_ids.count(1)]
    seen = [0, 0]
    keep: list[int] = []
    for index, side in enumerate(sequence_ids):
        if side is None:
            keep.append(index)
            continue
        seen[side] += 1
        position = seen[side] if not left else totals[side] - seen[side] + 1
        if position <= kept[side]:
            keep.append(index)
    ids, types, special = encoding.ids, encoding.type_ids, encoding.special_tokens_mask
    return TokenizedText(
        input_ids=[ids[i] for i in keep],
        truncated=truncated,
        token_type_ids=[types[i] for i in keep],
        special_tokens_mask=[special[i] for i in keep],
    )


@dataclass(frozen=True)
class Windows:
    """How a text over ``max_length`` tokens is classified whole: as windows of ``max_length``
    tokens, each repeating ``stride`` tokens of the one before, combined (``combine``)."""

    stride: int
    multi_label: str = "mean"
    """A multi-label model's windows combined per label by the weighted ``mean`` or the ``max``."""

    @classmethod
    def of(cls, settings: HandlerSettings) -> Windows:
        """As the handler settings say (``window_stride``, ``window_multi_label``)."""
        return cls(settings.stride, settings.window_multi_label)


def tokenize_windows(
    tokenizer: Any, texts: Sequence[TextInput], max_length: int, stride: int
) -> list[list[TokenizedText]]:
    """Each text's windows, as transformers' ``tokenizer(text, truncation=True,
    max_length=max_length, stride=stride, return_overflowing_tokens=True)`` makes them (a
    pair: ``truncation="only_second"``, its first text whole in every window); none is
    truncated. A pair whose first text leaves the second no more than ``stride`` tokens a
    window is cut longest first, as ``tokenize`` does (one window, truncated)."""
    backend = tokenizer.backend_tokenizer
    backend.no_padding()
    windowed: dict[int, list[TokenizedText]] = {}
    pairs = [i for i, text in enumerate(texts) if not isinstance(text, str)]
    room = max_length - backend.num_special_tokens_to_add(True)
    if pairs:
        backend.no_truncation()
        firsts = backend.encode_batch([texts[i][0] for i in pairs], add_special_tokens=False)
        fits = [i for i, first in zip(pairs, firsts, strict=True) if room - len(first.ids) > stride]
        cut = sorted(set(pairs) - set(fits))
        cut_pairs = [texts[i] for i in cut]
        for index, one in zip(cut, tokenize_pairs(tokenizer, cut_pairs, max_length), strict=True):  # type: ignore[arg-type]
            windowed[index] = [one]
        _encode_windows(
            backend, texts, fits, max_length, stride, "only_second", tokenizer, windowed
        )
    singles = [i for i, text in enumerate(texts) if isinstance(text, str)]
    _encode_windows(
        backend, texts, singles, max_length, stride, "longest_first", tokenizer, windowed
    )
    return [windowed[i] for i in range(len(texts))]


def _encode_windows(
    backend: Any,
    texts: Sequence[TextInput],
    indices: list[int],
    max_length: int,
    stride: int,
    strategy: str,
    tokenizer: Any,
    windowed: dict[int, list[TokenizedText]],
) -> None:
    if not indices:
        return
    backend.enable_truncation(
        max_length, stride=stride, strategy=strategy, direction=tokenizer.truncation_side
    )
    encodings = backend.encode_batch([texts[i] for i in indices], add_special_tokens=True)
    for index, encoding in zip(indices, encodings, strict=True):
        windowed[index] = [
            TokenizedText(
                input_ids=list(window.ids),
                truncated=False,
                token_type_ids=list(window.type_ids),
                special_tokens_mask=list(window.special_tokens_mask),
            )
            for window in (encoding, *encoding.overflowing)
        ]


COMBINE_RULES = ("confident", "mean", "max")


def combine(
    logits: Sequence[Sequence[float]],
    scores: Sequence[Sequence[float]],
    weights: Sequence[int],
    rule: str = "mean",
) -> tuple[list[float], list[float]]:
    """One text's (scores, logits) from its windows': ``confident``, the window whose best
    score is highest (the first of equals); ``mean``, per label the mean weighted by each
    window's tokens (its length, special tokens included); ``max``, per label the max. One
    window's are its own, unchanged."""
    if len(logits) == 1:
        return list(scores[0]), list(logits[0])
    if rule == "confident":
        best = max(range(len(scores)), key=lambda i: (max(scores[i]), -i))
        return list(scores[best]), list(logits[best])
    if rule == "max":
        return [max(column) for column in zip(*scores, strict=True)], [
            max(column) for column in zip(*logits, strict=True)
        ]
    total = sum(weights)

    def mean(rows: Sequence[Sequence[float]]) -> list[float]:
        return [
            sum(w * value for w, value in zip(weights, column, strict=True)) / total
            for column in zip(*rows, strict=True)
        ]

    return mean(scores), mean(logits)


def combine_rule(head: str, windows: Windows) -> str:
    """A single-label model answers as its most confident window (measured: docs/api.md, Long
    texts), a multi-label one as ``windows.multi_label`` says, one logit and regression by the
    weighted mean."""
    return {"single_label": "confident", "multi_label": windows.multi_label}.get(head, "mean")


def chunks(items: Sequence[int], sizes: Sequence[int], max_size: int) -> list[list[int]]:
    """Consecutive runs of ``items`` whose ``sizes`` sum to at most ``max_size`` (a larger item
    alone), in order."""
    runs: list[list[int]] = []
    total = max_size
    for item, size in zip(items, sizes, strict=True):
        if total + size > max_size:
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += size
    return runs


def plan_sub_batches(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Group indices, shortest first, so that rows x longest row <= max_batch_tokens."""
    groups: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and (len(current) + 1) * lengths[index] > max_batch_tokens:
            groups.append(current)
            current = []
        current.append(index)
    if current:
        groups.append(current)
    return groups


def pad_rows(rows: Sequence[list[int]], pad_value: int) -> torch.Tensor:
    """Rows right-padded to the longest, as one CPU tensor built from lists (2-4x faster)."""
    width = max(len(row) for row in rows)
    return torch.tensor([row + [pad_value] * (width - len(row)) for row in rows], dtype=torch.long)


def collate(rows: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest row of this group: input ids and attention mask on the CPU."""
    input_ids = pad_rows(rows, pad_id)
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    attention_mask = (torch.arange(input_ids.shape[1]) < lengths[:, None]).long()
    return input_ids, attention_mask


def to_prediction(
    scores: Sequence[float],
    labels: Sequence[str],
    truncated: bool,
    logits: Sequence[float] | None = None,
    multi_label_threshold: float | None = None,
) -> Prediction:
    """The best label, every label's score, and for a multi-label model the labels it gives.
    Labels are ranked by score, ties broken by logit (``ranked``)."""

    def by_label(values: Sequence[float]) -> dict[str, float]:
        return {label: float(value) for label, value in zip(labels, values, strict=True)}

    order = ranked(scores, logits)
    given = None
    if multi_label_threshold is not None:
        given = [labels[i] for i in order if scores[i] >= multi_label_threshold]
    return Prediction(
        label=labels[order[0]],
        score=float(scores[order[0]]),
        scores=by_label(scores),
        truncated=truncated,
        labels=given,
        raw_scores=None if logits is None else by_label(logits),
    )


def ranked(scores: Sequence[float], logits: Sequence[float] | None = None) -> list[int]:
    """Label indices best first: by score, then by logit where float32 rounded two scores to
    the same value (sigmoids of logits from about 17 up are all 1.0), then in label order.
    The label, ``labels`` and ``top_k`` all rank by this one order, so they never disagree."""
    tie_break = scores if logits is None else logits
    return sorted(range(len(scores)), key=lambda i: (-scores[i], -tie_break[i], i))


def with_options(prediction: Prediction, options: ScoreOptions) -> Prediction:
    """The prediction as one request asked for it: logits or scores, top k or every label;
    ``label`` and ``labels`` stay the model's decision (the first of the top k)."""
    if options == ScoreOptions():
        return prediction
    names = list(prediction.scores)
    logits = None if prediction.raw_scores is None else list(prediction.raw_scores.values())
    answered = prediction.scores
    if options.raw_scores:
        if prediction.raw_scores is None:
            raise AssertionError("raw scores were asked for but not kept; this is a bug")
        answered = prediction.raw_scores
    order = list(range(len(names)))
    if options.top_k is not None:
        order = ranked(list(prediction.scores.values()), logits)[: options.top_k]
    scores = {names[i]: answered[names[i]] for i in order}
    return replace(prediction, score=answered[prediction.label], scores=scores, raw_scores=None)


def model_inputs(
    loaded: LoadedModel, rows: Sequence[TokenizedText]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A sub-batch padded to its longest row: ids, mask, and token types if the model uses them."""
    input_ids, attention_mask = collate(
        [row.input_ids for row in rows], loaded.tokenizer.pad_token_id
    )
    if not loaded.uses_token_types:
        return input_ids, attention_mask, None
    token_type_ids = pad_rows(
        [row.token_type_ids or [0] * len(row.input_ids) for row in rows],
        loaded.tokenizer.pad_token_type_id,
    )
    return input_ids, attention_mask, token_type_ids


class OutOfMemory(RuntimeError):
    """The device ran out of memory on this batch; its cache is emptied, so the worker goes on."""


Admit = Callable[[Mapping[int, int], bool], set[int]]
"""Asked as a batch is tokenized, with each text's windows so far (``True`` once every text
is): the texts not to tokenize further nor forward (``handler.pipeline.Admission``)."""


def classify(
    loaded: LoadedModel,
    texts: Sequence[TextInput],
    max_length: int,
    max_batch_tokens: int,
    windows: Windows | None = None,
) -> tuple[list[Prediction], BatchStats]:
    """Predictions in the order of ``texts``, each text windowed where ``windows`` is given;
    may raise if the model fails."""
    predictions, stats = classify_admitted(loaded, texts, max_length, max_batch_tokens, windows)
    return [prediction for prediction in predictions if prediction is not None], stats


def classify_admitted(
    loaded: LoadedModel,
    texts: Sequence[TextInput],
    max_length: int,
    max_batch_tokens: int,
    windows: Windows | None = None,
    windowed: Sequence[bool] | None = None,
    admit: Admit | None = None,
) -> tuple[list[Prediction | None], BatchStats]:
    """As ``classify``, windowing the texts ``windowed`` marks (all, if None) and forwarding
    only those ``admit`` keeps (None in place of the others); may raise if the model fails."""
    stats = BatchStats(texts=len(texts))
    if not texts:
        return [], stats
    stats.threads = torch.get_num_threads()
    started = time.perf_counter()
    rows = _tokenized_rows(loaded.tokenizer, texts, max_length, windows, windowed, admit)
    stats.tokenize_ms = (time.perf_counter() - started) * 1000
    flat = [(index, window) for index in sorted(rows) for window in rows[index]]
    lengths = [len(window.input_ids) for _, window in flat]
    stats.text_tokens = [sum(len(w.input_ids) for w in rows[i]) for i in sorted(rows)]
    stats.windows = [len(rows[i]) for i in sorted(rows)]
    logits: list[list[float]] = [[] for _ in flat]
    scores: list[list[float]] = [[] for _ in flat]
    sub_batch_of: list[set[int]] = [set() for _ in texts]
    started = time.perf_counter()
    for number, group in enumerate(plan_sub_batches(lengths, max_batch_tokens)):
        input_ids, attention_mask, token_type_ids = model_inputs(
            loaded, [flat[i][1] for i in group]
        )
        forward_started = time.perf_counter()
        try:
            group_logits = forward(loaded, input_ids, attention_mask, token_type_ids)
        except torch.OutOfMemoryError as error:
            torch.cuda.empty_cache()
            raise OutOfMemory(
                f"out of memory on {len(group)} texts padded to {input_ids.shape[1]} tokens"
            ) from error
        stats.sub_batch_forward_ms.append((time.perf_counter() - forward_started) * 1000)
        stats.forward_started.append(forward_started)
        group_scores = apply_score_function(loaded.score_function, group_logits)
        for row, raw, scored in zip(
            group, group_logits.tolist(), group_scores.tolist(), strict=True
        ):
            logits[row], scores[row] = raw, scored
            sub_batch_of[flat[row][0]].add(number)
        stats.sub_batches.append(len(group))
        stats.real_tokens += sum(lengths[i] for i in group)
        stats.padded_tokens += input_ids.numel()
    stats.forward_ms = (time.perf_counter() - started) * 1000
    stats.sub_batch_of = [tuple(sorted(each)) for each in sub_batch_of]
    rule = "mean" if windows is None else combine_rule(head_kind(loaded), windows)
    by_text: dict[int, list[int]] = {}
    for row, (index, _) in enumerate(flat):
        by_text.setdefault(index, []).append(row)
    predictions: list[Prediction | None] = [None] * len(texts)
    for index, text_rows in by_text.items():
        text_scores, text_logits = combine(
            [logits[r] for r in text_rows],
            [scores[r] for r in text_rows],
            [lengths[r] for r in text_rows],
            rule,
        )
        prediction = to_prediction(
            text_scores,
            loaded.labels,
            rows[index][0].truncated,
            text_logits,
            loaded.multi_label_threshold,
        )
        if len(text_rows) > 1:
            prediction = replace(prediction, windows=len(text_rows))
        predictions[index] = prediction
    return predictions, stats


def _tokenized_rows(
    tokenizer: Any,
    texts: Sequence[TextInput],
    max_length: int,
    windows: Windows | None,
    windowed: Sequence[bool] | None,
    admit: Admit | None,
) -> dict[int, list[TokenizedText]]:
    """Each admitted text's rows: its windows (``tokenize_windows``, a chunk at a time, asking
    ``admit`` after each, so a request past its limit stops being tokenized), else its one
    truncated row (``tokenize``)."""
    marked = [windows is not None and (windowed is None or windowed[i]) for i in range(len(texts))]
    plain = [i for i in range(len(texts)) if not marked[i]]
    rows = {
        i: [item]
        for i, item in zip(
            plain, tokenize(tokenizer, [texts[i] for i in plain], max_length), strict=True
        )
    }
    refused: set[int] = set()
    left = [i for i in range(len(texts)) if marked[i]]
    while left and windows is not None:
        if admit is not None:
            refused = admit({i: len(r) for i, r in rows.items()}, False)
            left = [i for i in left if i not in refused]
            if not left:
                break
        run = chunks(left, [_chars(texts[i]) for i in left], TOKENIZE_CHUNK_CHARS)[0]
        found = tokenize_windows(tokenizer, [texts[i] for i in run], max_length, windows.stride)
        rows.update(zip(run, found, strict=True))
        left = left[len(run) :]
    if admit is not None:
        refused = admit({i: len(r) for i, r in rows.items()}, True)
    return {i: r for i, r in rows.items() if i not in refused}


def _chars(text: TextInput) -> int:
    return len(text) if isinstance(text, str) else len(text[0]) + len(text[1])
