import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from thinkmem_ros.consolidator.discovery import Relation
from thinkmem_ros.consolidator.llm import (
    MAX_REPLY_BYTES,
    LLMConfig,
    LLMError,
    LLMResponseError,
    build_messages,
    chat,
    consolidate_with_llm,
    parse_response,
)

DATA = Path(__file__).parent / "data" / "llm"
CFG = LLMConfig(enabled=True, base_url="http://127.0.0.1:9/v1", model="recorded",
                timeout_s=0.5)


def _rel(pattern):
    return Relation(pattern=pattern, support=8, antecedent_support=10, reverse=2,
                    partition_support=(2, 2, 2, 2), p_value=0.0099, accepted=True, reasons=(),
                    episodes=(1, 2, 3), gaps=((20.0, 55.5), (21.0, 59.0)))


OFFERED = [_rel(("E016", "E176", "E030")), _rel(("E101", "E102", "E103"))]


def _recorded(name):
    return json.loads((DATA / name).read_text())


def test_prompt_carries_evidence_and_asks_for_json_only():
    messages = build_messages(OFFERED, CFG)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "JSON" in messages[0]["content"] and "not causes" in messages[0]["content"]
    payload = json.loads(messages[1]["content"].split("\n", 1)[1].rsplit("\n", 1)[0])
    assert payload[0]["pattern"] == ["E016", "E176", "E030"]
    assert payload[0]["counterexamples"] == 2 and payload[0]["reverse_order_episodes"] == 2
    assert len(build_messages(OFFERED * 30, CFG)[1]["content"]) < 40 * 400  # capped


def test_good_recorded_response_parses():
    units = parse_response(_recorded("good.json"), OFFERED)
    assert [u.pattern for u in units] == [("E016", "E176", "E030"), ("E101", "E102", "E103")]
    assert units[0].keep and not units[1].keep
    assert "E030" in units[0].statement


def test_fenced_json_with_prose_parses():
    units = parse_response(_recorded("fenced.json"), OFFERED)
    assert len(units) == 1 and units[0].keep


@pytest.mark.parametrize("name, match", [
    ("malformed_truncated.json", "parse"),
    ("malformed_invented.json", "not offered"),
    ("malformed_no_choices.json", "choices"),
    ("malformed_keep_string.json", "keep"),
    ("malformed_prose.json", "no JSON"),
])
def test_malformed_recorded_responses_raise(name, match):
    with pytest.raises(LLMResponseError, match=match):
        parse_response(_recorded(name), OFFERED)


def test_disabled_by_default_and_transport_injectable():
    assert LLMConfig().enabled is False
    with pytest.raises(LLMError, match="disabled"):
        consolidate_with_llm(OFFERED, LLMConfig())
    seen = {}

    def transport(messages, cfg):  # stands in for the endpoint: replays a recording
        seen["messages"] = messages
        return _recorded("good.json")

    units = consolidate_with_llm(OFFERED, CFG, transport=transport)
    assert len(units) == 2 and seen["messages"][0]["role"] == "system"


def test_unreachable_endpoint_raises_llm_error_within_timeout():
    # port 9 (discard) on loopback is closed here: a real refused connection, no mock
    with pytest.raises(LLMError):
        chat(build_messages(OFFERED, CFG), CFG)


def test_config_validation():
    with pytest.raises(ValueError, match="model"):
        LLMConfig(enabled=True)
    with pytest.raises(ValueError, match="base_url"):
        LLMConfig(base_url="ftp://x")


# ------------------------------------------------------------------ hostile endpoints

def _serve(reply_parts, pause_s=0.0):
    """A real one-shot HTTP endpoint on loopback that answers with ``reply_parts`` (bytes),
    ``pause_s`` apart; returns its base URL."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer():
        conn, _ = server.accept()
        with conn, server:
            _read_request(conn)
            try:
                for part in reply_parts:
                    time.sleep(pause_s)
                    conn.sendall(part)
            except OSError:  # the client gave up first: that is what some cases test
                pass

    threading.Thread(target=answer, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/v1"


def _read_request(conn):
    """The whole request, so closing the socket never resets it under the client."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
    while len(body) < length:
        body += conn.recv(65536)


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def _chat(url, timeout_s=1.0):
    cfg = LLMConfig(enabled=True, base_url=url, model="m", timeout_s=timeout_s)
    return chat(build_messages(OFFERED, cfg), cfg)


def test_a_real_endpoint_answer_is_decoded():
    reply = json.dumps(_recorded("good.json")).encode()
    assert parse_response(_chat(_serve([_ok(reply)])), OFFERED)


@pytest.mark.parametrize("reply, error, match", [
    ([_ok(b"\xff\xff\xff{}")], LLMResponseError, "not JSON"),
    ([_ok(b"[" * 100_000 + b"]" * 100_000)], LLMResponseError, "nested too deeply"),
    ([b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"a\":"], LLMError, "short"),
    ([b"garbage\r\n\r\n"], LLMError, "BadStatusLine"),
    ([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b" " * (MAX_REPLY_BYTES + 1)],
     LLMResponseError, "exceeds"),
], ids=["invalid-utf8", "deep-json", "short-body", "bad-status-line", "oversized"])
def test_a_hostile_reply_is_one_of_the_module_errors(reply, error, match):
    with pytest.raises(error, match=match) as caught:
        _chat(_serve(reply))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("trickle", [
    [b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n"] + [bytes([c]) for c in b'{"choices":1'],
    [bytes([c]) for c in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]],
    ids=["body", "status-and-headers"])
def test_the_timeout_bounds_the_whole_call_not_each_read(trickle):
    """One byte every 0.2 s: each read is quick, the whole answer takes seconds."""
    start = time.monotonic()
    with pytest.raises(LLMError, match="within"):
        _chat(_serve(trickle, pause_s=0.2), timeout_s=0.6)
    assert time.monotonic() - start < 1.2


def test_a_deeply_nested_answer_content_is_a_response_error():
    content = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"
    response = {"choices": [{"message": {"content": content}}]}
    with pytest.raises(LLMResponseError, match="nested too deeply"):
        parse_response(response, OFFERED)
