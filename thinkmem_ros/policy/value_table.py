"""Values of thinking per situation cluster (SAMem-style), usable on the robot with numpy.

Why: the policy says which thinking a situation *resembles*; feedback says which of that
thinking was *worth* its LLM tokens. This module keeps Q(situation cluster, thinking) learned
by temporal-difference updates, with visit counts and an uncertainty beside every value, so
the node can rank activations and drop thinking that has reliably earned nothing.

Clusters
    Situations are clustered online by cosine similarity of the policy's pooled embedding:
    an embedding joins the nearest centroid when cos >= ``theta`` (0.85), whose centroid
    becomes the running mean of its members (re-normalised); otherwise it opens a cluster.
    With ``activation_weight`` w > 0 the situation key is the unit embedding joined with
    w times the unit indicator of the labels the policy activated, so one embedding region
    splits by what the policy decided there. Why: the worth of a label often depends on
    which other thinking runs beside it (trend analysis is redundant when cause analysis
    already runs); on the ``values`` benchmark w = 1 cut wasted activations 54 % -> 65-71 %
    at the same theta. The consolidator and the benchmark use w = 1; 0 keys on the
    embedding alone.

Values
    ``Q(s,g) <- (1-alpha) Q(s,g) + alpha (r + gamma max_g' Q(s',g'))`` (s' = None: terminal);
    the first visit sets Q to its target, so values do not start biased towards 0.
    Visit counts N(s), N(s,g); ``ucb(s,g) = Q + c sqrt(ln N(s) / N(s,g))``. The uncertainty
    of a value is the standard error of its TD targets, sqrt((var + prior_var) / N(s,g)).
    Because thinking does not move the world, the bootstrap part of Q is the same for every
    thinking of a cluster; the *worth* of g in s (what g itself earns) is
    ``Q(s,g) - gamma * Vbar(s)`` where Vbar(s) is the running mean of the bootstrap
    max Q(s',.) that s's updates used (with gamma = 0 the worth is Q itself).

Suppression rule (deployment, ``ValueTable.rerank``), for each label the policy activated:
    1. a label in ``vocabulary.SAFETY_LABELS`` (hazard) is never suppressed;
    2. a situation with no cluster within ``theta`` is novel: nothing is suppressed;
    3. an entry with N(s,g) >= ``min_visits`` whose optimistic worth
       ``worth + z * uncertainty`` is below ``suppress_below`` (0: earns less than nothing
       after its token cost) is suppressed (reason ``low_value``, or ``archived`` when the
       entry sits in the archive: archived entries keep their frozen value and counts and
       obey the same bar, so forgetting never turns a positive-worth label off);
    4. everything else is kept. Kept labels are ranked safety first, then by worth
       (labels without a value rank after valued ones, by the policy's probability).

Forgetting (archive, not deletion)
    When a cluster holds more than ``max_entries`` (5) valued entries, the lowest-valued entry
    that fails the consistency check moves to the archive with its counts. The check is
    statistical: an entry is inconsistent with its cluster when its mean TD target is below
    the mean target of the cluster's other entries by more than ``consistency_z`` standard
    errors (a one-sided z test on its own evidence). An archived entry keeps counting; a new
    TD target at least the mean target of the cluster's active entries (supporting evidence:
    it now agrees with its cluster) reactivates it with its counts,
    and it cannot be archived again before ``min_visits`` further visits.

Artefact
    ``values.npz`` (centroids (C,d) f4, q/uncertainty/visits (C,L), cluster visits (C,),
    vbar (C,), archived (A,2) int32 pairs) + ``values.json`` (labels, config, sha256 of the
    npz). Empty rows (clusters with no valued entry) and columns (labels never valued) are
    dropped before saving; loading needs numpy alone.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from thinkmem_ros.core.vocabulary import SAFETY_LABELS
from thinkmem_ros.policy.bundle import read_artefact_files, read_npz, verify_artefact

VALUES_NPZ = "values.npz"
VALUES_JSON = "values.json"
ARTEFACT_VERSION = 1


class ValueArtefactError(ValueError):
    """A values artefact is missing, malformed or does not match its recorded hash."""


@dataclass
class ValueConfig:
    """Hyper-parameters of clustering, TD learning, exploration, suppression and forgetting."""

    theta: float = 0.85
    alpha: float = 0.2
    gamma: float = 0.3
    ucb_c: float = 1.0
    prior_var: float = 0.25
    eps0: float = 0.95
    beta: float = 6.0
    horizon: int = 10_000
    min_visits: int = 3
    z: float = 1.0
    suppress_below: float = 0.0
    max_entries: int = 5
    consistency_z: float = 2.0
    forgetting: bool = True
    activation_weight: float = 0.0

    def __post_init__(self) -> None:
        checks = {
            "theta": -1.0 < self.theta <= 1.0, "alpha": 0.0 < self.alpha <= 1.0,
            "gamma": 0.0 <= self.gamma < 1.0, "ucb_c": self.ucb_c >= 0.0,
            "prior_var": self.prior_var >= 0.0, "eps0": 0.0 <= self.eps0 <= 1.0,
            "beta": self.beta >= 0.0, "horizon": int(self.horizon) >= 1,
            "min_visits": int(self.min_visits) >= 1, "z": self.z >= 0.0,
            "max_entries": int(self.max_entries) >= 1,
            "consistency_z": self.consistency_z >= 0.0,
            "suppress_below": math.isfinite(self.suppress_below),
            "activation_weight": math.isfinite(self.activation_weight)
            and self.activation_weight >= 0.0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"ValueConfig.{name} is out of range: {getattr(self, name)!r}")

    def epsilon(self, t: int) -> float:
        """Decayed exploration rate eps_t = eps0 * exp(-beta * t / T)."""
        return float(self.eps0 * math.exp(-self.beta * max(t, 0) / self.horizon))


@dataclass
class Ranked:
    """A reranked activation: kept labels in rank order and what was suppressed, with why."""

    kept: list[str]
    suppressed: dict[str, str] = field(default_factory=dict)  # label -> rule that removed it
    cluster: int = -1  # -1 = novel situation
    worth: dict[str, float] = field(default_factory=dict)
    uncertainty: dict[str, float] = field(default_factory=dict)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.isfinite(x).all():
        raise ValueError("embedding contains NaN or inf")
    norm = np.linalg.norm(x)
    return x / norm if norm > 0 else x


class ValueTable:
    """Clusters, Q values, counts and archive; learning and deployment in one object."""

    def __init__(self, labels: list[str] | tuple[str, ...], dim: int,
                 config: ValueConfig | None = None) -> None:
        if not labels:
            raise ValueError("labels: a value table needs at least one thinking label")
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.labels = list(labels)
        self.dim = int(dim)
        self.config = config or ValueConfig()
        self._col = {name: i for i, name in enumerate(self.labels)}
        L = len(self.labels)
        self._set_key_labels(self.labels)
        self.centroids = np.zeros((0, self.key_dim))  # (C, d [+ L]) unit rows
        self._sums = np.zeros((0, self.key_dim))  # member sums (centroid = normalised sum)
        self.q = np.zeros((0, L))
        self.n_sg = np.zeros((0, L), dtype=np.int64)
        self.n_s = np.zeros(0, dtype=np.int64)
        self._t_sum = np.zeros((0, L))  # sums of TD targets (for mean/variance)
        self._t_sq = np.zeros((0, L))
        self._boot_sum = np.zeros(0)  # sum of gamma-free bootstrap values used in s
        self._boot_n = np.zeros(0, dtype=np.int64)
        self.archived = np.zeros((0, L), dtype=bool)
        self._grace = np.zeros((0, L), dtype=np.int64)  # visit count before re-archiving
        self.archive_log: list[dict] = []
        self.steps = 0

    # ------------------------------------------------------------------ clusters
    @property
    def n_clusters(self) -> int:
        """Number of situation clusters."""
        return self.centroids.shape[0]

    def _set_key_labels(self, labels: list[str]) -> None:
        """Labels the activation indicator spans (the full list, even after compaction)."""
        self.key_labels = list(labels)
        self._key_col = {name: i for i, name in enumerate(self.key_labels)}
        self.key_dim = self.dim + (len(labels) if self.config.activation_weight > 0 else 0)

    def key(self, embedding: np.ndarray, active: list[str] | tuple[str, ...] = ()) -> np.ndarray:
        """Return the unit situation key: embedding, plus the activation indicator if w > 0."""
        e = _unit(embedding)
        if e.shape[0] != self.dim:
            raise ValueError(f"embedding has {e.shape[0]} values, the table expects {self.dim}")
        w = self.config.activation_weight
        if w <= 0:
            return e
        a = np.zeros(len(self.key_labels))
        a[[self._key_col[g] for g in active if g in self._key_col]] = 1.0
        return _unit(np.concatenate([e, w * _unit(a)]))

    def nearest(self, embedding: np.ndarray, active: list[str] | tuple[str, ...] = ()
                ) -> tuple[int, float]:
        """Nearest cluster and its cosine; (-1, -inf) when there are none."""
        if self.n_clusters == 0:
            return -1, -math.inf
        sims = self.centroids @ self.key(embedding, active)
        best = int(np.argmax(sims))
        return best, float(sims[best])

    def lookup(self, embedding: np.ndarray, active: list[str] | tuple[str, ...] = ()) -> int:
        """Cluster within theta of the situation or -1 (novel); never changes the table."""
        best, sim = self.nearest(embedding, active)
        return best if sim >= self.config.theta else -1

    def assign(self, embedding: np.ndarray, active: list[str] | tuple[str, ...] = ()) -> int:
        """Merge the situation into its cluster or open a new one; returns the cluster id."""
        e = self.key(embedding, active)
        best, sim = self.nearest(embedding, active)
        if best >= 0 and sim >= self.config.theta:
            self._sums[best] += e
            self.centroids[best] = _unit(self._sums[best])
            return best
        L = len(self.labels)
        self.centroids = np.vstack([self.centroids, e[None]])
        self._sums = np.vstack([self._sums, e[None]])
        self.q = np.vstack([self.q, np.zeros((1, L))])
        self.n_sg = np.vstack([self.n_sg, np.zeros((1, L), dtype=np.int64)])
        self.n_s = np.append(self.n_s, 0)
        self._t_sum = np.vstack([self._t_sum, np.zeros((1, L))])
        self._t_sq = np.vstack([self._t_sq, np.zeros((1, L))])
        self._boot_sum = np.append(self._boot_sum, 0.0)
        self._boot_n = np.append(self._boot_n, 0)
        self.archived = np.vstack([self.archived, np.zeros((1, L), dtype=bool)])
        self._grace = np.vstack([self._grace, np.zeros((1, L), dtype=np.int64)])
        return self.n_clusters - 1

    # ------------------------------------------------------------------ values
    def column(self, label: str) -> int:
        """Column of ``label``; ValueError naming the label otherwise."""
        try:
            return self._col[label]
        except KeyError:
            raise ValueError(f"unknown thinking label {label!r}; table labels are "
                             f"{self.labels}") from None

    def state_value(self, s: int) -> float:
        """max_g Q(s, g) over active (non-archived, visited) entries; 0 for none."""
        valued = (self.n_sg[s] > 0) & ~self.archived[s]
        return float(self.q[s][valued].max()) if valued.any() else 0.0

    def update(self, s: int, label: str, reward: float, next_s: int | None = None) -> float:
        """One TD update of Q(s, label) from ``reward``; returns the new value."""
        if not math.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward!r}")
        g = self.column(label)
        cfg = self.config
        boot = 0.0 if next_s is None or next_s < 0 else self.state_value(next_s)
        target = reward + cfg.gamma * boot
        if self.archived[s, g]:
            active = self.valued(s)
            bar = (self._t_sum[s, active] / self.n_sg[s, active]).mean() if active.size else 0.0
            if target >= bar:  # supporting evidence: bring it back with its counts
                self.archived[s, g] = False
                self._grace[s, g] = self.n_sg[s, g] + 1 + cfg.min_visits
                self.archive_log.append({"event": "reactivate", "cluster": s, "label": label,
                                         "step": self.steps})
        first = self.n_sg[s, g] == 0
        self.q[s, g] = target if first else (1 - cfg.alpha) * self.q[s, g] + cfg.alpha * target
        self.n_sg[s, g] += 1
        self.n_s[s] += 1
        self._t_sum[s, g] += target
        self._t_sq[s, g] += target * target
        self._boot_sum[s] += boot
        self._boot_n[s] += 1
        self.steps += 1
        if cfg.forgetting:
            self.forget(s)
        return float(self.q[s, g])

    def _worth(self, s: int, g: int) -> float:
        vbar = self._boot_sum[s] / self._boot_n[s] if self._boot_n[s] else 0.0
        return float(self.q[s, g] - self.config.gamma * vbar)

    def uncertainty(self, s: int, g: int) -> float:
        """Return the standard error of the TD targets of (s, g); inf when never visited."""
        n = self.n_sg[s, g]
        if n == 0:
            return math.inf
        mean = self._t_sum[s, g] / n
        var = max(self._t_sq[s, g] / n - mean * mean, 0.0) * (n / max(n - 1, 1))
        return math.sqrt((var + self.config.prior_var) / n)

    def ucb(self, s: int, label: str) -> float:
        """Upper-confidence score Q + c sqrt(ln N(s) / N(s,g)); inf when never visited."""
        g = self.column(label)
        n = self.n_sg[s, g]
        if n == 0:
            return math.inf
        return float(self.q[s, g] + self.config.ucb_c * math.sqrt(
            math.log(max(self.n_s[s], 1)) / n))

    # ------------------------------------------------------------------ forgetting
    def valued(self, s: int) -> np.ndarray:
        """Columns of the cluster's valued (visited, not archived) entries."""
        return np.flatnonzero((self.n_sg[s] > 0) & ~self.archived[s])

    def _inconsistent(self, s: int, g: int, others: np.ndarray) -> bool:
        n = self.n_sg[s, g]
        mean = self._t_sum[s, g] / n
        other_means = self._t_sum[s, others] / self.n_sg[s, others]
        return mean + self.config.consistency_z * self.uncertainty(s, g) < other_means.mean()

    def forget(self, s: int) -> list[str]:
        """Archive entries of cluster ``s`` while it holds > max_entries valued ones."""
        moved: list[str] = []
        while True:
            cols = self.valued(s)
            if cols.size <= self.config.max_entries:
                return moved
            failing = [g for g in cols if self.n_sg[s, g] >= self._grace[s, g]
                       and self._inconsistent(s, g, cols[cols != g])]
            if not failing:
                return moved
            g = min(failing, key=lambda c: self.q[s, c])
            self.archived[s, g] = True
            moved.append(self.labels[g])
            self.archive_log.append({"event": "archive", "cluster": s,
                                     "label": self.labels[g], "q": float(self.q[s, g]),
                                     "visits": int(self.n_sg[s, g]), "step": self.steps})

    @property
    def entries(self) -> int:
        """Valued entries held in the table (visited and not archived)."""
        return int(((self.n_sg > 0) & ~self.archived).sum())

    # ------------------------------------------------------------------ batch fit
    def fit_batch(self, s: np.ndarray, g: np.ndarray, reward: np.ndarray, next_s: np.ndarray,
                  weight: np.ndarray | None = None, *, tol: float = 1e-9,
                  max_iter: int = 200) -> int:
        """Refit every cell the samples touch to its weighted TD fixed point; returns the count.

        Why: ``update``'s running average keeps 1 - alpha of the old value per step, so in a
        batch of many robots' experiences whoever is processed last decides. Here Q(s,g) is
        the weighted mean of the targets r + gamma V(s') with V(s') = max_g' Q(s',g') taken
        at the fixed point (value iteration; gamma < 1 contracts), so the order of the
        samples does not matter. N(s,g) is the rounded total weight, so down-weighted
        evidence also counts as fewer visits (a wider uncertainty). Forgetting archives as
        ``update`` would and the fit repeats without archived entries in V. ``next_s`` -1 is
        terminal; cells the samples do not touch keep their values.
        """
        s, g, next_s, reward, weight = self._batch_arrays(s, g, next_s, reward, weight)
        if not s.size:
            return 0
        cells, cell = np.unique(s * len(self.labels) + g, return_inverse=True)
        cs, cg = np.divmod(cells, len(self.labels))
        total = np.bincount(cell, weight, minlength=cells.size)
        self.n_sg[cs, cg] = np.maximum(np.rint(total), 1).astype(np.int64)
        rows = np.unique(cs)
        self.n_s[rows] = self.n_sg[rows].sum(axis=1)
        while True:
            boot = self._fixed_point(cell, (cs, cg), reward, next_s, weight, total, tol,
                                     max_iter)
            self._set_batch_stats(cell, (cs, cg), s, reward + self.config.gamma * boot,
                                  boot, weight, total)
            moved = [self.forget(int(row)) for row in rows]
            if not any(moved):
                break
        self.steps += int(s.size)
        return int(cells.size)

    def _batch_arrays(self, s, g, next_s, reward, weight) -> tuple[np.ndarray, ...]:
        """The batch as checked numpy arrays (ValueError naming what is wrong)."""
        s, g, next_s = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (s, g, next_s))
        reward = np.asarray(reward, dtype=np.float64).reshape(-1)
        weight = (np.ones(s.size) if weight is None
                  else np.asarray(weight, dtype=np.float64).reshape(-1))
        if not s.size == g.size == next_s.size == reward.size == weight.size:
            raise ValueError("fit_batch: s, g, next_s, reward and weight differ in length")
        if not np.isfinite(reward).all():
            raise ValueError("fit_batch: rewards must be finite")
        if not (np.isfinite(weight).all() and (weight > 0).all()):
            raise ValueError("fit_batch: weights must be finite and > 0")
        c, n_labels = self.n_clusters, len(self.labels)
        if s.size and ((s < 0) | (s >= c) | (g < 0) | (g >= n_labels) | (next_s < -1)
                       | (next_s >= c)).any():
            raise ValueError("fit_batch: a cluster or label index is outside the table")
        return s, g, next_s, reward, weight

    def state_values(self) -> np.ndarray:
        """``state_value`` of every cluster at once, (C,)."""
        valued = (self.n_sg > 0) & ~self.archived
        best = np.where(valued, self.q, -np.inf).max(axis=1, initial=-np.inf)
        return np.where(valued.any(axis=1), best, 0.0)

    def _fixed_point(self, cell, at, reward, next_s, weight, total, tol, max_iter
                     ) -> np.ndarray:
        """Value iteration of the touched cells; returns each sample's bootstrap V(s')."""
        values = self.state_values()
        for _ in range(max_iter):
            boot = np.where(next_s >= 0, values[np.maximum(next_s, 0)], 0.0)
            target = reward + self.config.gamma * boot
            self.q[at] = np.bincount(cell, weight * target, minlength=total.size) / total
            new = self.state_values()
            if np.max(np.abs(new - values), initial=0.0) <= tol:
                break
            values = new
        return np.where(next_s >= 0, values[np.maximum(next_s, 0)], 0.0)

    def _set_batch_stats(self, cell, at, s, target, boot, weight, total) -> None:
        """Target sums, squares and bootstrap means that ``uncertainty`` and ``_worth`` read."""
        n = self.n_sg[at].astype(np.float64)
        mean = np.bincount(cell, weight * target, minlength=total.size) / total
        square = np.bincount(cell, weight * target * target, minlength=total.size) / total
        self.q[at] = mean
        self._t_sum[at] = n * mean
        self._t_sq[at] = n * np.maximum(square, mean * mean)
        rows = np.unique(s)
        w_row = np.bincount(s, weight, minlength=self.n_clusters)[rows]
        vbar = np.bincount(s, weight * boot, minlength=self.n_clusters)[rows] / w_row
        self._boot_n[rows] = np.maximum(self.n_s[rows], 1)
        self._boot_sum[rows] = vbar * self._boot_n[rows]

    # ------------------------------------------------------------------ deployment
    def should_suppress(self, s: int, label: str) -> str | None:
        """Return the rule (module docstring) that suppresses ``label`` in cluster s, or None."""
        if label in SAFETY_LABELS:
            return None
        if s < 0 or label not in self._col:
            return None
        g = self._col[label]
        if self.n_sg[s, g] < self.config.min_visits:
            return None
        optimistic = self._worth(s, g) + self.config.z * self.uncertainty(s, g)
        if optimistic >= self.config.suppress_below:
            return None
        return "archived" if self.archived[s, g] else "low_value"

    def rerank(self, embedding: np.ndarray, active: list[str],
               probabilities: dict[str, float] | None = None) -> Ranked:
        """Apply the suppression rule and rank what the policy activated (no learning)."""
        s = self.lookup(embedding, active)
        probabilities = probabilities or {}
        out = Ranked(kept=[], cluster=s)
        for label in active:
            rule = self.should_suppress(s, label)
            if s >= 0 and label in self._col and self.n_sg[s, self._col[label]] > 0:
                out.worth[label] = self._worth(s, self._col[label])
                out.uncertainty[label] = self.uncertainty(s, self._col[label])
            if rule is None:
                out.kept.append(label)
            else:
                out.suppressed[label] = rule

        def key(label: str) -> tuple:
            valued = label in out.worth
            return (label not in SAFETY_LABELS, not valued,
                    -out.worth.get(label, 0.0), -probabilities.get(label, 0.0))

        out.kept.sort(key=key)
        return out

    def explore(self, embedding: np.ndarray, active: list[str], t: int,
                rng: np.random.Generator) -> tuple[list[str], bool]:
        """Learning-time choice: with prob eps_t keep every activation, else ``rerank``."""
        if rng.random() < self.config.epsilon(t):
            return list(active), True
        return self.rerank(embedding, active).kept, False

    # ------------------------------------------------------------------ artefact
    def compact(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows and columns kept when shipping: clusters/labels with a valued or archived entry."""
        used = (self.n_sg > 0)
        rows = np.flatnonzero(used.any(axis=1))
        cols = np.flatnonzero(used.any(axis=0))
        return rows, cols

    def save(self, folder: Path | str) -> Path:
        """Write ``values.npz`` + ``values.json`` into ``folder`` (a bundle folder)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        rows, cols = self.compact()
        sub = np.ix_(rows, cols)
        unc = np.array([[self.uncertainty(s, g) for g in cols] for s in rows]).reshape(
            rows.size, cols.size)
        archived = np.argwhere(self.archived[sub]).astype(np.int32).reshape(-1, 2)
        boot_n = np.maximum(self._boot_n[rows], 1)
        npz = folder / VALUES_NPZ
        tmp = folder / (VALUES_NPZ + ".tmp.npz")
        np.savez_compressed(
            tmp, centroids=self.centroids[rows].astype(np.float32),
            q=self.q[sub].astype(np.float32), uncertainty=unc.astype(np.float32),
            visits=self.n_sg[sub].astype(np.int64), cluster_visits=self.n_s[rows],
            vbar=(self._boot_sum[rows] / boot_n).astype(np.float32),
            t_sum=self._t_sum[sub], t_sq=self._t_sq[sub], archived=archived)
        tmp.replace(npz)
        meta = {"artefact_version": ARTEFACT_VERSION, "labels": [self.labels[g] for g in cols],
                "dim": self.dim, "key_labels": self.key_labels, "config": asdict(self.config),
                "sha256": hashlib.sha256(npz.read_bytes()).hexdigest(),
                "entries": self.entries, "archived": int(archived.shape[0]),
                "archive_log": self.archive_log[-256:]}
        (folder / VALUES_JSON).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return npz

    @classmethod
    def load(cls, folder: Path | str) -> ValueTable:
        """Read a saved table (numpy only), verifying the npz against its recorded sha256.

        Any malformed content (a missing array, wrong shapes, NaN values, archive pairs
        outside the table, a file that is not an npz) is a ValueArtefactError naming the
        file, so the node skips the table with one line instead of failing to start.
        """
        folder = Path(folder)
        files = read_artefact_files(folder, (VALUES_JSON, VALUES_NPZ), ValueArtefactError,
                                    "values")
        return cls.from_files(folder, files)

    @classmethod
    def from_files(cls, folder: Path | str, files: dict[str, bytes]) -> ValueTable:
        """Parse a table from bytes already read: {values.json: ..., values.npz: ...}.

        Why: a caller that checked these bytes (against a bundle's signed list) must get
        the table those bytes hold; reading the files again would load whatever replaced
        them meanwhile. ``folder`` only names the files in errors (as ``load``).
        """
        folder = Path(folder)
        meta, raw = verify_artefact(folder, files, VALUES_JSON, VALUES_NPZ, ARTEFACT_VERSION,
                                    ValueArtefactError, "values")
        try:
            table = cls._from_meta(meta)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueArtefactError(f"{folder / VALUES_JSON}: {type(exc).__name__}: "
                                     f"{exc}") from None
        try:
            table._fill(read_npz(raw))
        except Exception as exc:  # noqa: BLE001 - numpy/zipfile raise many kinds on bad bytes
            raise ValueArtefactError(f"{folder / VALUES_NPZ}: {type(exc).__name__}: "
                                     f"{exc}") from None
        return table

    @classmethod
    def _from_meta(cls, meta: dict) -> ValueTable:
        """An empty table with the sidecar's labels, width and config (raises when malformed)."""
        labels, key_labels = meta["labels"], meta.get("key_labels", meta["labels"])
        for name, value in (("labels", labels), ("key_labels", key_labels)):
            if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
                raise TypeError(f"{name} must be a list of strings")
        dim = meta["dim"]
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 1 << 16:
            raise ValueError(f"dim must be an integer in [1, 65536], got {dim!r}")
        if not isinstance(meta["config"], dict):
            raise TypeError("config must be a map")
        table = cls(labels, dim, ValueConfig(**meta["config"]))
        table._set_key_labels(key_labels)
        return table

    def _fill(self, data: dict[str, np.ndarray]) -> None:
        """Adopt the npz arrays after checking their shapes, values and archive pairs."""
        missing = sorted({"centroids", "q", "visits", "cluster_visits", "t_sum", "t_sq",
                          "vbar", "archived"} - set(data))
        if missing:
            raise ValueError(f"lacks arrays {missing}")
        c = data["centroids"].shape[0] if data["centroids"].ndim == 2 else -1
        n_labels = len(self.labels)
        shapes = {"centroids": (c, self.key_dim), "q": (c, n_labels), "visits": (c, n_labels),
                  "t_sum": (c, n_labels), "t_sq": (c, n_labels), "cluster_visits": (c,),
                  "vbar": (c,)}
        for name, shape in shapes.items():
            if data[name].shape != shape:
                raise ValueError(f"array shapes disagree: {name} is {data[name].shape}, "
                                 f"expected {shape}")
            if not np.isfinite(data[name].astype(np.float64)).all():
                raise ValueError(f"{name} contains NaN or inf")
        if (data["visits"] < 0).any() or (data["cluster_visits"] < 0).any():
            raise ValueError("visit counts are negative")
        self.centroids = data["centroids"].astype(np.float64)
        self._sums = self.centroids.copy()
        self.q = data["q"].astype(np.float64)
        self.n_sg = data["visits"].astype(np.int64)
        self.n_s = data["cluster_visits"].astype(np.int64)
        self._t_sum = data["t_sum"].astype(np.float64)
        self._t_sq = data["t_sq"].astype(np.float64)
        self._boot_n = np.maximum(self.n_s, 1)
        self._boot_sum = data["vbar"].astype(np.float64) * self._boot_n
        self.archived = np.zeros(self.q.shape, dtype=bool)
        self._grace = np.zeros(self.q.shape, dtype=np.int64)
        self.archived[tuple(_archive_pairs(data["archived"], self.q.shape).T)] = True


def _archive_pairs(pairs: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(A, 2) integer (cluster, label) pairs inside ``shape``; ValueError otherwise."""
    if pairs.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.dtype.kind not in "iu":
        raise ValueError(f"archived must be (A, 2) integer pairs, got {pairs.dtype} "
                         f"{pairs.shape}")
    pairs = pairs.astype(np.int64)
    if (pairs < 0).any() or (pairs >= np.array(shape)).any():
        raise ValueError(f"archived pairs fall outside the table of shape {shape}")
    return pairs
