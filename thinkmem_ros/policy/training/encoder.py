"""A pre-norm Transformer encoder written for a small, fast ONNX graph.

Numerically the same as ``nn.TransformerEncoder`` of pre-norm GELU
``nn.TransformerEncoderLayer``s (a test loads one's weights into the other), with the same
parameter names, so bundles trained with the stock layers still warm-start. Why not the
stock layers: their TorchScript export computes every reshape from the runtime batch size
(Shape/Gather/Concat chains) and splits attention into many small ops; at batch 1 ONNX
Runtime's per-node overhead then dominates the policy's latency (490 nodes for 2 layers).
Here every reshape uses -1 for the batch and constants for the rest.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head self-attention with a packed in-projection (nn.MultiheadAttention names)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Attend over (B, T, d) tokens; ``bias`` (B, 1, 1, T) is added to the scores."""
        t, d = x.shape[1], x.shape[2]  # constants for a fixed config
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)  # (B, T, 3d)
        qkv = qkv.reshape(-1, t, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (B, H, T, dh) each
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.d_head))
        weights = self.dropout(torch.softmax(scores + bias, dim=-1))  # (B, H, T, T)
        y = torch.matmul(weights, v).transpose(1, 2).reshape(-1, t, d)  # (B, T, d)
        return self.out_proj(y)


class EncoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then x + ff(norm2(x)) with a GELU."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = SelfAttention(d_model, n_heads, dropout)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> (B, T, d)."""
        x = x + self.dropout1(self.self_attn(self.norm1(x), bias))
        ff = self.linear2(self.dropout(F.gelu(self.linear1(self.norm2(x)))))
        return x + self.dropout2(ff)


class Encoder(nn.Module):
    """A stack of ``EncoderLayer``; padding keys are masked by an additive -1e4 bias."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 n_layers: int) -> None:
        super().__init__()
        # Like nn.TransformerEncoder: one layer initialised, then copied, so a seed gives
        # the very weights the stock encoder gave (and trained bundles stay reproducible).
        first = EncoderLayer(d_model, n_heads, d_ff, dropout)
        self.layers = nn.ModuleList([first] + [copy.deepcopy(first)
                                               for _ in range(n_layers - 1)])

    def forward(self, tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Encode (B, T, d) tokens; ``keep`` (B, T) is 1 for real tokens, 0 for padding."""
        # Additive float bias (not bool): exports cleanly, padding keys get ~zero weight.
        bias = ((1.0 - keep) * -1e4).unsqueeze(1).unsqueeze(1)  # (B, 1, 1, T)
        for layer in self.layers:
            tokens = layer(tokens, bias)
        return tokens
