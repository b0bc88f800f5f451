"""A recording's header stamps judged the way the node's situation buffer will judge them.

The node takes a sample only if its header stamp passes ``SituationBuffer.offer``: not
more than ``future_stamp_tolerance_s`` ahead of the node's clock, newer than the signal's
last accepted stamp (an equal one is a duplicate, an older one out of order). Calibration
read only receive times, so a bag whose sensor clock ran ten minutes ahead, or a driver
that stamps at 1 s resolution, calibrated without a word while the node refused (nearly)
every sample. Here each present signal's samples are offered, with their header stamps
(read as ``robot.msg_fields.extract_stamp`` reads them) and the bag's receive times as the
node's clock, to a ``SituationBuffer`` of the node's configuration: the verdicts are the
buffer's own, so calibration and the node cannot disagree about a stamp.

The stamps come from the same pass over the bag as the values: :func:`with_stamps` adds
two bindings per topic (``header.stamp.sec`` and ``.nanosec``) to the signal map given to
``read_samples``, so they are sorted with, and index for index beside, the values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from thinkmem_ros.core.signal_adapters import SignalAdapter
from thinkmem_ros.playback.recording import Samples, SignalBinding, SignalMap
from thinkmem_ros.policy.situation import BufferConfig, SituationBuffer, Verdict
from thinkmem_ros.robot.msg_fields import extract_stamp

FUTURE_KEY = "future_stamp_tolerance_s"
REFUSED_SHARE = 0.01
"""A signal with more than 1 % of its samples refused for one stamp reason is reported."""
_PARTS = ("sec", "nanosec")
_REFUSALS = (Verdict.FUTURE, Verdict.DUPLICATE, Verdict.OUT_OF_ORDER)


def _stamp_name(topic: str, part: str) -> str:
    # a NUL cannot be in a signal name read from YAML keys the node accepts as parameters
    return f"\0header.stamp.{part}\0{topic}"


def with_stamps(signal_map: SignalMap) -> SignalMap:
    """``signal_map`` plus bindings reading each present topic's header stamp (sec, nanosec).

    ``signal_map.names`` of the result still start with the map's own signals; summaries
    should be taken over the original map's names.
    """
    extra: dict[str, SignalBinding] = {}
    for binding in signal_map.bindings.values():
        if binding.absent:
            continue
        for part in _PARTS:
            extra[_stamp_name(binding.topic, part)] = SignalBinding(
                binding.topic, binding.msg_type, SignalAdapter(f"header.stamp.{part}"))
    return replace(signal_map, bindings={**signal_map.bindings, **extra})


def future_tolerance(raw: Any, source: str) -> float:
    """The params file's ``future_stamp_tolerance_s`` (the node's default when unset).

    ValueError for a value the node refuses (not a number, or outside its declared range).
    """
    from thinkmem_ros.robot.node_config import PARAMETERS

    spec = next(p for p in PARAMETERS if p.name == FUTURE_KEY)
    if raw is None:
        return float(spec.default)
    ok = isinstance(raw, (int, float)) and not isinstance(raw, bool)
    try:
        ok = ok and math.isfinite(raw) and spec.min <= raw <= spec.max
    except OverflowError:
        ok = False
    if not ok:
        raise ValueError(f"{source}: {FUTURE_KEY} must be a number in [{spec.min:g}, "
                         f"{spec.max:g}] s (the node refuses to start with it), got "
                         f"{str(raw)[:40]!r}")
    return float(raw)


@dataclass
class StampVerdicts:
    """What the node's buffer made of one signal's samples, by their header stamps."""

    samples: int
    refused: dict[str, int] = field(default_factory=dict)  # Verdict value -> count
    ahead_s: float = 0.0  # median of stamp - clock over the samples refused as future

    def as_row(self) -> dict[str, int]:
        """Counts for the report's JSON row."""
        return dict(self.refused)


def judge_stamps(samples: Samples, signal_map: SignalMap, future_tolerance_s: float,
                 ) -> dict[str, StampVerdicts]:
    """Per present signal of ``signal_map``: its samples offered to the node's buffer.

    ``samples`` must come from ``read_samples(bag, with_stamps(signal_map))``. The node's
    clock is the bag's receive time (as live, or played with ``--clock``); samples whose
    message has no header, or a zero stamp, are offered unstamped, as the node does.
    """
    out: dict[str, StampVerdicts] = {}
    start_s = samples.start_ns / 1e9
    for name, binding in signal_map.bindings.items():
        if binding.absent:
            continue
        times, values = samples.times[name], samples.values[name]
        sec = samples.values.get(_stamp_name(binding.topic, "sec"), np.zeros(0))
        nsec = samples.values.get(_stamp_name(binding.topic, "nanosec"), np.zeros(0))
        if not times.size == sec.size == nsec.size:
            continue  # not read through with_stamps: nothing to judge by
        buffer = SituationBuffer(BufferConfig(
            signals=(name,), window=1, stale_after_s=signal_map.stale_after_s,
            future_tolerance_s=future_tolerance_s))
        ahead: list[float] = []
        for t, value, s, ns in zip(times.tolist(), values.tolist(), sec.tolist(),
                                   nsec.tolist(), strict=True):
            now = start_s + t
            stamp = _stamp(s, ns)
            if buffer.offer(0, value, now=now, stamp=stamp) is Verdict.FUTURE:
                ahead.append(stamp - now if stamp is not None else math.nan)
        counts = buffer.snapshot()
        refused = {v.value: getattr(counts, v.value)[name] for v in _REFUSALS}
        out[name] = StampVerdicts(int(times.size), refused,
                                  float(np.nanmedian(ahead)) if ahead else 0.0)
    return out


def _stamp(sec: float, nanosec: float) -> float | None:
    """The node's reading of a header stamp (``extract_stamp``); None without a header."""
    if not (math.isfinite(sec) and math.isfinite(nanosec)):
        return None
    header = SimpleNamespace(stamp=SimpleNamespace(sec=int(sec), nanosec=int(nanosec)))
    return extract_stamp(SimpleNamespace(header=header))


def stamp_warnings(name: str, verdicts: StampVerdicts, future_tolerance_s: float,
                   share: float = REFUSED_SHARE) -> list[str]:
    """A warning per reason that refuses more than ``share`` of the signal's samples."""
    total = verdicts.samples
    out = []
    future = verdicts.refused.get(Verdict.FUTURE.value, 0)
    if future > share * total:
        out.append(f"{name}: {future} of {total} samples stamped {verdicts.ahead_s:.1f} s "
                   f"ahead of the recording's clock (median); the node will refuse them as "
                   f"future ({FUTURE_KEY} {future_tolerance_s:g})")
    duplicate = verdicts.refused.get(Verdict.DUPLICATE.value, 0)
    if duplicate > share * total:
        out.append(f"{name}: {duplicate} of {total} samples share a header stamp with the "
                   "sample before; the node counts them as duplicates and refuses them "
                   "(a driver stamping coarser than it publishes?)")
    behind = verdicts.refused.get(Verdict.OUT_OF_ORDER.value, 0)
    if behind > share * total:
        out.append(f"{name}: {behind} of {total} samples are stamped before the newest "
                   "accepted one; the node refuses them as out of order")
    return out
