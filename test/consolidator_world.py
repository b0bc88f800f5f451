"""A tiny seeded world for consolidator tests: a running bundle and experiences to ship.

Signals follow two rules the running bundle learned (``trend`` = rising temperature,
``hazard`` = close object at the last frame); episodes carry event histories in which a
planted rule EA ... EB ... EC holds in 2 of every 5, among filler codes F0-F7
and counter-evidence (EA alone, EB alone, EB ... EA). Each record says through
``required`` which thinking hindsight showed it needed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.link.experience import Experience

K, M = 4, 6
FILLER = tuple(f"F{i}" for i in range(8))
RULE = ("EA", "EB", "EC")
BASE_EVENTS = FILLER  # the running bundle knows only the filler codes


def situation(rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """One (K, F) window and the thinking it needs."""
    window = rng.normal(0.0, 0.2, size=(K, len(SIGNALS))).astype(np.float32)
    needed = []
    if rng.random() < 0.4:
        window[:, 0] += np.linspace(0.0, 3.0, K, dtype=np.float32)  # rising temperature
        needed.append("trend")
    window[:, 3] += 2.0
    if rng.random() < 0.3:
        window[-1, 3] = -1.0  # an object suddenly close
        needed.append("hazard")
    return window, needed


def base_material(n: int, rng: np.random.Generator) -> SituationSet:
    """Training rows for the running bundle (signals + filler events, base labels)."""
    signals, labels, events = [], [], []
    for _ in range(n):
        window, needed = situation(rng)
        signals.append(window)
        labels.append([1.0 if name in needed else 0.0 for name in THINKING])
        events.append(rng.integers(0, len(BASE_EVENTS) + 1, size=M))
    return SituationSet(signals=np.stack(signals), labels=np.array(labels, np.float32),
                        events=np.stack(events), groups=np.arange(n) // 10,
                        event_vocabulary=BASE_EVENTS)


# The gate's evidence floors (GateConfig: min_heldout 200 situations, min_blocks 10,
# min_positives 50) are for real rounds. This world's bundle records no world scenario and
# no training set, so a round on a few hundred of its records is judged on ~50 held-out
# rows of ~10 episodes alone, under the floors: a test about something else than how much
# evidence the gate needs states that it judges on them anyway (the pre-floor gate). The
# floors themselves are tested in test_round_odd_stores.py.
JUDGE_SMALL = {"min_heldout": 1, "min_blocks": 1, "min_positives": 0}


_CACHE: dict[tuple[int, bool], Path] = {}


def running_bundle(folder: Path, seed: int = 0, *, streaming: bool = False) -> Path:
    """Train and export the tiny bundle robots run before any consolidation (v1).

    ``streaming``: the per-frame GRU policy (restart schedule) instead of the window
    Transformer. Cached per process: every test module gets the same weights without
    retraining.
    """
    import shutil

    if (seed, streaming) in _CACHE:
        return Path(shutil.copytree(_CACHE[seed, streaming], folder))
    import torch

    from thinkmem_ros.policy.config import PolicyConfig
    from thinkmem_ros.policy.streaming_runtime import StreamingConfig
    from thinkmem_ros.policy.training.export import export_bundle
    from thinkmem_ros.policy.training.train import train_policy

    torch.set_num_threads(1)
    data = base_material(300, np.random.default_rng(seed))
    sizes = {"window": K, "n_signals": len(SIGNALS), "n_labels": len(THINKING),
             "max_events": M, "n_event_vocab": len(BASE_EVENTS)}
    config = (StreamingConfig(**sizes, hidden=32, restart=K) if streaming
              else PolicyConfig(**sizes, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                dropout=0.0))
    # the GRU needs longer to leave its outputs near the thresholds, where a round's
    # slightest nudge flips decisions (12 epochs: base micro-F1 0.98 -> 0.76 after a round)
    epochs, lr = (40, 1e-2) if streaming else (12, 5e-3)
    trained = train_policy(data, config, seed=seed, epochs=epochs, lr=lr, progress=False)
    export_bundle(trained, folder, model_version=1, frame_rate_hz=10.0)
    cache = Path(tempfile.mkdtemp(prefix="thinkmem-running-bundle-")) / "v1"
    _CACHE[seed, streaming] = Path(shutil.copytree(folder, cache))
    return folder


def episode_events(index: int, rng: np.random.Generator) -> list[str]:
    """Event history of one episode: the planted rule (2 in 5), or counter-evidence."""
    kind = index % 5
    core = list(RULE) if kind < 2 else [["EA"], ["EB", "EA"], ["EB"]][kind - 2]
    filler = [str(x) for x in rng.choice(FILLER, size=6 - len(core))]
    slots = np.sort(rng.choice(6, size=len(core), replace=False))
    history = list(filler)
    for pos, name in zip(slots.tolist(), core, strict=True):
        history.insert(pos, name)
    return history


def experiences(robot_id: str, n_episodes: int, per_episode: int, seed: int
                ) -> list[Experience]:
    """Records of ``n_episodes`` episodes; each record's events = history so far."""
    rng = np.random.default_rng(seed)
    out = []
    for ep in range(n_episodes):
        history = episode_events(ep, rng)
        for i in range(per_episode):
            upto = history[: (i + 1) * len(history) // per_episode]
            window, needed = situation(rng)
            out.append(Experience(
                robot_id=robot_id, episode_id=f"ep{ep:03d}", stamp=float(ep * 100 + i),
                window=window, labels=list(THINKING),
                probabilities=np.full(len(THINKING), 0.1, np.float32), bundle_version=1,
                events=upto, required=needed))
    return out
