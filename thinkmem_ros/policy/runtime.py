"""Robot-side policy inference on ONNX Runtime and numpy alone (no torch).

The session is pinned to one intra-op thread, one inter-op thread, sequential execution
and *no spinning* by default: ONNX Runtime's worker threads busy-wait between calls
otherwise, burning a core the robot needs for control (DESIGN.md, known pitfalls).
The graph is checked against the manifest on load, so a bundle whose ONNX file and
``bundle.json`` disagree is refused instead of producing misaligned labels.

Two kinds of bundle run here. A window bundle (format 1 graph) maps a (K, F) situation to
probabilities in one ONNX call (``predict``/``predict_one``). A streaming bundle (format 2,
``bundle.json`` has a ``streaming`` section; ``runtime.streaming`` is True) carries a
per-frame update with explicit state, run by ``policy.streaming_runtime`` in one compiled
call per frame:

* ``step(frame (F,), mask (F,), events (M,), t=None) -> probabilities (L,)``: advance the
  stream by one frame (the newest row of the window; ``events`` is the register of the last
  M event ids, oldest first, 0 = padding, as in a window). The returned array and
  ``last_embedding`` are views that the next call overwrites: copy what you keep. With a
  time ``t`` (seconds), a step backwards in time or a gap over ``gap_s`` restarts the state.
* ``predict_frame(signals (K, F), mask (K, F), events (M,), t=None, seq=None) ->
  Prediction``: what the node calls per frame. It steps the newest row only; after a reset,
  a time jump, a gap, a skipped frame (``seq`` not one more than the last) or at the first
  frame it replays the whole window from the reset state first, which is exactly the
  computation every training situation went through.
* ``reset()``: forget the stream (safe from another thread: applied at the next frame).
* ``predict``/``predict_one`` score windows from the reset state, as training did, and
  leave the stream's state alone.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort

from thinkmem_ros.policy.bundle import Bundle, BundleError, BundleManifest, load_bundle
from thinkmem_ros.policy.streaming_runtime import (
    CLIP_STDS,
    STATE_INPUTS,
    STEP_INPUTS,
    STEP_OUTPUTS,
    StreamingConfig,
    StreamingEngine,
    StreamingError,
    refuse_external_data,
)
from thinkmem_ros.policy.streaming_runtime import InputError as StreamInputError

OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


InputError = StreamInputError
"""A situation or frame given to the runtime has the wrong shape, dtype or values."""


class ThresholdError(BundleError, ValueError):
    """Thresholds (the bundle's or an override) name unknown labels or leave [0, 1].

    A BundleError as docs/contracts.md promises for anything wrong with a bundle, and still
    a ValueError for callers that caught the override's mistakes as one.
    """


class Prediction:
    """Policy output for B situations.

    ``active`` (per situation, the labels with probability >= tau) is built on first
    read: the node applies its own gates to the probabilities and never reads it, and at
    a streaming bundle's per-frame cost building it was a third of the call.
    """

    __slots__ = ("probabilities", "embedding", "_labels", "_thresholds", "_active")

    def __init__(self, probabilities: np.ndarray, embedding: np.ndarray,
                 labels: np.ndarray, thresholds: np.ndarray) -> None:
        self.probabilities = probabilities  # (B, L) float32
        self.embedding = embedding  # (B, d) float32, pooled hidden state (values, recall)
        self._labels, self._thresholds = labels, thresholds
        self._active: list[list[str]] | None = None

    @property
    def active(self) -> list[list[str]]:
        """Per situation, the labels with probability >= tau (in label order)."""
        if self._active is None:
            hits = self.probabilities >= self._thresholds
            self._active = [self._labels[row].tolist() for row in hits]
        return self._active


def session_options(threads: int = 1, allow_spinning: bool = False,
                    optimization: str = "all") -> ort.SessionOptions:
    """ONNX Runtime options for deterministic, low-jitter single-query inference."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads!r}")
    if optimization not in OPTIMIZATION_LEVELS:
        raise ValueError(f"optimization must be one of {sorted(OPTIMIZATION_LEVELS)}, "
                         f"got {optimization!r}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = OPTIMIZATION_LEVELS[optimization]
    spin = "1" if allow_spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    # 4 = fatal only: ONNX Runtime logged a failed run as a multi-line colour message on
    # stderr besides raising it; the exception carries the same text, and callers turn it
    # into their own one-line error (load_policy, the node's frame loop)
    options.log_severity_level = 4
    return options


class PolicyRuntime:
    """A loaded, verified bundle ready to answer 'which thinking now?' for situations."""

    def __init__(self, bundle: Bundle | str | Path, threads: int = 1,
                 allow_spinning: bool = False, thresholds: dict[str, float] | None = None,
                 optimization: str = "all", engine: str | None = None) -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
        m = self.bundle.manifest
        path = self.bundle.onnx_path
        try:
            model = path.read_bytes()
        except OSError as exc:
            raise BundleError(f"cannot read {path} (expected sha256 {m.sha256}): {exc}") from exc
        # Hash the very bytes handed to ONNX Runtime: the file may change after load_bundle.
        actual = hashlib.sha256(model).hexdigest()
        if actual != m.sha256:
            raise BundleError(f"{path}: sha256 {actual} does not match the expected sha256 "
                              f"{m.sha256}; the file is truncated, corrupted or tampered with")
        # Only the hashed bytes may reach ONNX Runtime: no weights from another file.
        refuse_external_data(model, str(path), m.sha256)
        try:
            self.session = ort.InferenceSession(
                model, sess_options=session_options(threads, allow_spinning, optimization),
                providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own unexported exception types
            raise BundleError(f"{path}: ONNX Runtime cannot load the model (sha256 "
                              f"{m.sha256}): {exc}") from exc
        self.streaming = bool(m.streaming)
        self.engine: StreamingEngine | None = None
        if self.streaming:
            try:
                self._check_streaming_graph(m, path)
            except (TypeError, ValueError) as exc:  # a state shape that is not a list
                raise BundleError(f"{path}: streaming state in bundle.json is malformed "
                                  f"(sha256 {m.sha256}): {exc}") from exc
            try:
                config = StreamingConfig.from_dict(m.model_config)
                if (config.window, config.n_signals, config.n_labels, config.max_events) != (
                        m.window, len(m.signals), len(m.labels), m.max_events):
                    raise ValueError("model_config disagrees with window/signals/labels/events")
                if len(m.event_vocabulary) > config.n_event_vocab:
                    # the node maps each listed name to an id; a name past the model's
                    # table failed every frame while it stayed in the event history
                    raise ValueError(f"event_vocabulary lists {len(m.event_vocabulary)} "
                                     f"names, the model knows {config.n_event_vocab}")
                self.engine = StreamingEngine(model, config, self.session, engine=engine)
                # restart schedule (StreamingConfig.restart): a second, staggered state
                self._twin = (StreamingEngine(model, config, self.session, engine=engine)
                              if config.restart else None)
            except (ValueError, TypeError, StreamingError, MemoryError) as exc:
                # MemoryError: dimensions no robot could hold (taps of 1e9 frames)
                raise BundleError(f"{path}: streaming policy cannot run (sha256 "
                                  f"{m.sha256}): {type(exc).__name__}: {exc}") from exc
            gap = m.streaming.get("gap_s", 2.5 / m.frame_rate_hz)
            if isinstance(gap, bool) or not isinstance(gap, int | float) or not (
                    math.isfinite(gap) and gap > 0):
                # NaN never restarts the stream after a gap; 0 or less restarts every frame
                raise BundleError(f"{path}: streaming.gap_s must be a finite number > 0, "
                                  f"got {gap!r}")
            self.gap_s = float(gap)
            mean = np.asarray(m.normalisation["mean"], np.float64)
            spread = CLIP_STDS * np.maximum(np.asarray(m.normalisation["std"], np.float64),
                                            1e-6)
            self._frame_low = (mean - spread).astype(np.float32)
            self._frame_high = (mean + spread).astype(np.float32)
            self.stream_resets = {"start": 0, "gap": 0, "backward": 0, "requested": 0}
            self._last_t: float | None = None
            self._last_seq: int | None = None
            self._period = config.restart
            self._frames = 0  # frames since the stream (re)started
            self._answer = self.engine
            self._reset_pending = True
            self._reset_reason = "start"
        else:
            self._check_graph(m, path)
        # width of Prediction.embedding: the value table and memory control key on it
        embedding = next(o for o in self.session.get_outputs() if o.name == "embedding")
        self.embedding_dim = int(embedding.shape[-1])
        self.thresholds = self._thresholds(m, thresholds)
        self._labels = np.array(m.labels, dtype=object)
        k, f, e = m.window, len(m.signals), m.max_events
        self._one = {"signals": np.zeros((1, k, f), np.float32),
                     "mask": np.ones((1, k, f), np.float32),
                     "events": np.zeros((1, e), np.int64)}
        self._outputs = ["probabilities", "embedding"]

    @staticmethod
    def _thresholds(m: BundleManifest, override: dict[str, float] | None) -> np.ndarray:
        tau = dict(m.thresholds)
        if override:
            unknown = sorted(set(override) - set(m.labels))
            if unknown:
                raise ThresholdError(f"thresholds for unknown labels {unknown}; bundle labels "
                                     f"are {m.labels}")
            tau.update(override)
        for name, value in tau.items():
            if not 0.0 <= float(value) <= 1.0:
                raise ThresholdError(f"threshold for {name!r} must be in [0, 1], got "
                                     f"{value!r}")
        return np.array([tau[name] for name in m.labels], dtype=np.float32)

    def _check_graph(self, m: BundleManifest, path: Path) -> None:
        """Refuse a graph whose names, shapes or dtypes disagree with the manifest."""
        d = m.model_config.get("d_model") if m.model_config else None
        expected_in = {"signals": ([m.window, len(m.signals)], "tensor(float)"),
                       "mask": ([m.window, len(m.signals)], "tensor(float)"),
                       "events": ([m.max_events], "tensor(int64)")}
        expected_out = {"probabilities": ([len(m.labels)], "tensor(float)"),
                        "embedding": ([d], "tensor(float)")}
        for kind, nodes, expected in (("input", self.session.get_inputs(), expected_in),
                                      ("output", self.session.get_outputs(), expected_out)):
            found = {node.name: node for node in nodes}
            if set(found) != set(expected):
                raise BundleError(f"{path}: graph {kind}s {sorted(found)} != expected "
                                  f"{sorted(expected)} (sha256 {m.sha256})")
            for name, (dims, dtype) in expected.items():
                node = found[name]
                tail = list(node.shape[1:])
                ok = node.type == dtype and len(tail) == len(dims) and all(
                    want is None or got == want for got, want in zip(tail, dims, strict=True))
                if not ok:
                    raise BundleError(
                        f"{path}: graph {kind} {name!r} is {node.type} {node.shape}, the "
                        f"manifest expects {dtype} [batch, {', '.join(map(str, dims))}] "
                        f"(sha256 {m.sha256})")

    def _check_streaming_graph(self, m: BundleManifest, path: Path) -> None:
        """Refuse a step graph whose names or shapes disagree with the manifest."""
        state = m.streaming.get("state", {})
        if not isinstance(state, dict) or set(state) != set(STATE_INPUTS):
            raise BundleError(f"{path}: streaming.state must name {list(STATE_INPUTS)}, got "
                              f"{state!r}")
        f = len(m.signals)
        dims = {"frame": [f], "mask": [f], "events": [m.max_events],
                "probabilities": [len(m.labels)], "embedding": list(state["h"])}
        for name in STATE_INPUTS:
            dims[name] = dims[f"{name}_out"] = list(state[name])
        for kind, nodes, names in (("input", self.session.get_inputs(), STEP_INPUTS),
                                   ("output", self.session.get_outputs(), STEP_OUTPUTS)):
            found = {node.name: node for node in nodes}
            if set(found) != set(names):
                raise BundleError(f"{path}: streaming graph {kind}s {sorted(found)} != "
                                  f"expected {sorted(names)} (sha256 {m.sha256})")
            for name in names:
                node = found[name]
                dtype = "tensor(int64)" if name == "events" else "tensor(float)"
                if node.type != dtype or list(node.shape[1:]) != dims[name]:
                    raise BundleError(f"{path}: streaming graph {kind} {name!r} is "
                                      f"{node.type} {node.shape}, the manifest expects "
                                      f"{dtype} [batch, {dims[name]}] (sha256 {m.sha256})")

    # -- properties -------------------------------------------------------------------------
    @property
    def manifest(self) -> BundleManifest:
        """The bundle's manifest."""
        return self.bundle.manifest

    @property
    def labels(self) -> list[str]:
        """Thinking labels in output order."""
        return list(self.manifest.labels)

    @property
    def signals(self) -> list[str]:
        """Signal names in input column order."""
        return list(self.manifest.signals)

    @property
    def window(self) -> int:
        """Frames per situation (K)."""
        return self.manifest.window

    @property
    def max_events(self) -> int:
        """Event slots per situation (M)."""
        return self.manifest.max_events

    @property
    def version(self) -> int:
        """Model version from the manifest."""
        return self.manifest.model_version

    @property
    def sha256(self) -> str:
        """sha256 of the loaded ONNX file."""
        return self.manifest.sha256

    # -- inference --------------------------------------------------------------------------
    def predict(self, signals: np.ndarray, mask: np.ndarray | None = None,
                events: np.ndarray | None = None) -> Prediction:
        """Predict for one (K, F) situation or a (B, K, F) batch of raw signal values."""
        feed = self.validate(signals, mask, events)
        if self.engine is not None:
            probs, embedding = self.engine.run_windows(feed["signals"], feed["mask"],
                                                       feed["events"])
        else:
            probs, embedding = self.session.run(self._outputs, feed)
        return Prediction(probs, embedding, self._labels, self.thresholds)

    def predict_one(self, signals: np.ndarray, mask: np.ndarray | None = None,
                    events: np.ndarray | None = None) -> Prediction:
        """Single-situation fast path: inputs are copied into buffers reused across calls.

        Validation is the same as ``predict`` but done in place, without stacking or
        converting, so the control loop allocates little more than ONNX Runtime's outputs.
        """
        one = self._one
        k, f = one["signals"].shape[1:]
        _check_array("signals", signals, (k, f), float_only=True)
        np.copyto(one["signals"][0], signals, casting="same_kind")
        if not np.isfinite(one["signals"]).all():
            raise InputError(_nonfinite_message("signals"))
        if mask is None:
            one["mask"].fill(1.0)
        else:
            _check_array("mask", mask, (k, f), float_only=False)
            np.copyto(one["mask"][0], mask, casting="unsafe")
            _check_mask(one["mask"])
        if events is None:
            one["events"].fill(0)
        else:
            one["events"][0] = self._pad_events(np.asarray(events)[None])[0]
        if self.engine is not None:
            probs, embedding = self.engine.run_windows(one["signals"], one["mask"],
                                                       one["events"])
        else:
            probs, embedding = self.session.run(self._outputs, one)
        return Prediction(probs, embedding, self._labels, self.thresholds)

    # -- streaming ---------------------------------------------------------------------------
    def reset(self, reason: str = "requested") -> None:
        """Forget the stream's state; the next frame starts afresh (thread-safe flag)."""
        if self.engine is None:
            return
        self._reset_reason = reason if reason in self.stream_resets else "requested"
        self._reset_pending = True

    def _check_time(self, t: float | None) -> None:
        if t is None:
            return
        last = self._last_t
        if last is not None and not self._reset_pending:
            if t < last:
                self._reset_pending, self._reset_reason = True, "backward"
            elif t - last > self.gap_s:
                self._reset_pending, self._reset_reason = True, "gap"
        self._last_t = t

    def step(self, frame: np.ndarray, mask: np.ndarray, events: np.ndarray,
             t: float | None = None) -> np.ndarray:
        """One frame of a streaming bundle: probabilities (L,), a view reused next call."""
        engine = self.engine
        if engine is None:
            raise TypeError("step() needs a streaming bundle; use predict_one for windows")
        if t is not None:
            self._check_time(t)
        if self._reset_pending:
            self._restart()
            self.stream_resets[self._reset_reason] += 1
            self._reset_pending = False
        return self._advance(frame, mask, events)[0]

    def _restart(self) -> None:
        self.engine.reset()
        if self._twin is not None:
            self._twin.reset()
        self._frames = 0

    def _advance(self, frame, mask, events) -> tuple[np.ndarray, np.ndarray]:
        """One frame through the state(s); returns (probabilities, embedding) views.

        With a restart period P two states run, each restarted every P frames half a period
        apart, and the older one answers: it has seen P/2+1..P frames, a history length
        training cropped its windows to.
        """
        # a finite but absurd sample (3e38 from a broken driver) overflowed the recurrent
        # state and made every output NaN for seconds; no real signal sits a million
        # training standard deviations from its mean, so such values are held at that edge:
        # the compiled kernel holds it there itself at no cost; the ONNX Runtime path here
        if self.engine.kernel is None and np.shape(frame) == self._frame_low.shape:
            frame = np.clip(frame, self._frame_low, self._frame_high)  # (shape: engine's)
        twin = self._twin
        if twin is None:
            return self.engine.step(frame, mask, events)
        n, period = self._frames, self._period
        half = period // 2
        if n and n % period == 0:
            self.engine.reset()
        if n % period == half and n >= half:
            twin.reset()
        self.engine.step_pair(twin, frame, mask, events)
        self._frames = n + 1
        answer = self.engine if n % period + 1 > half or n < half else twin
        self._answer = answer
        return answer.probabilities, answer.embedding

    @property
    def last_embedding(self) -> np.ndarray:
        """Embedding (H,) of the last ``step``: a view the next call overwrites."""
        if self.engine is None:
            raise TypeError("last_embedding needs a streaming bundle")
        return self._answer.embedding

    def predict_frame(self, signals: np.ndarray, mask: np.ndarray, events: np.ndarray,
                      t: float | None = None, seq: int | None = None) -> Prediction:
        """The node's per-frame call: step the newest row (replaying the window after a reset).

        Window bundles answer with ``predict_one`` (the whole window every frame).
        """
        if self.engine is None:
            return self.predict_one(signals, mask, events)
        self._check_time(t)
        if seq is not None:
            if self._last_seq is not None and seq != self._last_seq + 1 \
                    and not self._reset_pending:
                self._reset_pending, self._reset_reason = True, "gap"
            self._last_seq = seq
        if self._reset_pending:
            k, f = self.window, len(self.manifest.signals)
            _check_array("signals", signals, (k, f), float_only=True)
            _check_array("mask", mask, (k, f), float_only=False)
            self._restart()
            self.stream_resets[self._reset_reason] += 1
            try:
                for row in range(k - 1):  # the window from the reset state, as in training
                    self._advance(signals[row], mask[row], events)
            except InputError:
                self._reset_reason = "requested"
                raise  # still pending: the next good frame replays its window
            self._reset_pending = False
        probs, embedding = self._advance(signals[-1], mask[-1], events)
        probs2 = probs[None].copy()
        return Prediction(probs2, embedding[None].copy(), self._labels, self.thresholds)

    def validate(self, signals, mask=None, events=None) -> dict[str, np.ndarray]:
        """Return a checked, batched float32/int64 feed dict; raise InputError with the reason."""
        k, f = self.window, len(self.manifest.signals)
        signals = np.asarray(signals)
        if signals.ndim == 2:
            signals = signals[None]
        _check_array("signals", signals, (None, k, f), float_only=True)
        signals = signals.astype(np.float32, copy=False)
        if not np.isfinite(signals).all():
            raise InputError(_nonfinite_message("signals"))
        batch = signals.shape[0]
        if mask is None:
            mask = np.ones_like(signals)
        else:
            mask = np.asarray(mask)
            if mask.ndim == 2:
                mask = mask[None]
            _check_array("mask", mask, (batch, k, f), float_only=False)
            mask = mask.astype(np.float32, copy=False)
            _check_mask(mask)
        if events is None:
            events = np.zeros((batch, self.max_events), np.int64)
        else:
            events = np.asarray(events)
            if events.ndim == 1:
                events = events[None]
            if events.ndim != 2 or events.shape[0] != batch:
                raise InputError(f"events must be (M,) or (B, M) with B={batch}, got shape "
                                 f"{events.shape}")
            events = self._pad_events(events)
        return {"signals": np.ascontiguousarray(signals), "mask": np.ascontiguousarray(mask),
                "events": np.ascontiguousarray(events)}

    def _pad_events(self, events: np.ndarray) -> np.ndarray:
        """Left-pad (B, m<=M) event ids with 0 so the newest stay last, as in training."""
        if not np.issubdtype(events.dtype, np.integer):
            raise InputError(f"events must be integer ids, got dtype {events.dtype}")
        width = events.shape[-1]
        if width > self.max_events:
            raise InputError(f"events has {width} slots, the bundle takes at most "
                             f"{self.max_events}")
        vocab = len(self.manifest.event_vocabulary)
        if events.size and (events.min() < 0 or events.max() > vocab):
            raise InputError(f"event ids must be in [0, {vocab}] (0 = padding), got "
                             f"[{events.min()}, {events.max()}]")
        events = events.astype(np.int64, copy=False)
        if width < self.max_events:
            events = np.pad(events, ((0, 0), (self.max_events - width, 0)))
        return events


def _check_array(name: str, array, shape: tuple, float_only: bool) -> None:
    if not isinstance(array, np.ndarray):
        raise InputError(f"{name} must be a numpy array, got {type(array).__name__}")
    kind = array.dtype.kind
    allowed = "f" if float_only else "fiub"
    if kind not in allowed:
        raise InputError(f"{name} must have a {'float' if float_only else 'numeric'} dtype, "
                         f"got {array.dtype}")
    ok = array.ndim == len(shape) and all(
        want is None or got == want for got, want in zip(array.shape, shape, strict=True))
    if not ok:
        want = ", ".join("B" if s is None else str(s) for s in shape)
        raise InputError(f"{name} must have shape ({want}) (window K, signals F), got "
                         f"{array.shape}")


def _check_mask(mask: np.ndarray) -> None:
    if not np.isfinite(mask).all() or mask.min() < 0.0 or mask.max() > 1.0:
        raise InputError("mask must hold values in [0, 1] (1 = observed), without NaN/inf")


def _nonfinite_message(name: str) -> str:
    return (f"{name} contain NaN or inf; missing values must be 0 with mask 0 "
            "(never NaN)")
