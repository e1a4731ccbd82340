"""The handler inside TorchServe's worker code (ts.service.Service), with a tiny BERT."""

from __future__ import annotations

import json

import pytest

from tests.worker_harness import Answer, Sent, predict

GOOD = Sent(b"a perfectly fine sentence")


@pytest.fixture(scope="module")
def service(tiny_worker):
    return tiny_worker()


def body(answer: Answer) -> dict:
    return json.loads(answer.body)


def test_mixed_batch_answers_each_request_at_its_index(service) -> None:
    """Bad items get their own 4xx; their batch-mates get 200, in request order."""
    sent = [
        GOOD,
        Sent(b"   "),
        Sent(b'{"text": 5}', "application/json"),
        Sent(b"\xff\xfe\xfd"),
        Sent(b'{"text": "fine json"}', "application/json"),
        Sent(b'{"text": ', "application/json"),
        Sent(b'{"no": "text"}', "application/json"),
        Sent(b"x" * 10_001),
        Sent(None, "application/x-www-form-urlencoded"),
        Sent(None, None, fields=(("text", b"a form field"),)),
    ]
    answers = predict(service[0], sent)
    assert [a.status for a in answers] == [200, 400, 400, 400, 200, 400, 400, 413, 400, 200]
    codes = [body(a).get("error", {}).get("code") for a in answers]
    assert codes == [
        None,
        "empty_text",
        "invalid_type",
        "invalid_encoding",
        None,
        "invalid_json",
        "missing_field",
        "payload_too_large",
        "missing_field",
        None,
    ]
    assert all(a.content_type == "application/json" for a in answers)
    for index, answer in enumerate(answers):
        assert body(answer)["request_id"] == f"ts-{index}"
        if answer.status == 200:
            assert set(body(answer)) == {"label", "score", "scores", "truncated", "request_id"}


def test_client_request_id_is_used_only_when_sane(service) -> None:
    """A client's X-Request-ID comes back; a malformed one is replaced by TorchServe's ID."""
    sent = [
        Sent(b"hello", headers=(("X-Request-ID", "client-42.a:b"),)),
        Sent(b"hello", headers=(("x-request-id", "has spaces and <tags>"),)),
        Sent(b"hello", headers=(("X-Request-Id", "z" * 129),)),
        Sent(b"", headers=(("X-Request-ID", "bad-item-7"),)),
    ]
    ids = [body(a)["request_id"] for a in predict(service[0], sent)]
    assert ids == ["client-42.a:b", "ts-1", "ts-2", "bad-item-7"]


def test_scores_do_not_depend_on_batch_mates(service) -> None:
    """The same text alone and among texts of other lengths scores the same within 1e-4."""
    text = b"the soundtrack was lovely but the plot dragged"
    alone = body(predict(service[0], [Sent(text)])[0])["scores"]
    mates = [Sent(b"ok"), Sent(text), Sent(b"long " * 120), GOOD, Sent(b"")]
    together = body(predict(service[0], mates)[1])["scores"]
    for label, probability in alone.items():
        assert together[label] == pytest.approx(probability, abs=1e-4)


def test_long_text_is_windowed_unless_the_request_says_truncate(service) -> None:
    """A text over max_length tokens is classified as windows by default (it says how many),
    and on its first max_length tokens, flagged truncated, with "windows": false; a short
    text's answer is the same either way."""
    long = json.dumps({"text": "word " * 400})
    cut = json.dumps({"text": "word " * 400, "windows": False})
    short = json.dumps({"text": "a short text", "windows": False})
    sent = [Sent(b.encode(), "application/json") for b in (long, cut, short)]
    windowed, truncated, plain = [body(a) for a in predict(service[0], [*sent, GOOD])][:3]
    # 400 words in windows of 126 with 32 repeated: 126, then 94 new tokens a window
    assert windowed["truncated"] is False and windowed["windows"] == 4
    assert truncated["truncated"] is True and "windows" not in truncated
    assert "windows" not in plain and plain["truncated"] is False


def test_model_failure_fails_only_this_batch_and_worker_recovers(service, monkeypatch) -> None:
    """A forward pass that raises answers 500 to the valid items; bad items keep their 4xx."""
    _, handler = service

    def broken(*args, **kwargs):
        raise RuntimeError("simulated model failure")

    monkeypatch.setattr(handler.loaded.model, "forward", broken)
    answers = predict(service[0], [GOOD, Sent(b""), GOOD])
    assert [a.status for a in answers] == [500, 400, 500]
    assert body(answers[0])["error"]["code"] == "internal_error"
    monkeypatch.undo()
    assert [a.status for a in predict(service[0], [GOOD])] == [200]


def test_out_of_device_memory_fails_only_this_batch_and_frees_the_cache(
    service, monkeypatch
) -> None:
    """CUDA out of memory (injected: this machine may have no GPU) answers 500 to that batch's
    valid items only, says so, empties the device cache, and the next batch is answered."""
    import torch

    _, handler = service
    emptied: list[int] = []

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(handler.loaded.model, "forward", out_of_memory)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    answers = predict(service[0], [GOOD, Sent(b""), GOOD])
    assert [a.status for a in answers] == [500, 400, 500]
    assert "out of memory" in body(answers[0])["error"]["message"]
    assert emptied, "the device cache was not emptied"
    monkeypatch.undo()
    assert [a.status for a in predict(service[0], [GOOD, GOOD])] == [200, 200]


def test_batch_of_only_bad_items_runs_no_forward(service, monkeypatch) -> None:
    """When nothing is valid the model is never called."""
    _, handler = service
    calls = []
    monkeypatch.setattr(handler.loaded.model, "forward", lambda *a, **k: calls.append(1))
    answers = predict(service[0], [Sent(b""), Sent(b"\xc3"), Sent(b"[1]", "application/json")])
    assert [a.status for a in answers] == [400, 400, 400]
    assert calls == []


def test_malformed_worker_input_still_answers_every_request(service) -> None:
    """Entries TorchServe should never send (None, a list) still get one answer each."""
    _, handler = service
    context = service[0].context
    context.request_ids = {0: "a", 1: "b"}
    from ts.context import RequestProcessor

    context.request_processor = [RequestProcessor({}), RequestProcessor({})]
    responses = handler.handle([None, ["odd"]], context)
    assert len(responses) == 2
    assert [context.get_response_status(i)[0] for i in range(2)] == [400, 400]


def test_sub_batches_give_the_same_scores(tiny_worker) -> None:
    """A small token budget splits the batch into length groups without changing any score."""
    texts = [
        b"short",
        b"a bit longer text here",
        b"word " * 60,
        b"mid length sentence for the test",
        b"x",
    ]
    whole_service = tiny_worker(max_batch_tokens=100_000).service
    split_service = tiny_worker(max_batch_tokens=128).service
    whole = [body(a)["scores"] for a in predict(whole_service, [Sent(t) for t in texts])]
    split = [body(a)["scores"] for a in predict(split_service, [Sent(t) for t in texts])]
    for one, other in zip(whole, split, strict=True):
        assert one == pytest.approx(other, abs=1e-4)


def test_the_management_describe_answers_the_models_head_and_labels(service) -> None:
    """TorchServe's GET /models/{name}/{version}?customized=true sends a lone request with a
    ``describe: True`` header: it answers what `bert-serve models` lists, not a prediction."""
    (answer,) = predict(service[0], [Sent(None, None, headers=(("describe", "True"),))])
    assert answer.status == 200
    described = body(answer)
    assert 128 <= described.pop("max_batch_tokens") <= 64 * 128, "measured at the worker's start"
    assert described | {"device": "cpu"} == {
        "model": "bert",
        "version": "1.0",
        "architecture": "BertForSequenceClassification",
        "head": "single_label",
        "labels": ["negative", "positive"],
        "score_function": "softmax",
        "multi_label_threshold": None,
        "max_length": 128,
        "precision": "fp32",
        "device": "cpu",
    }
    (plain,) = predict(service[0], [GOOD])
    assert "label" in body(plain)
