"""`bert-serve classify`: classify one text, or every line of a file into a JSONL of results.

Exit status: 0 when every text was classified, 1 when any text got an error (its line in the
output says which), 2 when the run could not go on (bad arguments, no server, bad token).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from tqdm import tqdm

from bert_serve.client import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_MODEL,
    DEFAULT_TIMEOUT_S,
    DEFAULT_URL,
    BertServeError,
    Client,
    ItemResult,
    token_from_key_file,
)

EXIT_OK, EXIT_ITEM_FAILED, EXIT_FAILED = 0, 1, 2
KEY_FILE_CANDIDATES = (Path("key_file.json"), Path(".run") / "key_file.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bert-serve", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    classify = commands.add_parser("classify", help="classify a text, or each line of --file")
    source = classify.add_mutually_exclusive_group(required=True)
    source.add_argument("text", nargs="?", help="one text to classify")
    source.add_argument("--file", help="UTF-8 text file, one text per line ('-' for stdin)")
    classify.add_argument("--out", default="-", help="JSONL output for --file (default: stdout)")
    classify.add_argument("--url", default=os.environ.get("BERT_SERVE_URL", DEFAULT_URL))
    classify.add_argument("--model", default=DEFAULT_MODEL)
    auth = classify.add_mutually_exclusive_group()
    auth.add_argument("--token", help="TorchServe inference key (or $BERT_SERVE_TOKEN)")
    auth.add_argument(
        "--key-file",
        help="TorchServe's key_file.json (or $BERT_SERVE_KEY_FILE; default: ./key_file.json or ./.run/key_file.json if present)",
    )
    classify.add_argument(
        "--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="texts per request"
    )
    classify.add_argument(
        "--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="requests in flight"
    )
    classify.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds one attempt may wait for an answer before it is retried (default: the server's responseTimeout + 10)",
    )
    classify.add_argument(
        "--retries",
        type=int,
        default=4,
        help="retries on a dead worker, 503, connection errors and timeouts",
    )
    classify.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser.parse_args(argv)


def resolve_token(args: argparse.Namespace) -> str | None:
    """--token, --key-file, their environment variables, else a key file where TorchServe or
    `make serve` leaves it; None (no Authorization header) if there is none."""
    token = args.token or (None if args.key_file else os.environ.get("BERT_SERVE_TOKEN"))
    if token:
        return str(token)
    key_file = args.key_file or os.environ.get("BERT_SERVE_KEY_FILE")
    if key_file:
        return token_from_key_file(key_file)
    found = next((path for path in KEY_FILE_CANDIDATES if path.is_file()), None)
    return token_from_key_file(found) if found else None


def read_lines(stream: IO[bytes]) -> Iterator[str]:
    """Each line as text; bytes that are not UTF-8 become lone surrogates, which the server
    refuses as `invalid_encoding` for that line alone instead of the whole file failing here."""
    for number, raw in enumerate(stream):
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        if number == 0 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        yield line.decode("utf-8", errors="surrogateescape")


def classify_one(client: Client, text: str) -> int:
    try:
        print(json.dumps(ItemResult(prediction=client.classify(text)).to_json()))
    except BertServeError as error:
        if error.status is None or error.status >= 500 or error.code == "unauthorized":
            raise
        print(json.dumps({"error": {"code": error.code, "message": error.message}}))
        return EXIT_ITEM_FAILED
    return EXIT_OK


def classify_file(client: Client, args: argparse.Namespace) -> int:
    outcomes: Counter[str] = Counter()
    with ExitStack() as stack:
        source = (
            sys.stdin.buffer if args.file == "-" else stack.enter_context(open(args.file, "rb"))
        )
        out = (
            sys.stdout
            if args.out == "-"
            else stack.enter_context(open(args.out, "w", encoding="utf-8"))
        )
        progress = stack.enter_context(
            tqdm(unit="text", disable=args.no_progress or None, file=sys.stderr)
        )
        results = client.classify_iter(
            read_lines(source), chunk_size=args.chunk_size, concurrency=args.concurrency
        )
        try:
            for line, result in enumerate(results, start=1):
                out.write(json.dumps({"line": line, **result.to_json()}) + "\n")
                outcomes[_outcome_name(result)] += 1
                progress.update()
        except BertServeError as error:
            message = f"{error.message}; stopped after {sum(outcomes.values())} texts (their results are written)"
            raise BertServeError(error.code, message, error.status, error.request_id) from error
    print(summary(outcomes), file=sys.stderr)
    return EXIT_ITEM_FAILED if any(name.startswith("error:") for name in outcomes) else EXIT_OK


def _outcome_name(result: ItemResult) -> str:
    if result.prediction is not None:
        return result.prediction.label
    assert result.error is not None
    return f"error:{result.error.code}"


def summary(outcomes: Counter[str]) -> str:
    """'500 texts: 495 classified (negative 270, positive 225), 5 failed (empty_text 3, ...)'."""
    labels = {name: n for name, n in outcomes.most_common() if not name.startswith("error:")}
    errors = {
        name.removeprefix("error:"): n
        for name, n in outcomes.most_common()
        if name.startswith("error:")
    }
    parts = [f"{sum(outcomes.values())} texts: {sum(labels.values())} classified"]
    if labels:
        parts[0] += " (" + ", ".join(f"{name} {n}" for name, n in labels.items()) + ")"
    parts.append(f"{sum(errors.values())} failed")
    if errors:
        parts[1] += " (" + ", ".join(f"{code} {n}" for code, n in errors.items()) + ")"
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        client = Client(
            args.url,
            model=args.model,
            token=resolve_token(args),
            timeout=args.timeout,
            retries=args.retries,
        )
        if args.file is None:
            return classify_one(client, args.text)
        return classify_file(client, args)
    except (BertServeError, ValueError, OSError) as error:
        print(f"bert-serve: {error}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
