"""Replay a recorded stream through the node's runtime path: SituationBuffer, then the policy.

Why not ``world.streams.stream_windows``: it cuts windows straight from the recording, with
every NaN masked frame by frame and every event known. The node sees something else. A
sample that did not arrive leaves the signal's previous value in the window until it is
older than ``stale_after_s`` (only then is it masked), events outside the bundle's
vocabulary are dropped before they take one of the M slots, and a frame is assembled at
the bundle's rate from whatever arrived by then. A consolidation round must be judged on
the inputs the robot will really produce, so the gate (and the benchmarks) push a
``SignalStream`` through the same ``SituationBuffer`` the node fills, exactly as the node's
``_on_sample`` / ``_on_event`` / ``_emit`` do with ``frame_trigger: timer``:

- frame j is assembled at time ``j / frame_rate_hz`` (stream time, seconds from its start);
- before it, every stream frame whose time is at or before it offers its finite values
  (``offer(index, value, now=t, stamp=t)``; a NaN is a dropout: nothing is sent, as the bag
  writer does), and every event at or before it is offered (``offer_event``), all in time
  order, so the clock the buffer sees never steps back;
- signals the stream does not carry are never offered, so they stay masked, as a silent
  topic would;
- the ground truth of frame j is the label row of the newest stream frame it saw.

Each bundle is replayed with its own buffer (its signals, K, M and event vocabulary), so
two bundles with different vocabularies see exactly what each would see on the robot.
Plain numpy and the torch-free runtime: robot-side code and benchmarks can import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from thinkmem_ros.core.data import SignalStream
from thinkmem_ros.policy.bundle import BundleManifest
from thinkmem_ros.policy.situation import BufferConfig, SituationBuffer

_EPS_S = 1e-9  # stream and frame clocks are both i / rate: absorb float rounding


@dataclass
class ReplayConfig:
    """The node parameters that shape a frame (defaults: the node's defaults)."""

    stale_after_s: float = 0.5
    event_horizon_s: float = 0.0
    frame_rate_hz: float = 0.0  # 0 = the bundle's frame rate
    skip_warmup: bool = True  # drop the first K-1 frames (the window is not full yet)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.stale_after_s) and self.stale_after_s > 0):
            raise ValueError(f"ReplayConfig.stale_after_s must be > 0, got "
                             f"{self.stale_after_s}")
        if not (math.isfinite(self.event_horizon_s) and self.event_horizon_s >= 0):
            raise ValueError(f"ReplayConfig.event_horizon_s must be >= 0, got "
                             f"{self.event_horizon_s}")
        if not (math.isfinite(self.frame_rate_hz) and self.frame_rate_hz >= 0):
            raise ValueError(f"ReplayConfig.frame_rate_hz must be >= 0, got "
                             f"{self.frame_rate_hz}")


@dataclass
class ReplayedFrames:
    """The frames a node would have assembled from one stream, and their ground truth."""

    signals: np.ndarray  # (N, K, F) float32, the buffer's window (stale values zeroed)
    mask: np.ndarray  # (N, K, F) float32, 1 = observed and fresh
    events: np.ndarray  # (N, M) int64, ids in ``event_vocabulary`` (0 = padding)
    truth: np.ndarray  # (N, L) float32, labels of the newest stream frame seen
    times_s: np.ndarray  # (N,) frame time in stream seconds
    stream_frames: np.ndarray  # (N,) index of the newest stream frame each frame saw
    label_names: tuple[str, ...]
    signal_names: tuple[str, ...]
    event_vocabulary: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.signals.shape[0])


def replay_stream(stream: SignalStream, *, signals: tuple[str, ...] | list[str], window: int,
                  max_events: int, event_vocabulary: tuple[str, ...] | list[str],
                  frame_rate_hz: float, config: ReplayConfig | None = None) -> ReplayedFrames:
    """Push ``stream`` through a fresh ``SituationBuffer`` frame by frame (module docstring)."""
    cfg = config or ReplayConfig()
    rate = cfg.frame_rate_hz or float(frame_rate_hz)
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"frame rate must be > 0, got {rate}")
    buffer = SituationBuffer(BufferConfig(
        signals=tuple(signals), window=window, stale_after_s=cfg.stale_after_s,
        max_events=max_events, event_vocabulary=tuple(event_vocabulary),
        event_horizon_s=cfg.event_horizon_s))
    columns = [(i, stream.signal_names.index(name)) for i, name in enumerate(signals)
               if name in stream.signal_names]
    values = np.asarray(stream.values, dtype=np.float64)
    n_stream = values.shape[0]
    sample_t = np.arange(n_stream, dtype=np.float64) / stream.rate_hz
    n_frames = int(math.floor(stream.duration_s * rate + _EPS_S))
    events = sorted(stream.events, key=lambda e: e[0])
    out_signals = np.zeros((n_frames, window, len(signals)), np.float32)
    out_mask = np.zeros_like(out_signals)
    out_events = np.zeros((n_frames, max_events), np.int64)
    seen = np.full(n_frames, -1, dtype=np.int64)
    next_sample, next_event = 0, 0
    for j in range(n_frames):
        now = j / rate
        while True:  # samples and events in arrival order: the node clock never steps back
            t_sample = sample_t[next_sample] if next_sample < n_stream else math.inf
            t_event = events[next_event][0] if next_event < len(events) else math.inf
            if min(t_sample, t_event) > now + _EPS_S:
                break
            if t_event < t_sample:
                buffer.offer_event(events[next_event][1], now=float(t_event))
                next_event += 1
                continue
            row = values[next_sample]
            for index, col in columns:
                value = row[col]
                if math.isfinite(value):
                    buffer.offer(index, float(value), now=float(t_sample), stamp=float(t_sample))
            next_sample += 1
        frame = buffer.assemble(now)
        out_signals[j], out_mask[j], out_events[j] = frame.signals, frame.mask, frame.events
        seen[j] = next_sample - 1
    keep = seen >= 0
    if cfg.skip_warmup:
        keep &= np.arange(n_frames) >= window - 1
    idx = np.flatnonzero(keep)
    frames = seen[idx]
    return ReplayedFrames(
        signals=out_signals[idx], mask=out_mask[idx], events=out_events[idx],
        truth=np.asarray(stream.labels, dtype=np.float32)[frames],
        times_s=idx / rate, stream_frames=frames, label_names=tuple(stream.label_names),
        signal_names=tuple(signals), event_vocabulary=tuple(event_vocabulary))


def replay_for(stream: SignalStream, manifest: BundleManifest,
               config: ReplayConfig | None = None) -> ReplayedFrames:
    """``replay_stream`` with the shapes, vocabulary and frame rate of a bundle."""
    return replay_stream(stream, signals=tuple(manifest.signals), window=manifest.window,
                         max_events=manifest.max_events,
                         event_vocabulary=tuple(manifest.event_vocabulary),
                         frame_rate_hz=manifest.frame_rate_hz, config=config)


def predict_frames(runtime, frames: ReplayedFrames, batch: int = 512) -> np.ndarray:
    """Probabilities (N, L) of a ``PolicyRuntime`` on replayed frames, as the node gets them.

    A window bundle has no state across frames: batching only groups the per-frame calls,
    so each row equals ``predict_one`` on that frame. A streaming bundle is stepped frame by
    frame through ``predict_frame`` with the frames' times, from a reset at the stream's
    start: its answers depend on the state (and restart schedule) the robot would be in,
    which a window replayed from the reset state does not reproduce.
    """
    m = runtime.manifest
    if (tuple(m.signals) != frames.signal_names
            or tuple(m.event_vocabulary) != frames.event_vocabulary):
        raise ValueError("frames were replayed for another bundle (signals or event "
                         "vocabulary differ): replay with replay_for(stream, this manifest)")
    if len(frames) == 0:
        return np.zeros((0, len(m.labels)), np.float32)
    if runtime.streaming:
        return _step_frames(runtime, frames)
    parts = [runtime.predict(frames.signals[i:i + batch], frames.mask[i:i + batch],
                             frames.events[i:i + batch]).probabilities
             for i in range(0, len(frames), batch)]
    return np.concatenate(parts).astype(np.float32, copy=False)


def _step_frames(runtime, frames: ReplayedFrames) -> np.ndarray:
    """A streaming bundle's node-path answers on consecutive replayed frames."""
    out = np.empty((len(frames), len(runtime.manifest.labels)), np.float32)
    runtime.reset("start")
    for j in range(len(frames)):
        out[j] = runtime.predict_frame(frames.signals[j], frames.mask[j], frames.events[j],
                                       t=float(frames.times_s[j])).probabilities[0]
    return out
