"""Two models on one server against one alone (``make models-share``): the default model
served alone, then served twice under two names from one TorchServe, with ``CLIENTS`` closed-loop
clients on each name at once. Sized by ``bert_serve_server.sizing`` as ``make serve`` sizes them (the
cores shared among the models' workers), their answers per second added up should come close
to one model's alone; far less means the two oversubscribe the cores."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from bert_serve_server.archive import DEFAULT_MODEL_DIR, package_variant
from bert_serve_server.config import read_models
from bert_serve_server.control import Server, running
from bert_serve_server.models import package_models, parse_models

from lab.corpus import make_corpus
from lab.load import ClosedLoop, json_job, summary
from lab.machine import describe

CLIENTS = 32
NAMES = ("first", "second")
BAR = 0.8


def loop(server: Server, name: str | None, corpus: list[str], seconds: float) -> ClosedLoop:
    url = server.predict_url if name is None else server.predict_url_for(name)
    job = lambda i: json_job(corpus[i % len(corpus)])  # noqa: E731
    return ClosedLoop(
        url, server.headers(), job, CLIENTS, seconds, max_requests=int(seconds * 5000)
    )


def warm(server: Server, names: tuple[str | None, ...], corpus: list[str]) -> None:
    for name in names:
        loop(server, name, corpus, 2.0).run()


async def side_by_side(loops: list[ClosedLoop]) -> None:
    await asyncio.gather(*(each.run_async() for each in loops))


def run(seconds: float) -> dict[str, Any]:
    corpus = make_corpus()
    with tempfile.TemporaryDirectory(prefix="bert-serve-models-share-") as work:
        alone_store, pair_store = Path(work, "alone"), Path(work, "pair")
        alone_store.mkdir()
        package_variant(alone_store)
        with running({"model_store": str(alone_store)}) as server:
            warm(server, (None,), corpus)
            alone = summary(loop(server, None, corpus, seconds).run())
            alone_sizing = server.sizing()["in_force"]
        specs = parse_models(" ".join(f"{name}={DEFAULT_MODEL_DIR}" for name in NAMES))
        overrides, refused = package_models(specs, pair_store, read_models())
        if overrides is None or refused:
            raise RuntimeError(f"the two models could not be packaged: {refused}")
        with running(overrides | {"model_store": str(pair_store)}) as server:
            warm(server, NAMES, corpus)
            loops = [loop(server, name, corpus, seconds) for name in NAMES]
            asyncio.run(side_by_side(loops))
            pair = {name: summary(each) for name, each in zip(NAMES, loops, strict=True)}
            pair_sizing = server.sizing()["in_force"]
    total = sum(result["rps"] for result in pair.values())
    share = round(total / (alone["rps"] or 1.0), 2)
    return {
        "command": "make models-share",
        "machine": describe(),
        "clients_per_model": CLIENTS,
        "seconds": seconds,
        "alone": {"result": alone, "sizing": alone_sizing},
        "two_models": {"results": pair, "sizing": pair_sizing},
        "sum_over_alone": share,
        "bar": {"needed": f">= {BAR}", "met": share >= BAR},
    }
