"""RF-Summary: a multi-label random forest on aggregate statistics.

A learned (not retrieved) summary baseline: if the summaries carried the information, a
forest would find it. Where order alone decides the thinking, it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import RandomForestClassifier

from thinkmem_ros.baselines.features import summary_features
from thinkmem_ros.core.data import SituationSet


@dataclass
class RFSummary:
    """scikit-learn ``RandomForestClassifier`` (native multi-output) on summary features."""

    n_estimators: int = 200
    seed: int = 0
    n_jobs: int = 1

    def __post_init__(self) -> None:
        if self.n_estimators < 1:
            raise ValueError(f"n_estimators must be >= 1, got {self.n_estimators}")
        self._forest: RandomForestClassifier | None = None

    def fit(self, train: SituationSet) -> RFSummary:
        """Fit the forest on ``train``'s summary features and multi-label targets."""
        if len(train) == 0:
            raise ValueError("RFSummary.fit needs at least one training situation")
        self._forest = RandomForestClassifier(
            n_estimators=self.n_estimators, random_state=self.seed, n_jobs=self.n_jobs)
        self._forest.fit(summary_features(train), (train.labels > 0.5).astype(np.int64))
        self._n_labels = train.labels.shape[1]
        return self

    def predict(self, data: SituationSet) -> np.ndarray:
        """(N, L) {0, 1} activation."""
        if self._forest is None:
            raise RuntimeError("RFSummary used before fit()")
        out = np.asarray(self._forest.predict(summary_features(data)), dtype=np.float32)
        return out.reshape(len(data), self._n_labels)
