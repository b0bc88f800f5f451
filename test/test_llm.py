import json
from pathlib import Path

import pytest

from thinkmem_ros.consolidator.discovery import Relation
from thinkmem_ros.consolidator.llm import (
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
