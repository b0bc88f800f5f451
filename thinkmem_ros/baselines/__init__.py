"""Baselines the policy is measured against, implemented for real.

Every baseline has ``fit(train: SituationSet)`` and ``predict(data) -> (N, L)`` in {0, 1};
the ones that keep history around also report ``stored_bytes()`` so Exp 1 can compare
memory growth with the fixed-size policy.

- ``SummaryRAG``: aggregate statistics per channel, exact top-4 kNN, majority vote.
- ``SequenceRAG``: whole flattened windows, exact top-4 kNN (one GEMV per query).
- ``RFSummary``: a scikit-learn random forest on the same aggregate statistics.
- ``CurrentStateOnly``: the policy's own Transformer trained on the last frame only.
"""

from thinkmem_ros.baselines.current_state import CurrentStateOnly
from thinkmem_ros.baselines.features import FEATURE_NAMES, summary_features
from thinkmem_ros.baselines.rf_summary import RFSummary
from thinkmem_ros.baselines.sequence_rag import SequenceRAG
from thinkmem_ros.baselines.summary_rag import SummaryRAG, knn_vote

BASELINES: dict[str, type] = {
    "summary_rag": SummaryRAG,
    "sequence_rag": SequenceRAG,
    "rf_summary": RFSummary,
    "current_state_only": CurrentStateOnly,
}
"""Method key used in benchmark JSON -> baseline class."""

__all__ = ["BASELINES", "CurrentStateOnly", "FEATURE_NAMES", "RFSummary", "SequenceRAG",
           "SummaryRAG", "knn_vote", "summary_features"]
