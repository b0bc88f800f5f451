"""The streaming thinking policy: one GRU update per frame, trained on the same recurrence.

Why a GRU and not a sliding-window Transformer with cached keys/values: per frame the GRU
costs ~3*H*(3F+H) multiply-adds with no cache to shift, and measured on one core its
compiled tick is a few microseconds, where the cached 2-layer Transformer tick was ~19 us.
The order of events inside a window (rising vs falling, order-only classes) is what a
recurrence reads naturally.

Training and inference compute the same thing. ``step`` is the per-frame update that is
exported to ONNX (with explicit state inputs and outputs) and re-implemented by the robot's
compiled kernel; ``logits`` runs that same update over a (B, K, F) window from the reset
state and scores the last frame, which is how every training situation is seen. The only
difference is that training calls ``torch.nn.GRU`` on the whole window at once (fused, fast)
where ``step`` spells the identical GRU cell out; ``test_streaming_policy`` checks they agree.

Per frame, with observed-flag ``o = mask > 0``:

* ``xn = (x - mean) / std * mask`` (global normalisation, as the window policy);
* running level and spread per channel (an exponential moving mean/variance with factor
  ``ema_alpha``, started from the first observed value, frozen while a channel is missing);
* ``shape = (xn - mu) / sqrt(var + eps^2) * o``: the frame relative to the channel's recent
  level, so the same rise at another operating level or scale (an unseen component) reads
  the same; the window policy's ``window_shape`` plays this role;
* per tap ``d`` in ``taps``: the change ``(xn - xn[t - d]) * o * o[t - d]`` and ``o[t - d]``,
  read from a ring of the last ``max(taps)`` frames that is part of the state (zeros, i.e.
  unobserved, after a reset);
* ``h = GRU([xn, mask, shape, changes...], h)``;
* the last ``max_events`` event ids (oldest first, 0 = padding; the same register as the
  window policy's ``events`` input) are averaged as embeddings plus slot positions;
* ``embedding = h + events``, ``logits = head(relu(mix(embedding)))``.
"""

from __future__ import annotations

import torch
from torch import nn

from thinkmem_ros.policy.streaming_runtime import SHAPE_EPS, StreamingConfig

STATE_NAMES = ("h", "mu", "var", "seen", "ring", "ring_mask")
"""Names of the explicit state tensors, in the order the ONNX step takes and returns them."""



class StreamingPolicy(nn.Module):
    """Frame-by-frame thinking policy with an explicit recurrent state."""

    def __init__(self, config: StreamingConfig) -> None:
        super().__init__()
        self.config = c = config
        f, h = c.n_signals, c.hidden
        self.register_buffer("signal_mean", torch.zeros(f))
        self.register_buffer("signal_std", torch.ones(f))
        self.gru = nn.GRU(c.n_inputs, h, batch_first=True)
        self.event_embed = nn.Embedding(c.n_event_vocab + 1, h, padding_idx=0)
        self.event_pos = nn.Parameter(torch.zeros(c.max_events, h))
        self.mix = nn.Linear(h, h)
        self.head = nn.Linear(h, c.n_labels)
        nn.init.normal_(self.event_pos, std=0.02)
        nn.init.normal_(self.event_embed.weight, std=0.02)
        with torch.no_grad():
            self.event_embed.weight[0].zero_()

    def set_normalisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Install per-signal statistics from training data (std floored to avoid /0)."""
        self.signal_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.signal_std.copy_(torch.as_tensor(std, dtype=torch.float32).clamp_min(1e-6))

    # -- pieces shared by the window and the step forms -------------------------------------
    def _normalise(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (x - self.signal_mean) / self.signal_std * mask

    def _ema(self, xn: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, var: torch.Tensor,
             seen: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One update of the running level/spread; returns (shape, mu, var, seen)."""
        a = self.config.ema_alpha
        o = (mask > 0).to(xn.dtype)
        d = xn - mu
        mu_run = mu + a * d
        var_run = (1.0 - a) * (var + a * d * d)
        mu_new = o * (seen * mu_run + (1.0 - seen) * xn) + (1.0 - o) * mu
        var_new = o * seen * var_run + (1.0 - o * seen) * var * (1.0 - o)
        seen_new = torch.maximum(seen, o)
        shape = (xn - mu_new) / torch.sqrt(var_new + SHAPE_EPS * SHAPE_EPS) * o
        return shape, mu_new, var_new, seen_new

    def _events(self, events: torch.Tensor) -> torch.Tensor:
        real = (events > 0).to(self.event_pos.dtype)  # (B, M)
        summed = ((self.event_embed(events) + self.event_pos) * real.unsqueeze(-1)).sum(1)
        return summed / real.sum(1, keepdim=True).clamp_min(1.0)  # (B, H)

    def _readout(self, h: torch.Tensor, events: torch.Tensor) -> tuple[torch.Tensor, ...]:
        embedding = h + self._events(events)  # (B, H)
        return self.head(torch.relu(self.mix(embedding))), embedding

    # -- training form ----------------------------------------------------------------------
    def features(self, signals: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """GRU inputs (B, K, 3F) for a window replayed from the reset state."""
        xn = self._normalise(signals, mask)  # (B, K, F)
        b, k, f = xn.shape
        mu = xn.new_zeros(b, f)
        var = xn.new_zeros(b, f)
        seen = xn.new_zeros(b, f)
        shapes = []
        for t in range(k):
            shape, mu, var, seen = self._ema(xn[:, t], mask[:, t], mu, var, seen)
            shapes.append(shape)
        o = (mask > 0).to(xn.dtype)
        parts = [xn, mask, torch.stack(shapes, 1)]
        for d in self.config.taps:  # the frame d steps back; unobserved before the window
            back_x = torch.nn.functional.pad(xn, (0, 0, d, 0))[:, :k]  # (B, K, F)
            back_o = torch.nn.functional.pad(o, (0, 0, d, 0))[:, :k]
            parts += [(xn - back_x) * o * back_o, back_o]
        return torch.cat(parts, dim=-1)  # (B, K, n_inputs)

    def logits(self, signals: torch.Tensor, mask: torch.Tensor,
               events: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores (B, L) and embedding (B, H) at a window's last frame, state reset before it.

        With ``config.restart`` = P, training cuts each batch's windows to their newest
        frames, a random number in [P // 2, K]: the robot answers from a state restarted
        between P // 2 and P frames ago (``StreamingConfig``), so that is what it learns on.
        The labels and the event register stay those of the last frame.
        """
        k = signals.shape[1]
        least = self.config.restart // 2
        if self.training and least and k > least:
            keep = int(torch.randint(least, k + 1, (1,)))
            signals, mask = signals[:, k - keep:], mask[:, k - keep:]
        _, h = self.gru(self.features(signals, mask))  # h: (1, B, H)
        return self._readout(h[0], events)

    # -- the per-frame update (exported) ----------------------------------------------------
    def forward(self, frame: torch.Tensor, mask: torch.Tensor, events: torch.Tensor,
                h: torch.Tensor, mu: torch.Tensor, var: torch.Tensor, seen: torch.Tensor,
                ring: torch.Tensor, ring_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One frame: (probabilities, embedding, *new state) from the previous state.

        ``ring``/``ring_mask`` (B, R, F) hold the last R normalised frames and their observed
        flags, oldest first.
        """
        xn = self._normalise(frame, mask)  # (B, F)
        shape, mu, var, seen = self._ema(xn, mask, mu, var, seen)
        o = (mask > 0).to(xn.dtype)
        r = ring.shape[1]
        parts = [xn, mask, shape]
        for d in self.config.taps:
            back_x, back_o = ring[:, r - d], ring_mask[:, r - d]  # (B, F)
            parts += [(xn - back_x) * o * back_o, back_o]
        u = torch.cat(parts, dim=-1)  # (B, n_inputs)
        ring = torch.cat([ring[:, 1:], xn.unsqueeze(1)], dim=1)  # (B, R, F)
        ring_mask = torch.cat([ring_mask[:, 1:], o.unsqueeze(1)], dim=1)
        gi = u @ self.gru.weight_ih_l0.t() + self.gru.bias_ih_l0  # (B, 3H)
        gh = h @ self.gru.weight_hh_l0.t() + self.gru.bias_hh_l0  # (B, 3H)
        size = self.config.hidden
        r = torch.sigmoid(gi[:, :size] + gh[:, :size])
        z = torch.sigmoid(gi[:, size:2 * size] + gh[:, size:2 * size])
        n = torch.tanh(gi[:, 2 * size:] + r * gh[:, 2 * size:])
        h = (1.0 - z) * n + z * h
        logits, embedding = self._readout(h, events)
        return torch.sigmoid(logits), embedding, h, mu, var, seen, ring, ring_mask
