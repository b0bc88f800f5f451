"""Current-State-Only: the policy's own classifier, shown only the last frame.

Why this classifier: the question Exp 3 asks is whether the *history* matters, so the
baseline must not lose because of a weaker learner. It is therefore the same Transformer
policy (same preset, optimiser, early stopping, via ``train_policy``) trained and
evaluated on windows cut to their final frame (K = 1). Any gap to the proposed policy is
then due to the missing evolution alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from thinkmem_ros.core.data import SituationSet


def last_frame(data: SituationSet) -> SituationSet:
    """Reduce situations to their final frame (K = 1), dropping events."""
    return SituationSet(
        signals=data.signals[:, -1:, :], labels=data.labels, mask=data.mask[:, -1:, :],
        events=None, groups=data.groups, label_names=data.label_names,
        signal_names=data.signal_names, event_vocabulary=(), meta=dict(data.meta))


@dataclass
class CurrentStateOnly:
    """Transformer policy with window 1 on the last frame.

    Thresholds are the per-label tau that ``train_policy`` tunes on its validation split,
    exactly as for the proposed policy, unless a fixed ``tau`` is given.
    """

    preset: str = "default"
    seed: int = 0
    epochs: int | None = None
    tau: float | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        if self.tau is not None and not 0.0 < self.tau < 1.0:
            raise ValueError(f"tau must be in (0, 1) or None, got {self.tau}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be >= 1 or None, got {self.epochs}")
        self._trained = None

    def fit(self, train: SituationSet) -> CurrentStateOnly:
        """Train the policy on last frames only (torch is imported here, not at module load)."""
        from thinkmem_ros.policy.training.train import train_policy

        kwargs = {"seed": self.seed, "progress": self.progress}
        if self.epochs is not None:
            kwargs["epochs"] = self.epochs
        self._trained = train_policy(last_frame(train), self.preset, **kwargs)
        return self

    def predict_proba(self, data: SituationSet) -> np.ndarray:
        """(N, L) probabilities from the last frame of each situation."""
        if self._trained is None:
            raise RuntimeError("CurrentStateOnly used before fit()")
        from thinkmem_ros.policy.training.train import predict_proba

        return np.asarray(predict_proba(self._trained, last_frame(data)), dtype=np.float32)

    def predict(self, data: SituationSet) -> np.ndarray:
        """(N, L) {0, 1} activation at the tuned thresholds (or the fixed ``tau``)."""
        probs = self.predict_proba(data)
        tau = self._trained.threshold_array if self.tau is None else self.tau
        return (probs >= tau).astype(np.float32)
