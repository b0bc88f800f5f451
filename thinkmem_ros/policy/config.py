"""The thinking policy's shape, apart from the model code so the robot side can read it.

No torch here: the bundle manifest carries ``PolicyConfig`` as a dict (``model_config``)
and anything that only needs to know the shapes (runtime checks, the consolidator's
bookkeeping) can rebuild it without the training stack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

POOLINGS = ("mean", "cls")


@dataclass(frozen=True)
class PolicyConfig:
    """Hyper-parameters of ``ThinkingPolicy``; a checkpoint carrying this rebuilds the model.

    ``window`` (K) frames of ``n_signals`` (F) signals plus the last ``max_events`` (M)
    discrete event ids (vocabulary of ``n_event_vocab`` names, id 0 = padding) map to
    ``n_labels`` (L) independent thinking probabilities.
    """

    window: int = 32
    n_signals: int = 7
    n_labels: int = 10
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    dropout: float = 0.1
    max_events: int = 8
    n_event_vocab: int = 0
    pooling: str = "mean"

    def __post_init__(self) -> None:
        positive = ("window", "n_signals", "n_labels", "d_model", "n_layers", "n_heads",
                    "d_ff", "max_events")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PolicyConfig.{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.n_event_vocab, bool) or not isinstance(self.n_event_vocab, int) \
                or self.n_event_vocab < 0:
            raise ValueError(
                f"PolicyConfig.n_event_vocab must be an integer >= 0, got {self.n_event_vocab!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"PolicyConfig.d_model={self.d_model} must be divisible by "
                f"n_heads={self.n_heads}")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"PolicyConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"PolicyConfig.pooling must be one of {list(POOLINGS)}, got {self.pooling!r}")

    @classmethod
    def from_preset(cls, name: str, **overrides) -> PolicyConfig:
        """Build a preset's architecture with data-dependent sizes (window, n_labels...) set."""
        if name not in PRESETS:
            raise ValueError(f"unknown policy preset {name!r}; expected one of {sorted(PRESETS)}")
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown PolicyConfig fields {unknown}")
        return replace(PRESETS[name], **overrides)

    @classmethod
    def from_dict(cls, data: dict) -> PolicyConfig:
        """Rebuild from ``to_dict`` output (e.g. a bundle's ``model_config``)."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown PolicyConfig fields {unknown}")
        return cls(**data)

    def to_dict(self) -> dict:
        """Plain JSON-able dict (the bundle's ``model_config``)."""
        return asdict(self)

    @property
    def n_tokens(self) -> int:
        """Sequence length the encoder sees: frames, events and the CLS token if pooled so."""
        return self.window + self.max_events + (1 if self.pooling == "cls" else 0)


PRESETS: dict[str, PolicyConfig] = {
    # Seed 000's configuration: ~1.8 M parameters, kept selectable and benchmarked.
    "paper": PolicyConfig(d_model=192, n_layers=4, n_heads=6, d_ff=768, dropout=0.1),
    # Chosen by measurement (see README / commands/train.py): the smallest encoder that
    # keeps the F1 targets, far under 1 ms p99 per query on one thread.
    "default": PolicyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, dropout=0.1),
    # One narrow layer: about half the default's ONNX nodes and batch-1 time. Benchmarked
    # beside the default in Exp 1 (bench/exp1.py) where per-query speed is the point.
    "fast": PolicyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, dropout=0.1),
}
"""Named window architectures; window/labels/events are filled from the data at train time.

``default`` is the window Transformer's name from before the streaming policy became the
shipped default; bundles record it, so it keeps the name.
"""

DEFAULT_PRESET = "streaming-restart"
"""The preset of the shipped default bundle, and what ``thinkmem train`` (on the synthetic
world) and the benchmarks that train a policy use unless told otherwise. It is a per-frame
preset (policy/training/train.py STREAMING_PRESETS)."""
