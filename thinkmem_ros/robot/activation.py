"""What the node publishes per frame, built without ROS so its format is tested directly.

``/thinking/activation`` carries one compact JSON object per frame: the LLM side and the
demo read the active labels, the bag engineer scores every frame, and benchmarks read the
timings. ``no_input`` is true when every signal was stale for the frame: the probabilities
are still published (they are what the policy says about an empty window) but ``active``
is empty, so nothing downstream acts on thinking that no input supports. When the bundle
carries a value table or memory-control probes, ``active`` is
what the gates kept, in rank order, and the record adds ``policy_active`` (what the policy
activated), ``ranked``, ``suppressed`` {label: reason}, ``values``, ``uncertainties``,
``value_mode`` and ``memctl`` {p_compress, p_recall, compress, recall, error} (see
``thinking_gates``). Timings split ``latency_us`` (newest sample -> activation built) into
``wait_us`` (newest sample -> frame assembled: with the timer trigger mostly the wait for
the next tick, with the sample trigger the callback's own cost) and ``compute_us`` (frame
assembled -> activation built: hand-off, inference and gates), so a reader can tell a slow
policy from a frame schedule that waits; ``inference_us`` is the policy call alone.
``/thinking/probabilities`` is a Float32MultiArray whose layout names each dimension after
its thinking label, so a consumer never guesses the output order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

SCHEMA = 1


@dataclass
class FrameResult:
    """One frame's outcome, handed to listeners (experience shipping, tests, demo)."""

    seq: int
    stamp: float  # node clock (s) the frame was assembled at
    signals: np.ndarray  # (K, F)
    mask: np.ndarray  # (K, F)
    events: np.ndarray  # (M,)
    labels: tuple[str, ...]
    probabilities: np.ndarray  # (L,)
    active: tuple[str, ...]
    embedding: np.ndarray  # (d,)
    inference_us: float
    latency_us: float | None  # newest sample arrival -> activation built (just before publish)
    bundle_version: int
    bundle_sha256: str
    stale: tuple[str, ...]
    inputs_stamp: float | None
    gate: dict | None = None  # ThinkingGates decisions (GateOutcome.record()), if any
    no_input: bool = False  # every signal stale: nothing is claimed active
    wait_us: float | None = None  # newest sample arrival -> frame assembled
    compute_us: float | None = None  # frame assembled -> activation built (just before publish)
    signal_set: str = ""  # the bundle's signal-set fingerprint, carried into the experience


def active_labels(labels: tuple[str, ...], probabilities: np.ndarray,
                  thresholds: np.ndarray) -> tuple[str, ...]:
    """Labels whose probability reaches its threshold (Ĝ_t = {g : P(g|s_t) >= tau_g})."""
    hits = probabilities >= thresholds
    return tuple(label for label, hit in zip(labels, hits, strict=True) if hit)


def activation_record(result: FrameResult, robot_id: str) -> dict:
    """Build the JSON object of one activation; probabilities rounded to 5 digits."""
    probs = [round(float(p), 5) for p in result.probabilities]
    by_label = dict(zip(result.labels, probs, strict=True))
    active = result.active if result.gate is None else result.gate["ranked"]
    record = {
        "schema": SCHEMA,
        "robot_id": robot_id,
        "seq": result.seq,
        "stamp": result.stamp,
        "inputs_stamp": result.inputs_stamp,
        "bundle_version": result.bundle_version,
        # a label the gates added without a policy output (a shipped rule's consider:C
        # the policy was not trained on) has no probability: null
        "active": [{"label": label, "probability": by_label.get(label)} for label in active],
        "probabilities": by_label,
        "stale": list(result.stale),
        "no_input": result.no_input,
        "inference_us": round(result.inference_us, 1),
        "latency_us": None if result.latency_us is None else round(result.latency_us, 1),
        "wait_us": None if result.wait_us is None else round(result.wait_us, 1),
        "compute_us": None if result.compute_us is None else round(result.compute_us, 1),
    }
    if result.gate is not None:  # value rerank / memory control ran: what the policy said too
        record["policy_active"] = list(result.active)
        record.update(result.gate)
    return record


def activation_json(result: FrameResult, robot_id: str) -> str:
    """Compact JSON text for std_msgs/String."""
    return json.dumps(activation_record(result, robot_id), separators=(",", ":"))


def probabilities_layout(labels: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(label, size, stride) per MultiArrayDimension: one unit dimension per thinking label.

    With every dimension of size 1 the data stays a flat (L,) vector in label order, and
    ``dim[i].label`` names element i.
    """
    return [(label, 1, 1) for label in labels]
