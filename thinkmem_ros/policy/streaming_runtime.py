"""Per-frame update of a streaming policy bundle: one compiled call per frame, no torch.

A streaming bundle (``bundle.json`` format 2 with a ``streaming`` section) ships the
per-frame update as ONNX with explicit state inputs and outputs::

    (frame (B, F), mask (B, F), events (B, M) int64, h (B, H), mu (B, F), var (B, F),
     seen (B, F), ring (B, R, F), ring_mask (B, R, F))
        -> (probabilities (B, L), embedding (B, H), h_out, mu_out, var_out, seen_out,
            ring_out, ring_mask_out)

``events`` is the register of the last M event ids (oldest first, 0 = padding), the same
input a window bundle takes. The model is ``training/streaming_model.py``; with a restart
period (``StreamingConfig.restart``) the runtime (``policy/runtime.py``) runs two staggered
states through this same update.

Two engines run it, chosen by measurement (``thinkmem bench latency``: on the 2-core
development machine, p50 per frame 9-14 us compiled against ~250 us through ONNX Runtime
with I/O binding). At H=64 most of the compiled frame is reading the GRU's ~110 KB of
float32 weights, more than the core's L1 holds (~25 GB/s from L2 here: ~4 us), so the
weights are packed for contiguous column sweeps and the call takes seven arrays and no
scalars (each argument costs ~0.2 us to unbox).

* ``numba``: the update spelled out in one ``@njit`` function whose weights are read from
  the very ONNX file (its initialisers, parsed here without the ``onnx`` package). Each
  frame is a single call into compiled code on preallocated buffers; input checks
  (finite values, mask range, event ids) run inside that call. Compiled code is cached in
  ``$NUMBA_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/thinkmem_ros/numba`` (default
  ``~/.cache/thinkmem_ros/numba``), so an installed, read-only package still caches and a
  warm start skips compiling; an unwritable cache dir compiles without caching.
* ``ort``: ONNX Runtime on the same graph with I/O binding to preallocated buffers; two
  bindings alternate so the state written by one frame is the state read by the next,
  without copies. Used when numba is not installed, fails to compile, or is disabled.

``THINKMEM_STREAMING_ENGINE`` picks the engine: ``auto`` (default: numba, else ort),
``numba`` (numba or an error) or ``ort``. Parity between the two engines is <= 1e-4 on the
same ONNX file (``test/test_streaming_policy.py``).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from thinkmem_ros.policy.bundle import BundleError

LOG = logging.getLogger(__name__)

SHAPE_EPS = 0.05
"""Floor of the running std in globally normalised units (as the window policy's)."""

KIND = "gru"
ENGINE_ENV = "THINKMEM_STREAMING_ENGINE"
ENGINES = ("auto", "numba", "ort")
STATE_INPUTS = ("h", "mu", "var", "seen", "ring", "ring_mask")
STATE_OUTPUTS = tuple(f"{name}_out" for name in STATE_INPUTS)
STEP_INPUTS = ("frame", "mask", "events") + STATE_INPUTS
STEP_OUTPUTS = ("probabilities", "embedding") + STATE_OUTPUTS
PARAMS = ("signal_mean", "signal_std", "gru.weight_ih_l0", "gru.bias_ih_l0",
          "gru.weight_hh_l0", "gru.bias_hh_l0", "event_embed.weight", "event_pos",
          "mix.weight", "mix.bias", "head.weight", "head.bias")
"""ONNX initialiser names the compiled kernel reads, in the order they are packed."""
TRANSPOSED = frozenset({"gru.weight_ih_l0", "gru.weight_hh_l0", "mix.weight"})
"""Matrices packed transposed: the kernel adds their columns, each contiguous."""


class StreamingError(RuntimeError):
    """A streaming bundle cannot run: bad graph, missing weights, or no engine available."""


CLIP_STDS = 1e6
"""A streaming frame's values are held within this many training standard deviations of
the training mean (far past any real signal; 1e25 and above overflowed the state)."""


MAX_DIMENSION = 100_000
"""Largest window, width or tap a streaming manifest may declare: the engine allocates
arrays of these sizes (taps of 1e9 frames asked for 52 GiB when a node started)."""


@dataclass(frozen=True)
class StreamingConfig:
    """Shape of a streaming policy; ``bundle.json`` carries it as ``model_config``.

    ``window`` (K) is the number of frames a training situation replays from the reset
    state, and so the warm-up the robot replays after a reset; ``hidden`` (H) is the GRU
    state size; ``ema_alpha`` the factor of the running level/spread per channel.
    ``taps``: the frame also enters the GRU as its change against the frames that many
    steps back, read from a ring of the last ``max(taps)`` normalised frames kept in the
    state. A recurrence alone blurs *when* a value was seen; a situation is stated over a
    span ("rose by 4 over the last 3 s"), so the span's ends are given to it directly.
    ``restart`` (P, 0 = never): the runtime keeps two states, each restarted every P frames,
    staggered by P // 2, and answers from the one that has seen between P // 2 and P
    frames; training crops each window to a random length in [P // 2, K]. What the robot
    computes per frame is then a computation training did; a single state run for hours
    reaches states training never saw (measured: held-out F1 0.90-0.93 streamed against
    0.98 on windows).
    """

    window: int = 32
    n_signals: int = 7
    n_labels: int = 10
    hidden: int = 64
    max_events: int = 8
    n_event_vocab: int = 0
    ema_alpha: float = 0.0
    taps: tuple[int, ...] = (4, 8, 16, 31)
    restart: int = 0
    kind: str = KIND

    def __post_init__(self) -> None:
        for name in ("window", "n_signals", "n_labels", "hidden", "max_events"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not \
                    1 <= value <= MAX_DIMENSION:
                raise ValueError(f"StreamingConfig.{name} must be an integer in [1, "
                                 f"{MAX_DIMENSION}], got {value!r}")
        if isinstance(self.n_event_vocab, bool) or not isinstance(self.n_event_vocab, int) \
                or self.n_event_vocab < 0:
            raise ValueError(f"StreamingConfig.n_event_vocab must be an integer >= 0, got "
                             f"{self.n_event_vocab!r}")
        if self.ema_alpha == 0.0:  # default: the EMA spans about one window
            object.__setattr__(self, "ema_alpha", 2.0 / (self.window + 1))
        if not isinstance(self.ema_alpha, (int, float)) or not 0.0 < self.ema_alpha <= 1.0:
            raise ValueError(f"StreamingConfig.ema_alpha must be in (0, 1], got "
                             f"{self.ema_alpha!r}")
        taps = tuple(self.taps)
        if not taps or any(isinstance(t, bool) or not isinstance(t, int)
                           or not 1 <= t <= MAX_DIMENSION for t in taps) \
                or list(taps) != sorted(set(taps)):
            raise ValueError(f"StreamingConfig.taps must be increasing integers in [1, "
                             f"{MAX_DIMENSION}], got {self.taps!r}")
        object.__setattr__(self, "taps", taps)
        if isinstance(self.restart, bool) or not isinstance(self.restart, int) or not (
                self.restart == 0 or 2 <= self.restart <= self.window):
            raise ValueError(f"StreamingConfig.restart must be 0 or in [2, window="
                             f"{self.window}], got {self.restart!r}")
        if self.kind != KIND:
            raise ValueError(f"StreamingConfig.kind must be {KIND!r}, got {self.kind!r}")

    @classmethod
    def from_dict(cls, data: dict) -> StreamingConfig:
        """Rebuild from ``to_dict`` output (a bundle's ``model_config``)."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown StreamingConfig fields {unknown}")
        return cls(**data)

    def to_dict(self) -> dict:
        """Plain JSON-able dict."""
        out = asdict(self)
        out["taps"] = list(self.taps)
        return out

    @property
    def ring(self) -> int:
        """Frames kept in the state's ring (R = the longest tap)."""
        return max(self.taps)

    @property
    def n_inputs(self) -> int:
        """GRU input width: value, mask, shape, and (change, mask) per tap."""
        return (3 + 2 * len(self.taps)) * self.n_signals

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-sample shape of each state tensor, in ``STATE_INPUTS`` order."""
        f, r = self.n_signals, self.ring
        return {"h": (self.hidden,), "mu": (f,), "var": (f,), "seen": (f,),
                "ring": (r, f), "ring_mask": (r, f)}


# -- reading initialisers from ONNX bytes (protobuf wire format, no onnx package) ---------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise StreamingError("truncated protobuf varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise StreamingError("malformed protobuf varint")


def _fields(buf: bytes):
    """Yield (field number, wire type, value) of one protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise StreamingError(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):
            raise StreamingError("truncated protobuf message")
        yield number, wire, value


def _tensor(buf: bytes) -> tuple[str, np.ndarray]:
    dims, dtype, name, raw, floats = [], 0, "", None, []
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            dims.append(value)
        elif number == 1 and wire == 2:
            pos, packed = 0, bytes(value)
            while pos < len(packed):
                dim, pos = _varint(packed, pos)
                dims.append(dim)
        elif number == 2:
            dtype = value
        elif number == 8:
            name = bytes(value).decode("utf-8")
        elif number == 9:
            raw = bytes(value)
        elif number == 4 and wire == 2:
            floats.append(np.frombuffer(bytes(value), "<f4"))
        elif number == 4 and wire == 5:
            floats.append(np.frombuffer(bytes(value), "<f4"))
    if dtype != 1:  # only float tensors are weights the kernel reads
        return name, np.zeros(0, np.float32)
    data = np.frombuffer(raw, "<f4") if raw is not None else (
        np.concatenate(floats) if floats else np.zeros(0, np.float32))
    if data.size != math.prod(dims):
        raise StreamingError(f"initialiser {name!r}: {data.size} values for shape {dims}")
    return name, data.astype(np.float32).reshape(dims)


def onnx_initialisers(model: bytes) -> dict[str, np.ndarray]:
    """Float initialisers of an ONNX model by name (ModelProto.graph.initializer)."""
    out: dict[str, np.ndarray] = {}
    for number, wire, value in _fields(model):
        if number == 7 and wire == 2:  # ModelProto.graph
            for g_number, g_wire, g_value in _fields(bytes(value)):
                if g_number == 5 and g_wire == 2:  # GraphProto.initializer
                    name, array = _tensor(bytes(g_value))
                    if array.size:
                        out[name] = array
    return out


# -- external data: tensor values kept in another file than the ONNX one ----------------
NESTED_TENSORS = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "training": {1: "graph", 2: "graph"},
    "function": {7: "node", 11: "attribute"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse",
                  23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
}
"""Every path from an ONNX ModelProto to a TensorProto (onnx.proto field numbers): graph
initialisers, sparse initialisers, Constant and other attribute tensors, subgraphs of
If/Loop/Scan, functions and training graphs. {message: {field: nested message}}."""

MAX_NESTING = 100
"""Deepest message nesting scanned (protobuf's own default parse limit)."""


def external_data_tensors(model: bytes) -> list[str]:
    """Each tensor of an ONNX model whose values live in another file, as 'name in location'.

    Why: a bundle's sha256 and signature cover ``policy.onnx`` alone, and ONNX Runtime, given
    the model as bytes, opens an external file relative to the process's working directory.
    Weights kept outside the file could be swapped without any check noticing, so the
    runtime refuses such a model before ONNX Runtime sees it. Read with this module's
    protobuf reader: the robot has no ``onnx`` package. Raises StreamingError on bytes that
    are not a well-formed protobuf.
    """
    found: list[str] = []
    _scan_message(memoryview(model), "model", 0, found)
    return found


def refuse_external_data(model: bytes, source: str, sha256: str = "") -> None:
    """Raise BundleError (one line naming ``source``) if any tensor lives in another file.

    Called before an InferenceSession is built: once ONNX Runtime has the model it has
    already read the outside file, from wherever the process happens to run.
    """
    tag = f" (sha256 {sha256})" if sha256 else ""
    try:
        found = external_data_tensors(model)
    except StreamingError as exc:
        raise BundleError(f"{source}: ONNX Runtime cannot load the model{tag}: not a "
                          f"well-formed ONNX protobuf ({exc})") from None
    if found:
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        raise BundleError(f"{source}: the model keeps tensor values in external data "
                          f"files ({', '.join(found[:3])}{more}), which the bundle's sha256 "
                          f"and signature do not cover; refused: embed the weights in the "
                          f"ONNX file{tag}")


def _scan_message(buf, kind: str, depth: int, found: list[str]) -> None:
    """Walk one message along ``NESTED_TENSORS``, noting external tensors in ``found``."""
    if depth > MAX_NESTING:
        raise StreamingError(f"messages nested deeper than {MAX_NESTING}")
    if kind == "tensor":
        where = _external_location(buf)
        if where is not None:
            found.append(where)
        return
    nested = NESTED_TENSORS[kind]
    for number, wire, value in _fields(buf):
        child = nested.get(number)
        if child is not None and wire == 2:
            _scan_message(value, child, depth + 1, found)


def _external_location(tensor) -> str | None:
    """'name in location' when a TensorProto points outside the model, else None.

    Either sign counts (external_data entries, or data_location other than DEFAULT): ONNX
    Runtime reads the file on the second, and nothing legitimate writes the first alone.
    """
    name, locations, external = "", [], False
    for number, wire, value in _fields(tensor):
        if number == 8 and wire == 2:  # TensorProto.name
            name = bytes(value).decode("utf-8", "replace")
        elif number == 13 and wire == 2:  # TensorProto.external_data (key/value entries)
            external = True
            entry = {n: bytes(v).decode("utf-8", "replace") for n, w, v in _fields(value)
                     if w == 2}
            if entry.get(1) == "location":
                locations.append(entry.get(2, ""))
        elif number == 14 and wire == 0 and value != 0:  # TensorProto.data_location
            external = True
    if not external:
        return None
    where = repr(locations[0][:80]) if locations else "an unnamed file"
    return f"{name[:80]!r} in {where}"


def pack_params(config: StreamingConfig, weights: dict[str, np.ndarray]) -> np.ndarray:
    """The kernel's flat float32 parameter vector, checking every expected shape.

    (EMA alpha, std floor, then ``PARAMS`` in order, ``TRANSPOSED`` ones transposed.)
    """
    c = config
    f, h, lab, m, v = c.n_signals, c.hidden, c.n_labels, c.max_events, c.n_event_vocab + 1
    shapes = {"signal_mean": (f,), "signal_std": (f,), "gru.weight_ih_l0": (3 * h, c.n_inputs),
              "gru.bias_ih_l0": (3 * h,), "gru.weight_hh_l0": (3 * h, h),
              "gru.bias_hh_l0": (3 * h,), "event_embed.weight": (v, h), "event_pos": (m, h),
              "mix.weight": (h, h), "mix.bias": (h,), "head.weight": (lab, h),
              "head.bias": (lab,)}
    parts = [np.asarray([c.ema_alpha, SHAPE_EPS], np.float32)]
    for name in PARAMS:
        if name not in weights:
            raise StreamingError(f"the ONNX graph has no initialiser {name!r}")
        array = np.asarray(weights[name], np.float32)
        if array.shape != shapes[name]:
            raise StreamingError(f"initialiser {name!r} has shape {array.shape}, the "
                                 f"manifest implies {shapes[name]}")
        parts.append((array.T if name in TRANSPOSED else array).ravel())
    return np.ascontiguousarray(np.concatenate(parts), np.float32)


# -- the compiled kernel -----------------------------------------------------------------
def cache_dir() -> Path:
    """Where compiled kernels are cached: a user-writable dir, never the package's."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "thinkmem_ros" / "numba"

# tanh as a 13/6 rational function on [-7.9, 7.9] (the approximation Eigen and XLA use for
# float32): within 4e-7 of tanh everywhere, and unlike math.exp/tanh calls it vectorises,
# which is most of the kernel's time at H=64.
TANH_CLAMP = np.float32(7.90531110763549805)
TA1 = np.float32(4.89352455891786e-03)
TA3 = np.float32(6.37261928875436e-04)
TA5 = np.float32(1.48572235717979e-05)
TA7 = np.float32(5.12229709037114e-08)
TA9 = np.float32(-8.60467152213735e-11)
TA11 = np.float32(2.00018790482477e-13)
TA13 = np.float32(-2.76076847742355e-16)
TB0 = np.float32(4.89352518554385e-03)
TB2 = np.float32(2.26843463243900e-03)
TB4 = np.float32(1.18534705686654e-04)
TB6 = np.float32(1.19825839466702e-06)


def _rational_tanh(y):
    """tanh(y) for |y| <= TANH_CLAMP as the 13/6 rational function (vectorises, unlike exp)."""
    y2 = y * y
    num = ((((((TA13 * y2 + TA11) * y2 + TA9) * y2 + TA7) * y2 + TA5) * y2 + TA3)
           * y2 + TA1) * y
    return num / (((TB6 * y2 + TB4) * y2 + TB2) * y2 + TB0)


def _step_source(params, state, x, m, ev, out, meta):
    """One frame, in place: the state and out (probs | embedding | scratch) are updated.

    ``params`` is ``pack_params``' vector (alpha, eps, then the weights, the GRU and mix
    matrices transposed); ``meta`` holds (F, H, L, M, V, number of taps, taps...). Seven
    array arguments and no scalars: each argument costs the call ~0.2 us to unbox, about
    what the whole input stage costs. State layout: h | mu | var | seen | ring | ring_mask
    (``STATE_INPUTS``). Returns 0, or an ``_STEP_ERRORS`` code (1 non-finite signal, 2 mask
    outside [0, 1], 3 bad event id, 4 wrong input shape, 5 short buffers); on a non-zero
    return the state is untouched.
    """
    if meta.shape[0] < 7:
        return 5
    f, h, lab, nm, nv, nt = meta[0], meta[1], meta[2], meta[3], meta[4], meta[5]
    if nt < 1 or meta.shape[0] < 6 + nt:
        return 5
    nr = meta[5 + nt]  # ring rows = the longest tap
    nin = (3 + 2 * nt) * f
    g3 = 3 * h
    if x.shape[0] != f or m.shape[0] != f or ev.shape[0] != nm:
        return 4
    if out.shape[0] < lab + 7 * h + nin or state.shape[0] < h + 3 * f + 2 * nr * f \
            or params.shape[0] < 2 + 2 * f + g3 * (nin + h + 2) + (nv + nm + h + 1) * h \
            + lab * (h + 1):
        return 5
    for i in range(f):
        if not math.isfinite(x[i]):
            return 1
        if not (m[i] >= 0.0 and m[i] <= 1.0):
            return 2
    for j in range(nm):
        if ev[j] < 0 or ev[j] >= nv:
            return 3
    alpha, eps = params[0], params[1]
    # views into params (PARAMS order after alpha and eps; ``TRANSPOSED`` ones as (in, out))
    # and into state and out, made once: index arithmetic on raw offsets would hide from
    # the compiler that the inner loops are contiguous (it then gathers and scatters)
    o_wih = 2 + 2 * f
    o_whh = o_wih + nin * g3 + g3
    o_emb = o_whh + h * g3 + g3
    o_mix = o_emb + (nv + nm) * h
    o_head = o_mix + h * h + h
    mean = params[2:2 + f]
    std = params[2 + f:o_wih]
    w_ih = params[o_wih:o_wih + nin * g3].reshape((nin, g3))
    b_ih = params[o_wih + nin * g3:o_whh]
    w_hh = params[o_whh:o_whh + h * g3].reshape((h, g3))
    b_hh = params[o_whh + h * g3:o_emb]
    embed = params[o_emb:o_emb + nv * h].reshape((nv, h))
    pos = params[o_emb + nv * h:o_mix].reshape((nm, h))
    w_mix = params[o_mix:o_mix + h * h].reshape((h, h))
    b_mix = params[o_mix + h * h:o_head]
    w_head = params[o_head:o_head + lab * h].reshape((lab, h))
    b_head = params[o_head + lab * h:o_head + lab * h + lab]
    hs = state[:h]
    mus = state[h:h + f]
    vrs = state[h + f:h + 2 * f]
    sns = state[h + 2 * f:h + 3 * f]
    ring = state[h + 3 * f:h + 3 * f + nr * f].reshape((nr, f))  # oldest row first
    rmask = state[h + 3 * f + nr * f:h + 3 * f + 2 * nr * f].reshape((nr, f))
    emb = out[lab:lab + h]
    u = out[lab + h:lab + h + nin]  # scratch after probs | embedding
    gate = out[lab + h + nin:lab + h + nin + g3]
    hid = out[lab + h + nin + g3:lab + h + nin + 2 * g3]
    for i in range(f):
        # a finite but absurd sample (3e38) is held a million stds from the mean: past
        # that, the recurrent state overflowed and every output was NaN for seconds
        lim = np.float32(CLIP_STDS) * std[i]
        xi = min(max(x[i], mean[i] - lim), mean[i] + lim)
        xn = (xi - mean[i]) / std[i] * m[i]
        o = np.float32(1.0) if m[i] > 0.0 else np.float32(0.0)
        mu = mus[i]
        var = vrs[i]
        seen = sns[i]
        d = xn - mu
        mu_run = mu + alpha * d
        var_run = (np.float32(1.0) - alpha) * (var + alpha * d * d)
        mu_new = o * (seen * mu_run + (np.float32(1.0) - seen) * xn) \
            + (np.float32(1.0) - o) * mu
        var_new = o * seen * var_run \
            + (np.float32(1.0) - o * seen) * var * (np.float32(1.0) - o)
        mus[i] = mu_new
        vrs[i] = var_new
        sns[i] = max(seen, o)
        u[i] = xn
        u[f + i] = m[i]
        u[2 * f + i] = (xn - mu_new) / math.sqrt(var_new + eps * eps) * o
        for j in range(nt):
            back = nr - meta[6 + j]
            u[(3 + 2 * j) * f + i] = (xn - ring[back, i]) * o * rmask[back, i]
            u[(4 + 2 * j) * f + i] = rmask[back, i]
    # the ring moves by one frame (drop the oldest, add this one): one flat copy forward
    shift = state[h + 3 * f:h + 3 * f + 2 * nr * f]  # ring | ring_mask, adjacent
    for k in range(2 * nr * f - f):
        shift[k] = shift[k + f]
    for i in range(f):
        ring[nr - 1, i] = u[i]
        rmask[nr - 1, i] = np.float32(1.0) if m[i] > 0.0 else np.float32(0.0)
    # W_ih u and W_hh h as sums of weight columns (contiguous, so they vectorise without a
    # horizontal sum per row); zero inputs (masked signals, a fresh state) are skipped.
    for j in range(g3):
        gate[j] = b_ih[j]
        hid[j] = b_hh[j]
    for k in range(nin):
        uk = u[k]
        if uk != 0.0:
            for j in range(g3):
                gate[j] += w_ih[k, j] * uk
    for k in range(h):
        hk = hs[k]
        if hk != 0.0:
            for j in range(g3):
                hid[j] += w_hh[k, j] * hk
    count = np.float32(0.0)
    for k in range(h):
        emb[k] = 0.0
    for j in range(nm):
        if ev[j] > 0:
            count += np.float32(1.0)
            e_id = ev[j]
            for k in range(h):
                emb[k] += embed[e_id, k] + pos[j, k]
    inv = np.float32(1.0) / max(count, np.float32(1.0))
    for k in range(2 * h):  # reset and update gates: sigmoid(y) = (1 + tanh(y / 2)) / 2
        y = min(max(np.float32(0.5) * (gate[k] + hid[k]), -TANH_CLAMP), TANH_CLAMP)
        gate[k] = np.float32(0.5) * _tanh(y) + np.float32(0.5)
    for k in range(h):
        y = min(max(gate[2 * h + k] + gate[k] * hid[2 * h + k], -TANH_CLAMP), TANH_CLAMP)
        zg = gate[h + k]
        hk = (np.float32(1.0) - zg) * _tanh(y) + zg * hs[k]
        hs[k] = hk
        emb[k] = hk + emb[k] * inv
    mix = hid  # scratch: the hidden-side products are spent
    for j in range(h):
        mix[j] = b_mix[j]
    for k in range(h):
        ek = emb[k]
        for j in range(h):
            mix[j] += w_mix[k, j] * ek
    for r in range(lab):
        acc = b_head[r]
        for k in range(h):
            acc += w_head[r, k] * max(mix[k], np.float32(0.0))
        y = min(max(np.float32(0.5) * acc, -TANH_CLAMP), TANH_CLAMP)
        out[r] = np.float32(0.5) * _tanh(y) + np.float32(0.5)
    return 0


JIT_OPTIONS = {"fastmath": {"reassoc", "contract", "nsz", "arcp"}, "nogil": True,
               "error_model": "numpy"}
"""Reassociation lets the dot products vectorise; 'nnan'/'ninf' stay off so the kernel's
own finiteness check of each frame is not optimised away."""

_KERNEL = None
_KERNEL_ERROR = ""
_tanh = None  # _rational_tanh compiled, set before the kernel that calls it compiles
_PAIR = None


def _pair_source(params, s1, s2, x, m, ev, o1, o2, meta):
    """The same frame through two states (the restart schedule) in one compiled call."""
    code = _KERNEL(params, s1, x, m, ev, o1, meta)
    if code:
        return code
    return _KERNEL(params, s2, x, m, ev, o2, meta)


def pair_kernel():
    """The compiled two-state step, or None (then the engines are called one by one)."""
    global _PAIR
    if _PAIR is not None or numba_kernel() is None:
        return _PAIR
    import numba

    signature = ("int64(float32[::1], float32[::1], float32[::1], float32[::1], "
                 "float32[::1], int64[::1], float32[::1], float32[::1], int64[::1])")
    for cache in (True, False):
        try:
            _PAIR = numba.njit(signature, cache=cache, **JIT_OPTIONS)(_pair_source)
            break
        except Exception as exc:  # noqa: BLE001 - two calls per frame still work
            LOG.warning("two-state kernel not compiled (cache=%s): %s", cache, exc)
    return _PAIR


def numba_kernel():
    """The compiled step (cached on disk), or None with ``kernel_error()`` saying why."""
    global _KERNEL, _KERNEL_ERROR
    if _KERNEL is not None or _KERNEL_ERROR:
        return _KERNEL
    try:
        import numba
    except Exception as exc:  # noqa: BLE001 - any import failure means: use ONNX Runtime
        _KERNEL_ERROR = f"numba unavailable: {exc}"
        return None
    signature = ("int64(float32[::1], float32[::1], float32[::1], float32[::1], "
                 "int64[::1], float32[::1], int64[::1])")
    global _tanh
    if _tanh is None:
        _tanh = numba.njit(inline="always", **JIT_OPTIONS)(_rational_tanh)
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise PermissionError(f"{folder} is not writable")
        numba.config.CACHE_DIR = str(folder)
        kernel = numba.njit(signature, cache=True, **JIT_OPTIONS)(_step_source)
    except Exception as exc:  # noqa: BLE001 - no usable cache: compile in memory instead
        LOG.warning("numba cache unavailable (%s); compiling without a cache", exc)
        try:
            kernel = numba.njit(signature, **JIT_OPTIONS)(_step_source)
        except Exception as exc2:  # noqa: BLE001
            _KERNEL_ERROR = f"numba cannot compile the streaming step: {exc2}"
            return None
    _KERNEL = kernel
    return _KERNEL


def warm_up() -> str:
    """Import numba and load (or compile) the streaming step now; returns the engine.

    Why: the first streaming bundle otherwise does this inside the node's start-up, after
    the node joined the ROS graph and rclpy installed its signal handlers. Importing numba
    and compiling take seconds, and a Ctrl-C landing there has rclpy's shutdown thread
    tear the context down while the main thread is still deep in numba's import: seen once
    as a SIGSEGV instead of a clean exit. Done before ``rclpy.init``, the same Ctrl-C is a
    plain KeyboardInterrupt. "ort" when ``THINKMEM_STREAMING_ENGINE=ort`` or numba cannot
    be used (the runtime then says why when a bundle loads).
    """
    if _engine_choice(None) == "ort":
        return "ort"
    return "numba" if numba_kernel() is not None else "ort"


def kernel_error() -> str:
    """Why the compiled kernel is unavailable ('' when it is, or was never tried)."""
    return _KERNEL_ERROR


_STEP_ERRORS = {1: "frame contains NaN or inf; missing values must be 0 with mask 0",
                2: "mask must hold values in [0, 1] (1 = observed), without NaN/inf",
                3: "event ids out of range for the bundle's vocabulary (0 = padding)",
                4: "frame, mask and events must have shapes (F,), (F,) and (M,)",
                5: "internal buffers smaller than the bundle's shapes"}


class InputError(ValueError):
    """A frame given to the streaming engine has a bad shape, dtype or value."""


def _engine_choice(engine: str | None) -> str:
    choice = engine or os.environ.get(ENGINE_ENV, "auto") or "auto"
    if choice not in ENGINES:
        raise ValueError(f"{ENGINE_ENV} / engine must be one of {list(ENGINES)}, got "
                         f"{choice!r}")
    return choice


class StreamingEngine:
    """Runs a streaming bundle's per-frame update; holds the stream's state.

    ``step(frame, mask, events)`` advances the state by one frame and returns
    (probabilities (L,), embedding (H,)) as views into buffers that the next call
    overwrites. ``run_windows`` scores independent (B, K, F) windows from the reset state
    (what training saw) without touching the stream's state. ``state`` is the flat
    concatenation of the state tensors in ``STATE_INPUTS`` order.
    """

    def __init__(self, model: bytes, config: StreamingConfig, session,
                 engine: str | None = None) -> None:
        refuse_external_data(model, "streaming policy")
        self.config = c = config
        self.session = session
        f, h, lab = c.n_signals, c.hidden, c.n_labels
        self._n_vocab = c.n_event_vocab + 1
        # (F, H, L, M, V, number of taps, taps...): the kernel's shapes in one array
        self._meta = np.asarray([f, h, lab, c.max_events, self._n_vocab, len(c.taps),
                                 *c.taps], np.int64)
        self._shapes = c.state_shapes()
        self.state = np.zeros(sum(math.prod(v) for v in self._shapes.values()), np.float32)
        # probabilities | embedding | the kernel's scratch (no allocation per frame)
        self.out = np.zeros(lab + 7 * h + c.n_inputs, np.float32)
        self.probabilities = self.out[:lab]
        self.embedding = self.out[lab:lab + h]
        self._x = np.zeros(f, np.float32)
        self._m = np.zeros(f, np.float32)
        self._ev = np.zeros(c.max_events, np.int64)
        choice = _engine_choice(engine)
        self.kernel = None
        self.fallback_reason = ""
        if choice in ("auto", "numba"):
            try:
                self.params = pack_params(c, onnx_initialisers(model))
                self.kernel = numba_kernel()
                if self.kernel is None:
                    raise StreamingError(kernel_error())
            except StreamingError as exc:
                if choice == "numba":
                    raise
                self.fallback_reason = str(exc)
                LOG.warning("streaming policy falls back to ONNX Runtime: %s", exc)
        else:
            self.fallback_reason = f"{ENGINE_ENV}=ort"
        self.engine = "numba" if self.kernel is not None else "ort"
        if self.kernel is None:
            self._bind()

    def _views(self, flat: np.ndarray, batch: int | None = None) -> dict[str, np.ndarray]:
        """Named state tensors over a flat buffer (each (1, *shape), or (B, *shape))."""
        out, start = {}, 0
        for name, shape in self._shapes.items():
            size = math.prod(shape)
            if batch is None:
                out[name] = flat[start:start + size].reshape((1, *shape))
            else:
                out[name] = flat[:, start:start + size].reshape((batch, *shape))
            start += size
        return out

    # -- ONNX Runtime with I/O binding ------------------------------------------------------
    def _bind(self) -> None:
        c = self.config
        f = c.n_signals
        inputs = {"frame": self._x.reshape(1, f), "mask": self._m.reshape(1, f),
                  "events": self._ev.reshape(1, c.max_events)}
        # two state buffers: frame n reads one and writes the other; frame n+1 the reverse
        self._ort_states = [np.zeros_like(self.state) for _ in range(2)]
        views = [self._views(flat) for flat in self._ort_states]
        self._bindings = []
        for side in (0, 1):
            binding = self.session.io_binding()
            src, dst = views[side], views[1 - side]
            for name, array in {**inputs, **src}.items():
                binding.bind_input(name, "cpu", 0, array.dtype, list(array.shape),
                                   array.ctypes.data)
            outputs = {"probabilities": self.probabilities.reshape(1, -1),
                       "embedding": self.embedding.reshape(1, -1),
                       **{f"{name}_out": array for name, array in dst.items()}}
            for name, array in outputs.items():
                binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape),
                                    array.ctypes.data)
            self._bindings.append(binding)
        self._side = 0

    def reset(self) -> None:
        """Forget the stream: the next frame starts from the state training started from."""
        self.state.fill(0.0)
        if self.kernel is None:
            for flat in self._ort_states:
                flat.fill(0.0)
            self._side = 0

    def step(self, frame: np.ndarray, mask: np.ndarray,
             events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance the stream by one frame: raw (F,) values, (F,) mask, (M,) event register."""
        if self.kernel is not None:
            # Contiguous float32/float32/int64 1-D arrays go straight in: the kernel checks
            # shapes and values itself; anything else (another dtype, a strided view, a
            # list) fails the compiled signature and is copied into buffers once.
            try:
                code = self.kernel(self.params, self.state, frame, mask, events, self.out,
                                   self._meta)
            except TypeError:
                code = self.kernel(self.params, self.state,
                                   self._coerce(frame, self._x, "frame"),
                                   self._coerce(mask, self._m, "mask"),
                                   self._coerce(events, self._ev, "events"), self.out,
                                   self._meta)
            if code:
                raise InputError(_STEP_ERRORS[code])
            return self.probabilities, self.embedding
        return self._step_ort(frame, mask, events)

    def step_pair(self, other: StreamingEngine, frame: np.ndarray, mask: np.ndarray,
                  events: np.ndarray) -> None:
        """Advance this engine's and ``other``'s state by the same frame (one call if compiled).

        Read each engine's ``probabilities``/``embedding`` afterwards.
        """
        pair = pair_kernel() if self.kernel is not None and other.kernel is not None else None
        if pair is None:
            self.step(frame, mask, events)
            other.step(frame, mask, events)
            return
        try:
            code = pair(self.params, self.state, other.state, frame, mask, events, self.out,
                        other.out, self._meta)
        except TypeError:
            code = pair(self.params, self.state, other.state,
                        self._coerce(frame, self._x, "frame"),
                        self._coerce(mask, self._m, "mask"),
                        self._coerce(events, self._ev, "events"), self.out, other.out,
                        self._meta)
        if code:
            raise InputError(_STEP_ERRORS[code])

    def _step_ort(self, frame, mask, events):
        self._coerce(frame, self._x, "frame")
        self._coerce(mask, self._m, "mask")
        self._coerce(events, self._ev, "events")
        if not np.isfinite(self._x).all():
            raise InputError(_STEP_ERRORS[1])
        if not (np.isfinite(self._m).all() and self._m.min() >= 0.0 and self._m.max() <= 1.0):
            raise InputError(_STEP_ERRORS[2])
        if self._ev.min() < 0 or self._ev.max() >= self._n_vocab:
            raise InputError(_STEP_ERRORS[3])
        self.session.run_with_iobinding(self._bindings[self._side])
        self._side = 1 - self._side
        np.copyto(self.state, self._ort_states[self._side])  # readable whichever is live
        return self.probabilities, self.embedding

    @staticmethod
    def _coerce(value, buffer: np.ndarray, name: str) -> np.ndarray:
        array = np.asarray(value)
        if array.shape != buffer.shape:
            raise InputError(f"{name} must have shape {buffer.shape}, got {array.shape}")
        kind = "iu" if buffer.dtype.kind == "i" else "fiub"
        if array.dtype.kind not in kind:
            raise InputError(f"{name} must have a numeric dtype, got {array.dtype}")
        np.copyto(buffer, array, casting="unsafe")
        return buffer

    # -- windows from the reset state (training's view) ------------------------------------
    def run_windows(self, signals: np.ndarray, mask: np.ndarray,
                    events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, L) probabilities and (B, H) embeddings of windows each replayed from reset."""
        b, k, _ = signals.shape
        c = self.config
        probs = np.empty((b, c.n_labels), np.float32)
        embs = np.empty((b, c.hidden), np.float32)
        if self.kernel is not None:
            state = np.zeros_like(self.state)
            out = np.zeros_like(self.out)
            for i in range(b):
                state.fill(0.0)
                ev = np.ascontiguousarray(events[i], np.int64)
                for t in range(k):
                    code = self.kernel(self.params, state,
                                       np.ascontiguousarray(signals[i, t], np.float32),
                                       np.ascontiguousarray(mask[i, t], np.float32), ev, out,
                                       self._meta)
                    if code:
                        raise InputError(_STEP_ERRORS[code])
                probs[i] = out[:c.n_labels]
                embs[i] = out[c.n_labels:c.n_labels + c.hidden]
            return probs, embs
        flat = np.zeros((b, self.state.size), np.float32)
        feed = {**self._views(flat, b), "events": np.ascontiguousarray(events, np.int64)}
        p = e = None
        for t in range(k):
            feed["frame"] = np.ascontiguousarray(signals[:, t], np.float32)
            feed["mask"] = np.ascontiguousarray(mask[:, t], np.float32)
            p, e, *state = self.session.run(list(STEP_OUTPUTS), feed)
            feed.update(zip(STATE_INPUTS, state, strict=True))
        return p, e
