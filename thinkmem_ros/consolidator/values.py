"""Offboard learning of the value table from stored experiences and their rewards.

Why here: rewards arrive later than the situations they judge and only the consolidator sees
every robot's history, so values are learned offboard and shipped beside the policy.

Credit rule (documented, used by ``learn_values``): an experience's activated thinking is
the labels whose probability reached the bundle's threshold tau. Each activated label gets
the experience's scalar ``reward``; when hindsight ``required`` is known, an activated label
*not* required gets ``-token_cost`` instead (it was paid for and not needed). The TD
successor of an experience is the next experience of the same (robot, episode) by stamp;
the last one of an episode is terminal. Experiences without a reward are skipped.

Situation keys join the embedding with the activated labels (``ValueConfig.activation_weight``
= 1 unless a config is given; see ``value.py``), so the node must key with the labels the
policy activated, which it does (``ValueGate``).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from thinkmem_ros.link.experience import Experience
from thinkmem_ros.policy.runtime import PolicyRuntime
from thinkmem_ros.policy.value_table import ValueConfig, ValueTable


def embed_experiences(runtime: PolicyRuntime, experiences: list[Experience]) -> np.ndarray:
    """Pooled policy embeddings (n, d) of experiences' windows (events mapped by name)."""
    if not experiences:
        return np.zeros((0, runtime.embedding_dim), np.float32)
    vocab = {name: i + 1 for i, name in enumerate(runtime.manifest.event_vocabulary)}
    m = runtime.max_events
    signals = np.stack([e.window for e in experiences]).astype(np.float32)
    mask = np.stack([np.ones_like(e.window) if e.mask is None else e.mask
                     for e in experiences]).astype(np.float32)
    events = np.zeros((len(experiences), m), dtype=np.int64)
    for row, exp in enumerate(experiences):
        ids = [vocab[name] for name in exp.events if name in vocab][-m:]
        if ids:
            events[row, m - len(ids):] = ids
    return runtime.predict(signals, mask, events).embedding


def activated(exp: Experience, thresholds: dict[str, float]) -> list[str]:
    """Labels the node published for ``exp``: probability >= tau (default 0.5)."""
    return [label for label, p in zip(exp.labels, exp.probabilities, strict=True)
            if p >= thresholds.get(label, 0.5)]


def label_rewards(exp: Experience, thresholds: dict[str, float],
                  token_cost: float = 0.1) -> dict[str, float]:
    """Per-label reward of one experience by the module's credit rule."""
    if exp.reward is None:
        return {}
    required = None if exp.required is None else set(exp.required)
    return {label: (float(exp.reward) if required is None or label in required
                    else -token_cost) for label in activated(exp, thresholds)}


def learn_values(experiences: list[Experience], runtime: PolicyRuntime,
                 config: ValueConfig | None = None, *, token_cost: float = 0.1,
                 table: ValueTable | None = None, batch: int = 512) -> ValueTable:
    """Learn (or continue learning) a value table from experiences with rewards."""
    rated = [e for e in experiences if e.reward is not None]
    labels = list(runtime.labels)
    if table is None:
        table = ValueTable(labels, runtime.embedding_dim,
                           config or ValueConfig(activation_weight=1.0))
    by_episode: dict[tuple[str, str], list[Experience]] = defaultdict(list)
    for exp in rated:
        by_episode[(exp.robot_id, exp.episode_id)].append(exp)
    thresholds = dict(runtime.manifest.thresholds)
    for key in sorted(by_episode):
        episode = sorted(by_episode[key], key=lambda e: (e.stamp, e.seq or 0))
        emb = np.concatenate([embed_experiences(runtime, episode[i:i + batch])
                              for i in range(0, len(episode), batch)])
        clusters = [table.assign(e, activated(exp, thresholds))
                    for e, exp in zip(emb, episode, strict=True)]
        for i, exp in enumerate(episode):
            nxt = clusters[i + 1] if i + 1 < len(episode) else None
            for label, r in label_rewards(exp, thresholds, token_cost).items():
                if label in table.labels:
                    table.update(clusters[i], label, r, nxt)
    return table


MIN_RATED = 50
"""Rated experiences a round needs before it fits a value table (fewer: it keeps the last)."""


def fit_round_values(experiences: list[Experience], runtime: PolicyRuntime, folder: Path | str,
                     *, min_rated: int = MIN_RATED, config: ValueConfig | None = None
                     ) -> dict:
    """Fit the value table a round ships with its candidate and save it into ``folder``.

    ``runtime`` is the candidate's: the robot keys the table with the embedding of the
    policy it runs, so the table must be learned in that embedding, from every rated
    experience in the store (rewards of all rounds so far). Returns what happened, as the
    round report's ``artefacts["values"]``: ``{"status": "fitted", ...}`` or
    ``{"status": "missing", "reason": ...}`` when the store has too few rewards.
    """
    rated = [e for e in experiences if e.reward is not None]
    if len(rated) < min_rated:
        return {"status": "missing", "reason": f"{len(rated)} experiences with a reward "
                f"(< {min_rated})"}
    table = learn_values(rated, runtime, config)
    rows, cols = table.compact()
    if cols.size == 0:  # nothing was activated: an empty table would not even load
        return {"status": "missing", "reason": f"{len(rated)} experiences with a reward, "
                "none with thinking the node activated"}
    table.save(folder)
    return {"status": "fitted", "rated": len(rated),
            "episodes": len({(e.robot_id, e.episode_id) for e in rated}),
            "clusters": int(rows.size), "labels": int(cols.size)}
