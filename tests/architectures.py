"""Tiny classifiers of the architectures teams bring, each with a realistic fast tokenizer.

Every tokenizer is trained offline here with ``tokenizers`` on a small corpus, then handed to
the model's own transformers tokenizer class, which lays out its normalizer, special tokens and
templates as the hub's folders have them:

- WordPiece for BERT, DistilBERT and ELECTRA (``[PAD]`` = 0);
- byte-level BPE for RoBERTa (``<pad>`` = 1: positions are counted after it) and for ModernBERT
  (its pad ``[PAD]`` sits after the vocabulary, as in its 50,283);
- Unigram (SentencePiece-like) for XLM-RoBERTa (``<pad>`` = 1), ALBERT (``<pad>`` = 0) and
  DeBERTa-v2/v3 (``[PAD]`` = 0, ``[UNK]`` = 3).

Models are 2 layers, 32 wide, random weights drawn wide (``initializer_range`` 0.3, as in
``tests/heads.py``) so texts score apart. Weights never matter for exactness: the handler must
answer what transformers' pipeline answers for the same folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tests.heads import ITEMS

LABELS = ("negative", "neutral", "positive")
SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "initializer_range": 0.3,
}
CORPUS = [
    *(text for item in ITEMS for text in ([item] if isinstance(item, str) else item)),
    "The quick brown fox jumps over the lazy dog.",
    "An absolute delight from start to finish, with a cast that never misses.",
    "A tedious, joyless mess; I wanted my two hours back.",
    "Les films français sont parfois longs, mais souvent très beaux.",
    "Der Kellner war freundlich und das Essen kam schnell.",
    "Is it raining? The streets are wet and the sky is grey.",
    "Numbers like 42, 3.14 and 2026 appear in reviews too.",
]


@dataclass(frozen=True)
class Architecture:
    model_class: str
    """The transformers class; its config is ``<prefix>Config``."""
    tokenizer: str
    """The kind of tokenizer trained for it (for the table in docs/own-model.md)."""
    build_tokenizer: Callable[[], Any]
    config: dict[str, Any]
    attention: str
    """What ``attention: auto`` should pick for it."""


def trained(model: Any, trainer: Any, pre_tokenizer: Any) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    return tokenizer


def wordpiece(tokenizer_class: str) -> Callable[[], Any]:
    def build() -> Any:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        backend = trained(
            models.WordPiece(unk_token="[UNK]"),
            trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials),
            pre_tokenizers.BertPreTokenizer(),
        )
        return getattr(transformers, tokenizer_class)(vocab=backend.get_vocab())

    return build


def byte_level_bpe(specials: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    backend = trained(
        models.BPE(),
        trainers.BpeTrainer(
            vocab_size=500,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    )
    model = json.loads(backend.to_str())["model"]
    return model["vocab"], [tuple(merge) for merge in model["merges"]]


def roberta_tokenizer() -> Any:
    vocab, merges = byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    return transformers.RobertaTokenizer(vocab=vocab, merges=merges)


def modernbert_tokenizer() -> Any:
    """ModernBERT's own layout: byte-level BPE, the special tokens after the vocabulary
    (``[UNK] [CLS] [SEP] [PAD] [MASK]``), ``[CLS] $A [SEP]`` templates, no token types."""
    vocab, merges = byte_level_bpe([])
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )


def unigram(tokenizer_class: str, specials: list[str], **options: Any) -> Callable[[], Any]:
    def build() -> Any:
        backend = trained(
            models.Unigram(),
            trainers.UnigramTrainer(
                vocab_size=300, special_tokens=specials, unk_token=options.get("unk_token")
            ),
            pre_tokenizers.Metaspace(),
        )
        vocab = [tuple(entry) for entry in json.loads(backend.to_str())["model"]["vocab"]]
        return getattr(transformers, tokenizer_class)(vocab=vocab, **options)

    return build


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(
        "BertForSequenceClassification", "WordPiece", wordpiece("BertTokenizer"), SMALL, "sdpa"
    ),
    "distilbert": Architecture(
        "DistilBertForSequenceClassification",
        "WordPiece",
        wordpiece("DistilBertTokenizer"),
        {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "initializer_range": 0.3},
        "sdpa",
    ),
    "roberta": Architecture(
        "RobertaForSequenceClassification",
        "byte-level BPE, <pad> = 1",
        roberta_tokenizer,
        SMALL
        | {
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "max_position_embeddings": 514,
            "type_vocab_size": 1,
        },
        "sdpa",
    ),
    "xlm-roberta": Architecture(
        "XLMRobertaForSequenceClassification",
        "Unigram, <pad> = 1",
        unigram(
            "XLMRobertaTokenizer", ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], unk_token="<unk>"
        ),
        SMALL
        | {
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "max_position_embeddings": 514,
            "type_vocab_size": 1,
        },
        "sdpa",
    ),
    "electra": Architecture(
        "ElectraForSequenceClassification",
        "WordPiece",
        wordpiece("ElectraTokenizer"),
        SMALL | {"embedding_size": 16},
        "sdpa",
    ),
    "albert": Architecture(
        "AlbertForSequenceClassification",
        "Unigram, <pad> = 0",
        unigram(
            "AlbertTokenizer", ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"], unk_token="<unk>"
        ),
        SMALL | {"embedding_size": 16, "pad_token_id": 0},
        "sdpa",
    ),
    "deberta-v2": Architecture(
        "DebertaV2ForSequenceClassification",
        "Unigram, [PAD] = 0",
        unigram(
            "DebertaV2Tokenizer",
            ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"],
            unk_token="[UNK]",
            unk_id=3,
        ),
        SMALL
        | {
            "pad_token_id": 0,
            "relative_attention": True,
            "position_buckets": 64,
            "pos_att_type": ["p2c", "c2p"],
            "position_biased_input": False,
            "max_relative_positions": -1,
            "type_vocab_size": 0,
            "norm_rel_ebd": "layer_norm",
            "share_att_key": True,
        },
        "eager",
    ),
    "modernbert": Architecture(
        "ModernBertForSequenceClassification",
        "byte-level BPE, [PAD] after the vocabulary",
        modernbert_tokenizer,
        SMALL | {"global_attn_every_n_layers": 2, "local_attention": 16},
        "sdpa",
    ),
}


def build_architecture(out: Path, name: str, seed: int = 0) -> Path:
    """Save a 3-label classifier of ``name`` (a key of ``ARCHITECTURES``) and its trained
    tokenizer into ``out``; the config's special ids are the tokenizer's."""
    architecture = ARCHITECTURES[name]
    tokenizer = architecture.build_tokenizer()
    model_class = getattr(transformers, architecture.model_class)
    config_class = getattr(
        transformers, architecture.model_class.replace("ForSequenceClassification", "Config")
    )
    ids = {
        role: getattr(tokenizer, f"{role}_token_id") for role in ("pad", "cls", "sep", "bos", "eos")
    }
    ids["bos"] = ids["bos"] if ids["bos"] is not None else ids["cls"]
    ids["eos"] = ids["eos"] if ids["eos"] is not None else ids["sep"]
    special_ids = {f"{role}_token_id": id for role, id in ids.items() if id is not None}
    config = config_class(
        vocab_size=len(tokenizer),
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: index for index, label in enumerate(LABELS)},
        **(architecture.config | special_ids),
    )
    torch.manual_seed(seed)
    model = model_class(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
