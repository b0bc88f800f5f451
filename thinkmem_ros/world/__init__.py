"""Seeded synthetic signal world: scenario families (situation sets) and continuous streams.

``families.FAMILIES`` builds labelled situation sets whose hidden rules the experiments
probe; ``streams.generate_stream`` renders continuous robot signals with per-frame labels
from the rule table in ``streams``. Randomness always comes from a Generator passed in.
"""

from thinkmem_ros.world.families import (
    FAMILIES,
    mixed_windows,
    order_only,
    order_only_split,
    rare_onset,
    rare_onset_split,
    same_final_state,
)
from thinkmem_ros.world.streams import (
    EVENT_VOCABULARY,
    SCENARIOS,
    generate_stream,
    resample_stream,
    simulate_stream,
    stream_windows,
    window_labels,
)

__all__ = [
    "EVENT_VOCABULARY", "FAMILIES", "SCENARIOS", "generate_stream", "mixed_windows",
    "order_only", "order_only_split", "rare_onset", "rare_onset_split", "resample_stream",
    "same_final_state", "simulate_stream", "stream_windows", "window_labels",
]
