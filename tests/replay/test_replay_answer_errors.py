"""Answers that carry a Kafka error are counted by error in the replay's summary, not as plain successes."""

from __future__ import annotations

from protocol.apis import PRODUCE
from protocol.deep import encode_request, encode_response
from protocol.frames import parse_request
from replay.messages import answer_errors
from replay.schedule import ReplayResult


def _produce_answer(error_code: int) -> bytes:
    part = {"index": 0, "error_code": error_code, "base_offset": -1, "log_append_time_ms": -1, "log_start_offset": -1,
            "record_errors": [], "error_message": None}
    return encode_response(PRODUCE, 9, 7, {"responses": [{"name": "orders", "partition_responses": [part]}],
                                           "throttle_time_ms": 0})


def test_an_answer_names_its_errors_and_the_summary_counts_them() -> None:
    """A replay whose Produce batches the target refused (INVALID_PRODUCER_EPOCH: transactions v2 epochs) said
    "728 answered … 0 failed" and exited 0."""
    sent = parse_request(encode_request(PRODUCE, 9, 7, "kp", {"transactional_id": None, "acks": -1,
                                                             "timeout_ms": 30000, "topic_data": []}))
    assert answer_errors(sent, _produce_answer(47)) == {"INVALID_PRODUCER_EPOCH"}
    assert answer_errors(sent, _produce_answer(0)) == set()
    assert answer_errors(sent, (4).to_bytes(4, "big") + (7).to_bytes(4, "big")) == set()  # unreadable: no claim
    result = ReplayResult(sent=3, answered=3)
    result.answer_errors["Produce INVALID_PRODUCER_EPOCH"] += 2
    summary = result.summary()
    assert "answered with an error (counted as answered): 2 error(s)" in summary
    assert "error       2  Produce INVALID_PRODUCER_EPOCH" in summary
