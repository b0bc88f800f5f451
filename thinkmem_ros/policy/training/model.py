"""The thinking policy network: a small Transformer encoder over a situation window.

No I/O here (training lives in ``train.py``, export in ``export.py``). The per-signal
normalisation is a pair of buffers inside the graph, so the exported ONNX model takes raw
sensor values and the robot side never re-implements it.
"""

from __future__ import annotations

import torch
from torch import nn

from thinkmem_ros.policy.config import PolicyConfig
from thinkmem_ros.policy.training.encoder import Encoder

SHAPE_EPS = 0.05
"""Floor of the window std in globally normalised units (~5% of the training spread).

Below it a channel counts as flat: its shape is scaled down instead of blowing sensor noise
up to unit variance, and sqrt never sees 0 (whose gradient is infinite)."""


def window_shape(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-channel (x - window mean) / window std over observed frames only, (B, K, F).

    Masked entries are excluded from the statistics and are 0 in the output; a fully
    masked channel gives 0 everywhere (count clamped to 1, std floored), never NaN.
    """
    count = mask.sum(1, keepdim=True).clamp_min(1.0)  # (B, 1, F)
    mean = (x * mask).sum(1, keepdim=True) / count  # (B, 1, F)
    centred = (x - mean) * mask  # (B, K, F)
    var = (centred * centred).sum(1, keepdim=True) / count  # (B, 1, F)
    return centred / torch.sqrt(var + SHAPE_EPS * SHAPE_EPS)  # (B, K, F)


class ThinkingPolicy(nn.Module):
    """Situation (signals, mask, events) -> per-thinking probabilities and a pooled embedding.

    Each frame becomes one token ``Linear([normalised * mask, mask]) + Linear(shape)`` plus
    a learned position, so a missing value is distinguishable from a zero reading.
    ``shape`` is the window-relative evolution of each channel (``window_shape``): a
    situation is an evolution, and the same rise at another operating level or scale
    (an unseen component) must read the same. The globally normalised value stays beside
    it, so absolute levels (hazard thresholds) are still visible. Each event id
    becomes a token of its own (embedding + event position + a type embedding that tells
    events from frames). Padding events (id 0) are masked out of attention and pooling;
    frame tokens are never masked, so attention always has keys and no row turns to NaN
    even when every event is padding.
    """

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.register_buffer("signal_mean", torch.zeros(c.n_signals))
        self.register_buffer("signal_std", torch.ones(c.n_signals))
        self.frame_in = nn.Linear(2 * c.n_signals, c.d_model)
        # A separate layer, not a wider frame_in, so warm starts from bundles trained before
        # it existed copy frame_in unchanged (warm_start zeroes shape_in for them).
        self.shape_in = nn.Linear(c.n_signals, c.d_model)
        self.frame_pos = nn.Parameter(torch.zeros(c.window, c.d_model))
        self.event_embed = nn.Embedding(c.n_event_vocab + 1, c.d_model, padding_idx=0)
        self.event_pos = nn.Parameter(torch.zeros(c.max_events, c.d_model))
        self.type_embed = nn.Parameter(torch.zeros(2, c.d_model))  # 0 = frame, 1 = event
        self.cls = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.pooling == "cls" else None
        self.encoder = Encoder(c.d_model, c.n_heads, c.d_ff, c.dropout, c.n_layers)
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.n_labels)
        self._init_weights()

    def _init_weights(self) -> None:
        for p in (self.frame_pos, self.event_pos, self.type_embed):
            nn.init.normal_(p, std=0.02)
        if self.cls is not None:
            nn.init.normal_(self.cls, std=0.02)
        nn.init.normal_(self.event_embed.weight, std=0.02)
        with torch.no_grad():
            self.event_embed.weight[0].zero_()

    def set_normalisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Install per-signal statistics from training data (std floored to avoid /0)."""
        self.signal_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.signal_std.copy_(torch.as_tensor(std, dtype=torch.float32).clamp_min(1e-6))

    def forward(self, signals: torch.Tensor, mask: torch.Tensor,
                events: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (probabilities (B, L), embedding (B, d)) for raw signals and their mask."""
        logits, embedding = self.logits(signals, mask, events)
        return torch.sigmoid(logits), embedding

    def logits(self, signals: torch.Tensor, mask: torch.Tensor,
               events: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-sigmoid scores (B, L) and the pooled embedding (B, d); training uses these."""
        c = self.config
        x = (signals - self.signal_mean) / self.signal_std * mask  # (B, K, F)
        frames = self.frame_in(torch.cat([x, mask], dim=-1))  # (B, K, d)
        frames = frames + self.shape_in(window_shape(x, mask))  # (B, K, d)
        frames = frames + self.frame_pos + self.type_embed[0]  # (B, K, d)
        ev = self.event_embed(events) + self.event_pos + self.type_embed[1]  # (B, M, d)
        tokens = torch.cat([frames, ev], dim=1)  # (B, K+M, d)
        real_event = (events > 0).to(signals.dtype)  # (B, M)
        keep = torch.cat([torch.ones_like(signals[:, :, 0]), real_event], dim=1)  # (B, K+M)
        if self.cls is not None:
            cls = self.cls.expand(signals.shape[0], -1, -1)  # (B, 1, d)
            tokens = torch.cat([cls, tokens], dim=1)  # (B, 1+K+M, d)
            keep = torch.cat([torch.ones_like(keep[:, :1]), keep], dim=1)  # (B, 1+K+M)
        hidden = self.encoder(tokens, keep)  # (B, T, d)
        hidden = self.norm(hidden)  # (B, T, d)
        if c.pooling == "cls":
            embedding = hidden[:, 0]  # (B, d)
        else:
            weights = keep.unsqueeze(-1)  # (B, T, 1)
            embedding = (hidden * weights).sum(1) / weights.sum(1)  # (B, d)
        return self.head(embedding), embedding  # (B, L), (B, d)


class LogitsOnly(nn.Module):
    """``policy.logits`` as a module's forward (scores only).

    Torch DDP synchronises gradients through the forward of the module it wraps; training
    calls ``logits``, not ``forward``, so a data-parallel loop wraps this instead.
    """

    def __init__(self, policy: ThinkingPolicy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, signals: torch.Tensor, mask: torch.Tensor,
                events: torch.Tensor) -> torch.Tensor:
        """Pre-sigmoid scores (B, L)."""
        return self.policy.logits(signals, mask, events)[0]
