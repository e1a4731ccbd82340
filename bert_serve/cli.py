"""`bert-serve classify`: classify one text, or every line of a file into a JSONL of results.

`--model NAME` and `--version V` pick the model (default `bert`, its default version).
`bert-serve models` lists what the server serves: each model's versions, the default, the head
kind and the labels (from TorchServe's management API, on the server's machine).

`bert-serve explain "text"` prints which tokens made the label: one line per token with its
importance and a bar (right: towards the label, left: against it), coloured on a terminal
(not when `NO_COLOR` is set or the output is not a terminal); `--json` prints the answer.

A file holds one text per line, or with `--jsonl` one JSON value per line: a string, or an
object `{"text": ..., "text_pair": ...}` (`text_pair` optional) for sentence-pair models.
Exit status: 0 when every text was classified, 1 when any text got an error (its line in the
output says which), 2 when the run could not go on (bad arguments, a malformed JSONL line, no
server, bad token).

A key file found rather than named (`./key_file.json`, `./.run/key_file.json`) is sent only to
the server it belongs to (`key_file_belongs_to`); a named one (`--key-file`, `--token`, their
variables) goes wherever `--url` says.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from tqdm import tqdm

from bert_serve.client import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_MODEL,
    DEFAULT_RETRY_BUDGET_S,
    DEFAULT_TIMEOUT_S,
    DEFAULT_URL,
    Client,
    Explanation,
    ItemResult,
    Text,
    token_from_key_file,
)
from bert_serve.exceptions import BertServeError, BodyTooLarge, Rejected
from bert_serve.models import DEFAULT_MANAGEMENT_URL, ServedModel, list_models

EXIT_OK, EXIT_ITEM_FAILED, EXIT_FAILED = 0, 1, 2
KEY_FILE_CANDIDATES = (Path("key_file.json"), Path(".run") / "key_file.json")
STATE_CONFIG = "config.properties"
"""Beside a server's key file, in its state folder (`make serve`'s `.run/`): the effective
config, whose `inference_address` / `management_address` say where that key is valid."""
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
KEY_OPTIONS = ("--token", "--key")
"""Options whose value is a key. TorchServe's keys are URL-safe base64 and one in 64 begins with
"-", which argparse takes for an option: ``--token -r3_aubd`` is read as ``--token=-r3_aubd``."""


def keys_joined(argv: list[str]) -> list[str]:
    """``argv`` with each key option joined to the word after it (``KEY_OPTIONS``), up to ``--``."""
    joined: list[str] = []
    words = iter(argv)
    for word in words:
        if word == "--":
            return [*joined, word, *words]
        value = next(words, None) if word in KEY_OPTIONS else None
        joined.append(word if value is None else f"{word}={value}")
    return joined


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bert-serve", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    classify = commands.add_parser("classify", help="classify a text, or each line of --file")
    source = classify.add_mutually_exclusive_group(required=True)
    source.add_argument("text", nargs="?", help="one text to classify")
    source.add_argument("--file", help="UTF-8 text file, one text per line ('-' for stdin)")
    classify.add_argument(
        "--text-pair", help="the second text of a pair (for one text; in a file: --jsonl)"
    )
    classify.add_argument(
        "--jsonl",
        action="store_true",
        help='--file holds one JSON string or {"text": ..., "text_pair": ...} per line',
    )
    classify.add_argument("--out", default="-", help="JSONL output for --file (default: stdout)")
    classify.add_argument("--top-k", type=int, help="keep only the k best labels in scores")
    classify.add_argument(
        "--raw-scores", action="store_true", help="the logits, no softmax or sigmoid"
    )
    classify.add_argument(
        "--windows",
        action=argparse.BooleanOptionalAction,
        help="a text over the model's max_length tokens: classified whole as windows, or "
        "(--no-windows) on its first tokens (default: the model's long_texts setting)",
    )
    add_connection_arguments(classify)
    classify.add_argument(
        "--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="texts per request"
    )
    classify.add_argument(
        "--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="requests in flight"
    )
    classify.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    explain = commands.add_parser("explain", help="which tokens made a text's label")
    explain.add_argument("text", help="the text to explain")
    explain.add_argument("--text-pair", help="the second text of a pair")
    explain.add_argument("--target", help="the label to explain (default: the predicted one)")
    explain.add_argument(
        "--n-steps", type=int, help="integrated-gradients steps (default and cap: the server's)"
    )
    explain.add_argument("--json", action="store_true", help="print the answer as JSON")
    add_connection_arguments(explain)
    models = commands.add_parser("models", help="the models the server serves")
    models.add_argument(
        "--management-url",
        default=os.environ.get("BERT_SERVE_MANAGEMENT_URL", DEFAULT_MANAGEMENT_URL),
        help="TorchServe's management API (127.0.0.1 only: run this on the server's machine)",
    )
    add_token_arguments(models, "management")
    models.add_argument("--json", action="store_true", help="one JSON object per version")
    args = parser.parse_args(keys_joined(sys.argv[1:] if argv is None else argv))
    if args.command == "models":
        return args
    if args.command == "explain":
        if args.n_steps is not None and args.n_steps < 1:
            parser.error(f"--n-steps must be at least 1, got {args.n_steps}")
        return args
    if args.text_pair is not None and args.file is not None:
        parser.error("--text-pair goes with one text; in a file, pairs are --jsonl lines")
    if args.jsonl and args.file is None:
        parser.error("--jsonl describes --file")
    if args.top_k is not None and args.top_k < 1:
        parser.error(f"--top-k must be at least 1, got {args.top_k}")
    return args


def add_connection_arguments(command: argparse.ArgumentParser) -> None:
    """Where the server is, how to authenticate, and how long to wait and retry."""
    command.add_argument("--url", default=os.environ.get("BERT_SERVE_URL", DEFAULT_URL))
    command.add_argument("--model", default=DEFAULT_MODEL, help="the model's name")
    command.add_argument("--version", help="the model's version (default: its default version)")
    add_token_arguments(command, "inference")
    command.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds one attempt may wait for an answer before it is retried (default: the server's responseTimeout + 10)",
    )
    command.add_argument(
        "--retries",
        type=int,
        default=4,
        help="retries on a dead worker, 503, 429, 504 deadline_exceeded, connection errors and timeouts",
    )
    command.add_argument(
        "--retry-budget",
        type=float,
        default=DEFAULT_RETRY_BUDGET_S,
        help="seconds after which a call starts no new attempt (backoff honours Retry-After)",
    )
    command.add_argument(
        "--no-deadline-stamp",
        action="store_true",
        help="send no X-Request-Start (this machine's clock), only X-Request-Timeout: the server then sets no deadline unless a proxy stamps the arrival",
    )


def add_token_arguments(command: argparse.ArgumentParser, kind: str) -> None:
    auth = command.add_mutually_exclusive_group()
    auth.add_argument("--token", help=f"TorchServe {kind} key (or $BERT_SERVE_TOKEN)")
    auth.add_argument(
        "--key-file",
        help="TorchServe's key_file.json (or $BERT_SERVE_KEY_FILE; default: ./key_file.json or ./.run/key_file.json if present)",
    )
    if kind == "inference":
        auth.add_argument(
            "--key",
            help="the deployment's key, checked by its proxy (or $BERT_SERVE_KEY); instead of a token",
        )


def resolve_key(args: argparse.Namespace) -> str | None:
    """--key, else $BERT_SERVE_KEY unless a token was passed on the command line."""
    if getattr(args, "key", None):
        return str(args.key)
    if args.token or args.key_file:
        return None
    return os.environ.get("BERT_SERVE_KEY") or None


def resolve_token(
    args: argparse.Namespace, kind: str = "inference", url: str | None = None
) -> str | None:
    """--token, --key-file, their environment variables, else a key file where TorchServe or
    `make serve` leaves it if it belongs to `url` (`key_file_belongs_to`; a found key file that
    does not is named on stderr); None (no Authorization header) if there is none."""
    token = args.token or (None if args.key_file else os.environ.get("BERT_SERVE_TOKEN"))
    if token:
        return str(token)
    key_file = args.key_file or os.environ.get("BERT_SERVE_KEY_FILE")
    if key_file:
        return token_from_key_file(key_file, kind)
    found = [path for path in KEY_FILE_CANDIDATES if path.is_file()]
    target = url or (args.management_url if kind == "management" else args.url)
    for path in found:
        if key_file_belongs_to(path, target, kind):
            return token_from_key_file(path, kind)
    for path in found:
        print(
            f"bert-serve: not sending the key of {path} to {target}: it is for "
            f"{recorded_address(path, kind) or 'a server on this machine (a loopback URL)'}; "
            f"name it with --key-file to send it there",
            file=sys.stderr,
        )
    return None


def recorded_address(key_file: Path, kind: str) -> str | None:
    """The `<kind>_address` (`inference` or `management`) recorded in the state folder beside
    `key_file`, as Java's Properties reads `key=value`, `key: value` or `key value` lines."""
    try:
        text = (key_file.parent / STATE_CONFIG).read_text(encoding="latin-1")
    except OSError:
        return None
    address = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        parts = re.split(r"\s*[=:\s]\s*", line, maxsplit=1)
        if parts[0] == f"{kind}_address" and len(parts) == 2:
            address = re.sub(r"\\(.)", r"\1", parts[1])  # the last one wins, as in Java
    return address


def host_and_port(url: str) -> tuple[str, int] | None:
    """The host (lower case, no brackets) and port (the scheme's default if none) of `url`."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https"):
        return None
    default = 443 if parts.scheme == "https" else 80
    return (parts.hostname or "").rstrip("."), default if port is None else port


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def key_file_belongs_to(key_file: Path, url: str, kind: str = "inference") -> bool:
    """Whether a key file found in the working directory may be sent to `url`: when its state
    folder records the server's address (`recorded_address`), only to that host and port (a
    loopback URL at that port for a server on a loopback or wildcard address); otherwise only to
    a loopback URL. A key found by chance must not travel to a server it is not for."""
    target = host_and_port(url)
    if target is None or not target[0]:
        return False
    recorded = recorded_address(key_file, kind)
    if recorded is None:
        return is_loopback(target[0])
    server = host_and_port(recorded)
    if server is None or server[1] != target[1]:
        return False
    if server[0] == target[0]:
        return True
    return is_loopback(target[0]) and (server[0] in WILDCARD_HOSTS or is_loopback(server[0]))


def read_lines(stream: IO[bytes]) -> Iterator[str]:
    """Each line as text; bytes that are not UTF-8 become lone surrogates, which the server
    refuses as `invalid_encoding` for that line alone instead of the whole file failing here."""
    for number, raw in enumerate(stream):
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        if number == 0 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        yield line.decode("utf-8", errors="surrogateescape")


def read_jsonl(stream: IO[bytes]) -> Iterator[Text]:
    """Each line's text or (text, text_pair); a line that is neither stops the run (ValueError)
    rather than being guessed at. Bad bytes inside a string fail that line, as in `read_lines`."""
    for number, line in enumerate(read_lines(stream), start=1):
        try:
            value = json.loads(line)
        except ValueError as error:
            raise ValueError(f"line {number} is not JSON: {error}") from error
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict) and isinstance(value.get("text"), str):
            pair = value.get("text_pair")
            if pair is not None and not isinstance(pair, str):
                raise ValueError(f'line {number}: "text_pair" must be a string')
            yield value["text"] if pair is None else (value["text"], pair)
        else:
            raise ValueError(
                f'line {number}: expected a JSON string or {{"text": "..."}}, got {line[:80]!r}'
            )


def classify_one(client: Client, args: argparse.Namespace) -> int:
    """One text or pair: its prediction, or its error (exit 1) when the server refuses that
    text; any other failure ends the run (exit 2)."""
    try:
        prediction = client.classify(
            args.text,
            args.text_pair,
            top_k=args.top_k,
            raw_scores=args.raw_scores,
            windows=args.windows,
        )
    except (Rejected, BodyTooLarge) as error:
        print(json.dumps({"error": {"code": error.code, "message": error.message}}))
        return EXIT_ITEM_FAILED
    print(json.dumps(prediction.to_json()))
    return EXIT_OK


BAR_WIDTH = 20
POSITIVE_COLOUR, NEGATIVE_COLOUR, RESET = "\033[32m", "\033[31m", "\033[0m"


def explanation_lines(explanation: Explanation, colour: bool = False) -> list[str]:
    """A header, then one line per token: the token, its importance, and a bar whose length
    is the importance's share of the largest one (right of the axis for the label, left
    against it); green and red when `colour`."""
    header = (
        f"{explanation.label} {explanation.score:.3f}  (delta {explanation.delta:.2g}, "
        f"{explanation.n_steps} steps{', truncated' if explanation.truncated else ''})"
    )
    largest = max((abs(v) for v in explanation.importances), default=0.0) or 1.0
    width = max((len(word) for word in explanation.words), default=0)
    lines = [header]
    for word, value in zip(explanation.words, explanation.importances):
        cells = round(abs(value) / largest * BAR_WIDTH)
        left = ("\u2588" * cells if value < 0 else "").rjust(BAR_WIDTH)
        right = ("\u2588" * cells if value > 0 else "").ljust(BAR_WIDTH)
        if colour and cells:
            left = left.replace("\u2588" * cells, NEGATIVE_COLOUR + "\u2588" * cells + RESET)
            right = right.replace("\u2588" * cells, POSITIVE_COLOUR + "\u2588" * cells + RESET)
        lines.append(f"{word.ljust(width)} {value:+.3f} {left}|{right}".rstrip())
    return lines


def use_colour(stream: IO[str]) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def explain_one(client: Client, args: argparse.Namespace) -> int:
    """One text's explanation; its error (exit 1) when the server refuses that text."""
    target: str | int | None = args.target
    try:
        explanation = client.explain(args.text, args.text_pair, target=target, n_steps=args.n_steps)
    except (Rejected, BodyTooLarge) as error:
        print(json.dumps({"error": {"code": error.code, "message": error.message}}))
        return EXIT_ITEM_FAILED
    if args.json:
        print(json.dumps(explanation.to_json()))
    else:
        print("\n".join(explanation_lines(explanation, use_colour(sys.stdout))))
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
            (read_jsonl if args.jsonl else read_lines)(source),
            chunk_size=args.chunk_size,
            concurrency=args.concurrency,
            top_k=args.top_k,
            raw_scores=args.raw_scores,
            windows=args.windows,
        )
        try:
            for line, result in enumerate(results, start=1):
                out.write(json.dumps({"line": line, **result.to_json()}) + "\n")
                outcomes[_outcome_name(result)] += 1
                progress.update()
        except (BertServeError, ValueError) as error:
            written = sum(outcomes.values())
            print(
                f"bert-serve: {error}; stopped after {written} texts (their results are written)",
                file=sys.stderr,
            )
            return EXIT_FAILED
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


def model_lines(models: list[ServedModel]) -> list[str]:
    """One aligned line per version: name, version, default mark, head, labels."""
    rows = [("NAME", "VERSION", "DEFAULT", "HEAD", "ARCHITECTURE", "LABELS")]
    rows += [
        (m.name, m.version, "*" if m.default else "", m.head, m.architecture, ", ".join(m.labels))
        for m in models
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[5]
        for row in rows
    ]


def show_models(args: argparse.Namespace) -> int:
    token = resolve_token(args, "management", args.management_url)
    models = list_models(args.management_url, token)
    if args.json:
        for model in models:
            print(json.dumps(model.to_json()))
    else:
        print("\n".join(model_lines(models)))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "models":
            return show_models(args)
        key = resolve_key(args)
        client = Client(
            args.url,
            model=args.model,
            version=args.version,
            token=None if key else resolve_token(args, "inference", args.url),
            key=key,
            timeout=args.timeout,
            retries=args.retries,
            retry_budget=args.retry_budget,
            stamp_deadline=not args.no_deadline_stamp,
        )
        if args.command == "explain":
            return explain_one(client, args)
        if args.file is None:
            return classify_one(client, args)
        return classify_file(client, args)
    except (BertServeError, ValueError, OSError) as error:
        print(f"bert-serve: {error}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
