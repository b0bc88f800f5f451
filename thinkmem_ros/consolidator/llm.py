"""Optional LLM consolidation through any OpenAI-compatible chat endpoint (off by default).

The statistics decide WHICH relations are accepted; the LLM only organises and phrases
them as reusable thinking knowledge (seed 000 §IV-G: statistics alone matched the LLM on
identification). So the LLM sees the accepted relations with their evidence and returns,
per relation, a short statement and whether it would keep it. Its answer can only drop
or phrase a relation: a pattern that is not among those offered is rejected, never added.
Any malformed answer raises :class:`LLMResponseError` and the caller keeps the statistics
result unchanged.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from thinkmem_ros.consolidator.discovery import Relation

SYSTEM_PROMPT = (
    "You consolidate robot experience into reusable thinking knowledge. You receive "
    "ordered event relations A...B...C that a statistical test accepted across independent "
    "episodes, with their evidence. Event codes have no meaning; judge only the evidence. "
    "For each relation write one sentence of thinking knowledge ('after A and later B, "
    "consider a possible C') and say whether to keep it. Treat relations as predictive "
    "regularities, not causes. Answer with JSON only: "
    '{"units": [{"pattern": ["A", "B", "C"], "keep": true, "statement": "..."}]}')


class LLMError(RuntimeError):
    """The endpoint could not be reached or answered with an HTTP error."""


class LLMResponseError(ValueError):
    """The endpoint answered, but not with the JSON this module asked for."""


@dataclass
class LLMConfig:
    """Where the chat endpoint lives; ``enabled`` is False unless configured."""

    enabled: bool = False
    base_url: str = "https://api.openai.com/v1"
    model: str = ""
    api_key: str = ""
    api_key_env: str = "THINKMEM_LLM_API_KEY"
    timeout_s: float = 30.0
    temperature: float = 0.0
    max_relations: int = 20

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got "
                             f"{self.base_url!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.enabled and not self.model:
            raise ValueError("model must be set when the LLM is enabled")
        if self.max_relations < 1:
            raise ValueError(f"max_relations must be >= 1, got {self.max_relations}")

    def key(self) -> str:
        """The API key: explicit value, else the environment variable (may be empty)."""
        return self.api_key or os.environ.get(self.api_key_env, "")


@dataclass(frozen=True)
class LLMUnit:
    """The LLM's verdict on one offered relation."""

    pattern: tuple[str, ...]
    keep: bool
    statement: str


def _evidence(rel: Relation) -> dict:
    return {"pattern": list(rel.pattern), "support_episodes": rel.support,
            "antecedent_episodes": rel.antecedent_support,
            "counterexamples": rel.counterexamples, "reverse_order_episodes": rel.reverse,
            "support_per_period": list(rel.partition_support),
            "permutation_p": round(rel.p_value, 4),
            "gaps": [[round(lo, 2), round(hi, 2)] for lo, hi in rel.gaps]}


def build_messages(relations: Sequence[Relation], cfg: LLMConfig) -> list[dict]:
    """Chat messages offering at most ``cfg.max_relations`` relations with their evidence."""
    offered = [_evidence(r) for r in list(relations)[:cfg.max_relations]]
    user = ("Accepted relations with evidence (JSON):\n" + json.dumps(offered, indent=1)
            + "\nReturn the JSON object described in the instructions, one entry per relation.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _content(response: dict) -> str:
    try:
        content = response["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as err:
        raise LLMResponseError(f"response has no choices[0].message.content: {err!r}") from None
    if not isinstance(content, str) or not content.strip():
        raise LLMResponseError("response content is empty or not text")
    return content


def _json_object(text: str) -> dict:
    fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.DOTALL)
    if fenced:
        candidate = fenced.group(1)
    else:
        start, end = text.find("{"), text.rfind("}")
        if start < 0:
            raise LLMResponseError("no JSON object in the response")
        if end < start:
            raise LLMResponseError("response JSON does not parse: unterminated (truncated?)")
        candidate = text[start:end + 1]
    try:
        value = json.loads(candidate)
    except json.JSONDecodeError as err:
        raise LLMResponseError(f"response JSON does not parse: {err}") from None
    if not isinstance(value, dict):
        raise LLMResponseError("response JSON is not an object")
    return value


def parse_response(response: dict, offered: Sequence[Relation]) -> list[LLMUnit]:
    """Validate an OpenAI-style chat completion against the relations that were offered."""
    body = _json_object(_content(response))
    units = body.get("units")
    if not isinstance(units, list):
        raise LLMResponseError("'units' must be a list")
    allowed = {tuple(r.pattern) for r in offered}
    out = []
    for i, item in enumerate(units):
        if not isinstance(item, dict):
            raise LLMResponseError(f"units[{i}] is not an object")
        pattern = item.get("pattern")
        if not isinstance(pattern, list) or not all(isinstance(p, str) for p in pattern):
            raise LLMResponseError(f"units[{i}].pattern must be a list of event codes")
        if tuple(pattern) not in allowed:
            raise LLMResponseError(f"units[{i}].pattern {pattern} was not offered")
        keep, statement = item.get("keep"), item.get("statement", "")
        if not isinstance(keep, bool):
            raise LLMResponseError(f"units[{i}].keep must be true or false")
        if not isinstance(statement, str) or len(statement) > 500:
            raise LLMResponseError(f"units[{i}].statement must be text of <= 500 characters")
        out.append(LLMUnit(pattern=tuple(pattern), keep=keep, statement=statement.strip()))
    return out


def chat(messages: list[dict], cfg: LLMConfig) -> dict:
    """POST to ``{base_url}/chat/completions`` with a timeout; returns the decoded JSON."""
    payload = json.dumps({"model": cfg.model, "messages": messages,
                          "temperature": cfg.temperature}).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if cfg.key():
        headers["Authorization"] = f"Bearer {cfg.key()}"
    request = urllib.request.Request(cfg.base_url.rstrip("/") + "/chat/completions",
                                     data=payload, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=cfg.timeout_s) as reply:
            raw = reply.read()
    except urllib.error.HTTPError as err:
        raise LLMError(f"LLM endpoint answered HTTP {err.code}") from err
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        raise LLMError(f"LLM endpoint unreachable: {err}") from err
    try:
        return json.loads(raw)
    except json.JSONDecodeError as err:
        raise LLMResponseError(f"endpoint reply is not JSON: {err}") from None


def consolidate_with_llm(relations: Sequence[Relation], cfg: LLMConfig,
                         transport=chat) -> list[LLMUnit]:
    """Ask the LLM to phrase/keep ``relations``; ``transport`` is injectable for tests."""
    if not cfg.enabled:
        raise LLMError("LLM consolidation is disabled (LLMConfig.enabled is False)")
    offered = list(relations)[:cfg.max_relations]
    if not offered:
        return []
    return parse_response(transport(build_messages(offered, cfg), cfg), offered)
