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

Robustness to the fleet (one robot, or a few, must not steer what every robot gets):

* rewards are clipped to [-1, 1] (``REWARD_BOUND``) before they are credited: feedback
  rewards are defined in that range (a judged worth, token costs below 0), while the wire
  admits any finite number up to 1e15, which would swamp every other robot's evidence and
  spill into other labels' values through the bootstrap term;
* the table is fitted as a whole (``ValueTable.fit_batch``: each cell's weighted mean TD
  target at the value-iteration fixed point), not by a running average over experiences
  sorted by robot id, where the robot whose id sorts last decided; situations join
  clusters in an order fixed by their content (a hash of embedding and activation), so
  renaming robots or reordering the store changes nothing;
* in each cell (cluster, label) no robot carries more than ``ROBOT_SHARE`` of the weight
  (``robot_weights``; with m robots in a cell, max(share, 1/m)), and a cell's visits are
  its capped weight, so one robot's flood of records counts as a share of the evidence;
* an experience whose embedding is not finite (a window of huge values) is left out and
  counted, instead of failing the whole fit.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path

import numpy as np

from thinkmem_ros.link.experience import LEARNED_REWARD_BOUND, Experience, learned_reward
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


REWARD_BOUND = LEARNED_REWARD_BOUND
"""Rewards are clipped to [-REWARD_BOUND, REWARD_BOUND] before learning (module docstring)."""

ROBOT_SHARE = 0.25
"""Most of a cell's (or a probe class's) evidence one robot may carry; max(share, 1/m) with m
robots there, so a lone robot keeps all of its own and two or three are balanced."""


def label_rewards(exp: Experience, thresholds: dict[str, float],
                  token_cost: float = 0.1) -> dict[str, float]:
    """Per-label reward of one experience by the module's credit rule (reward clipped)."""
    if exp.reward is None:
        return {}
    reward = learned_reward(exp.reward)
    required = None if exp.required is None else set(exp.required)
    return {label: (reward if required is None or label in required else -token_cost)
            for label in activated(exp, thresholds)}


def cap_level(totals: np.ndarray, share: float = ROBOT_SHARE) -> float:
    """Largest c with min(T_k, c) <= max(share, 1/m) * sum_j min(T_j, c) over m robots' T.

    Why: capping every robot's weight at c keeps each one's part of the group's evidence
    within the share and leaves robots below c untouched. With the k largest capped,
    c = share * S / (1 - share * k), S the sum of the others; the first k whose c falls
    between the k-th and (k+1)-th largest total is the answer.
    """
    t = np.sort(np.asarray(totals, dtype=np.float64))[::-1]  # largest first
    share = max(float(share), 1.0 / t.size)
    rest = np.cumsum(t[::-1])[::-1]  # rest[k] = t[k:].sum()
    if t[0] <= share * rest[0]:
        return float(t[0])  # nobody is over the share
    for k in range(1, t.size):
        if share * k < 1.0:
            c = share * rest[k] / (1.0 - share * k)
            if t[k] <= c <= t[k - 1]:
                return float(c)
    return float(t[-1])  # balanced: everyone at the smallest total


def robot_weights(groups, robots, share: float = ROBOT_SHARE,
                  base: np.ndarray | None = None) -> np.ndarray:
    """Per-sample weights (``base`` scaled) so no robot carries over its share of a group.

    ``groups`` (n,) says which evidence a sample belongs to (a value cell, a probe class),
    ``robots`` (n,) who sent it. Within a group each robot's total base weight T_k becomes
    min(T_k, c) with c from ``cap_level``; a group of one robot is left as it is.
    """
    groups = np.asarray(groups).reshape(-1)
    base = np.ones(groups.size) if base is None else np.asarray(base, dtype=np.float64)
    if not groups.size:
        return base.copy()
    _, group = np.unique(groups, return_inverse=True)
    _, robot = np.unique(np.asarray(robots, dtype=str), return_inverse=True)
    codes, pair = np.unique(group.reshape(-1) * (robot.max() + 1) + robot.reshape(-1),
                            return_inverse=True)  # sorted: each group's robots side by side
    totals = np.bincount(pair.reshape(-1), base, minlength=codes.size)
    scale = np.ones(codes.size)
    starts = np.flatnonzero(np.diff(codes // (robot.max() + 1), prepend=-1))
    for lo, hi in zip(starts, [*starts[1:], codes.size], strict=True):
        if hi - lo > 1:
            part = totals[lo:hi]
            scale[lo:hi] = np.minimum(part, cap_level(part, share)) / part
    return base * scale[pair.reshape(-1)]


def _episodes(rated: list[Experience]) -> list[list[Experience]]:
    """Rated experiences grouped by (robot, episode), each in stamp order."""
    by_episode: dict[tuple[str, str], list[Experience]] = defaultdict(list)
    for exp in rated:
        by_episode[(exp.robot_id, exp.episode_id)].append(exp)
    return [sorted(by_episode[key], key=lambda e: (e.stamp, e.seq or 0))
            for key in sorted(by_episode)]


def finite_embeddings(runtime: PolicyRuntime, experiences: list[Experience],
                      batch: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings (n, d) of ``experiences`` and a mask of the rows that are finite.

    Why: a record valid on the wire (a window of values near the float32 limit) can embed to
    NaN; the fits leave that row out rather than fail for every robot.
    """
    if not experiences:
        return np.zeros((0, runtime.embedding_dim), np.float32), np.zeros(0, bool)
    emb = np.concatenate([embed_experiences(runtime, experiences[i:i + batch])
                          for i in range(0, len(experiences), batch)])
    return emb, np.isfinite(emb).all(axis=1)


def _content_order(emb: np.ndarray, active: list[list[str]]) -> list[int]:
    """Row order fixed by each row's content (embedding and activation), not its sender."""
    def digest(i: int) -> bytes:
        data = emb[i].astype(np.float32).tobytes() + "\0".join(active[i]).encode()
        return hashlib.sha256(data).digest()
    return sorted(range(len(active)), key=digest)


def _assign_clusters(table: ValueTable, emb: np.ndarray, active: list[list[str]]) -> np.ndarray:
    """Cluster of every row, assigned in content order (so robot ids cannot steer it)."""
    clusters = np.full(len(active), -1, dtype=np.int64)
    for i in _content_order(emb, active):
        clusters[i] = table.assign(emb[i], active[i])
    return clusters


def _samples(episodes: list[list[Experience]], clusters: np.ndarray, table: ValueTable,
             thresholds: dict[str, float], token_cost: float) -> list[tuple]:
    """One TD sample per credited (experience, label): (cluster, column, reward, next, robot)."""
    out, row = [], 0
    for episode in episodes:
        for i, exp in enumerate(episode):
            nxt = int(clusters[row + 1]) if i + 1 < len(episode) else -1
            out += [(int(clusters[row]), table.column(label), r, nxt, exp.robot_id)
                    for label, r in label_rewards(exp, thresholds, token_cost).items()
                    if label in table.labels]
            row += 1
    return out


def learn_values(experiences: list[Experience], runtime: PolicyRuntime,
                 config: ValueConfig | None = None, *, token_cost: float = 0.1,
                 table: ValueTable | None = None, batch: int = 512,
                 share: float = ROBOT_SHARE, report: dict | None = None) -> ValueTable:
    """Learn a value table from experiences with rewards (module docstring: how and why).

    With ``table`` its clusters are reused and the cells these experiences touch refitted
    from them; its other cells keep their values. ``report`` (if given) receives
    ``dropped_nonfinite``: rated experiences left out for a non-finite embedding.
    """
    labels = list(runtime.labels)
    if table is None:
        table = ValueTable(labels, runtime.embedding_dim,
                           config or ValueConfig(activation_weight=1.0))
    episodes = _episodes([e for e in experiences if e.reward is not None])
    emb, finite = finite_embeddings(runtime, [e for ep in episodes for e in ep], batch)
    if report is not None:
        report["dropped_nonfinite"] = int((~finite).sum())
    kept, at = [], 0
    for episode in episodes:  # a dropped row leaves its episode; its successor moves up
        kept.append([e for e, ok in zip(episode, finite[at:at + len(episode)], strict=True)
                     if ok])
        at += len(episode)
    kept = [episode for episode in kept if episode]
    thresholds = dict(runtime.manifest.thresholds)
    rows = [e for episode in kept for e in episode]
    clusters = _assign_clusters(table, emb[finite], [activated(e, thresholds) for e in rows])
    samples = _samples(kept, clusters, table, thresholds, token_cost)
    if samples:
        s, g, r, nxt, robots = (list(column) for column in zip(*samples, strict=True))
        cells = np.asarray(s) * len(table.labels) + np.asarray(g)
        table.fit_batch(s, g, r, nxt, robot_weights(cells, robots, share))
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
    report: dict = {}
    table = learn_values(rated, runtime, config, report=report)
    rows, cols = table.compact()
    if cols.size == 0:  # nothing was activated: an empty table would not even load
        return {"status": "missing", "reason": f"{len(rated)} experiences with a reward, "
                "none with thinking the node activated"}
    table.save(folder)
    return {"status": "fitted", "rated": len(rated),
            "episodes": len({(e.robot_id, e.episode_id) for e in rated}),
            "clusters": int(rows.size), "labels": int(cols.size), **report}
