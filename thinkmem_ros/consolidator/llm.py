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

import http.client
import json
import os
import re
import threading
import time
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

# Why 4 MiB: the answer for at most ``max_relations`` relations of <= 500-character statements
# is tens of KiB even with a verbose model; an endpoint sending more is broken or hostile, and
# reading it whole held as much memory as it chose to send in the consolidator's process.
MAX_REPLY_BYTES = 4 * 1024 * 1024
_CHUNK_BYTES = 64 * 1024


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
    except RecursionError:
        raise LLMResponseError("response JSON is nested too deeply") from None
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
    """POST to ``{base_url}/chat/completions``; returns the decoded JSON.

    Any failure is an :class:`LLMError` (no complete HTTP answer in time) or an
    :class:`LLMResponseError` (an answer, but not JSON), so the caller's fallback to the
    statistics result always applies. ``cfg.timeout_s`` bounds the whole call: urllib's
    timeout applies to each socket operation, so a server sending its reply one byte at a
    time kept a 1 s call going for 7 s.
    """
    deadline = time.monotonic() + cfg.timeout_s
    request = _request(messages, cfg)
    return _decode(_within(deadline, cfg.timeout_s, lambda: _fetch(request, deadline)))


def _request(messages: list[dict], cfg: LLMConfig) -> urllib.request.Request:
    payload = json.dumps({"model": cfg.model, "messages": messages,
                          "temperature": cfg.temperature}).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if cfg.key():
        headers["Authorization"] = f"Bearer {cfg.key()}"
    return urllib.request.Request(cfg.base_url.rstrip("/") + "/chat/completions",
                                  data=payload, headers=headers, method="POST")


def _within(deadline: float, timeout_s: float, fetch):
    """Run ``fetch`` in a helper thread and wait for it no longer than ``deadline``.

    Why a thread: the status line and headers are read inside ``urlopen``, out of reach of
    a deadline check, and name resolution has no timeout at all. A helper left behind ends
    at its own next deadline check or socket timeout; it is a daemon, so it never holds up
    the process's exit.
    """
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["raw"] = fetch()
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="thinkmem-llm", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if worker.is_alive():
        raise LLMError(f"LLM endpoint gave no complete answer within {timeout_s} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["raw"]


def _fetch(request: urllib.request.Request, deadline: float) -> bytes:
    """The reply body, with every transport failure turned into an :class:`LLMError`."""
    try:
        reply = urllib.request.urlopen(request, timeout=max(0.001, deadline - time.monotonic()))
    except urllib.error.HTTPError as err:
        raise LLMError(f"LLM endpoint answered HTTP {err.code}") from err
    except (urllib.error.URLError, OSError) as err:
        raise LLMError(f"LLM endpoint unreachable: {_said(err)}") from err
    except (http.client.HTTPException, ValueError) as err:  # a garbage status line, a bad URL
        raise LLMError(f"LLM endpoint failed: {_said(err)}") from err
    with reply:
        try:
            return _read_capped(reply, deadline)
        except (http.client.HTTPException, OSError) as err:  # cut off, reset mid-body
            raise LLMError(f"LLM endpoint reply broke off: {_said(err)}") from err


def _said(err: BaseException) -> str:
    """The error's type and text on one line: a server's garbage status line ends in CRLF."""
    return " ".join(f"{type(err).__name__}: {err}".split())[:200]


def _read_capped(reply: http.client.HTTPResponse, deadline: float) -> bytes:
    """Read the body as it arrives, stopping at the deadline or past the size cap.

    ``read1`` returns what one receive brought, so a trickling server is checked against
    the deadline between arrivals instead of after the whole body.
    """
    body = bytearray()
    while chunk := reply.read1(_CHUNK_BYTES):
        body += chunk
        if len(body) > MAX_REPLY_BYTES:
            raise LLMResponseError(f"endpoint reply exceeds {MAX_REPLY_BYTES} bytes")
        if time.monotonic() > deadline:
            raise LLMError("LLM endpoint reply still arriving at the deadline")
    if reply.length:  # read1 ends quietly where a Content-Length body is cut short
        raise LLMError(f"LLM endpoint reply ended {reply.length} bytes short of its "
                       f"Content-Length")
    return bytes(body)


def _decode(raw: bytes) -> dict:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LLMResponseError(f"endpoint reply is not JSON: {err}") from None
    except RecursionError:
        raise LLMResponseError("endpoint reply is JSON nested too deeply") from None


def consolidate_with_llm(relations: Sequence[Relation], cfg: LLMConfig,
                         transport=chat) -> list[LLMUnit]:
    """Ask the LLM to phrase/keep ``relations``; ``transport`` is injectable for tests."""
    if not cfg.enabled:
        raise LLMError("LLM consolidation is disabled (LLMConfig.enabled is False)")
    offered = list(relations)[:cfg.max_relations]
    if not offered:
        return []
    return parse_response(transport(build_messages(offered, cfg), cfg), offered)
