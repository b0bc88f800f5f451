"""Window-relative shape input, warm start from pre-shape models, and the training-step floor."""

import copy

import numpy as np
import pytest
import torch

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.policy.config import PolicyConfig
from thinkmem_ros.policy.training.model import window_shape
from thinkmem_ros.policy.training.train import predict_proba, train_policy

K = 8
TINY = PolicyConfig(window=K, n_signals=7, n_labels=10, d_model=16, n_layers=1, n_heads=2,
                    d_ff=32, max_events=1, n_event_vocab=0, dropout=0.0)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    torch.set_num_threads(1)


def situations(n: int, rng: np.random.Generator) -> SituationSet:
    """Random raw-scale windows with dropouts and random labels."""
    signals = (rng.normal(size=(n, K, 7)) * 3 + 40).astype(np.float32)
    mask = (rng.random((n, K, 7)) > 0.2).astype(np.float32)
    labels = (rng.random((n, 10)) > 0.6).astype(np.float32)
    return SituationSet(signals * mask, labels, mask=mask, groups=np.arange(n) // 4)


def test_shape_ignores_level_and_scale_of_each_channel():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(5, K, 7)).astype(np.float32))
    mask = torch.from_numpy((rng.random((5, K, 7)) > 0.3).astype(np.float32))
    level = torch.from_numpy(rng.uniform(-20, 20, (5, 1, 7)).astype(np.float32))
    scale = torch.from_numpy(rng.uniform(3, 9, (5, 1, 7)).astype(np.float32))
    base = window_shape(x * mask, mask)
    shifted = window_shape((x + level) * mask, mask)
    torch.testing.assert_close(shifted, base, atol=1e-4, rtol=0)  # level: exact
    scaled = window_shape((x * scale + level) * mask, mask)
    # scale: up to the std floor SHAPE_EPS, which matters only for near-flat channels
    torch.testing.assert_close(scaled, base, atol=0.03, rtol=0)
    # It is an evolution, not a constant: observed entries vary, masked ones are 0.
    assert base[mask > 0].std() > 0.5
    assert torch.all(base[mask == 0] == 0)


def test_shape_excludes_masked_entries_and_survives_empty_channels():
    x = torch.arange(K, dtype=torch.float32).reshape(1, K, 1).repeat(1, 1, 7)
    mask = torch.ones_like(x)
    mask[0, :, 3] = 0.0  # a channel never observed in this window
    mask[0, 2, 0] = 0.0  # one dropout
    x = x.clone().requires_grad_(True)
    out = window_shape(x * mask, mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert torch.all(out[0, :, 3] == 0)
    poked = (x.detach() * mask).clone()
    poked[0, 2, 0] = 1e6  # a masked value must not move the statistics
    torch.testing.assert_close(window_shape(poked * mask, mask), out.detach())


def test_warm_start_from_a_model_without_shape_input_keeps_its_outputs():
    data = situations(64, np.random.default_rng(1))
    old = train_policy(data, TINY, epochs=1, batch_size=32, progress=False, seed=2)
    legacy = copy.deepcopy(old)
    with torch.no_grad():
        legacy.model.shape_in.weight.zero_()
        legacy.model.shape_in.bias.zero_()
    expected = predict_proba(legacy, data)
    del legacy.model.shape_in  # what a bundle trained before the shape input holds
    warm = train_policy(data, TINY, epochs=1, lr=1e-9, progress=False, init_from=legacy,
                        val_fraction=0.0)
    report = warm.history[0]["warm_start"]
    assert report["zeroed"] == ["shape_in.weight", "shape_in.bias"]
    np.testing.assert_allclose(predict_proba(warm, data), expected, atol=1e-5)
    # The shape input then learns: training moves it away from zero.
    learnt = train_policy(data, TINY, epochs=2, batch_size=16, lr=1e-2, progress=False,
                          init_from=legacy, val_fraction=0.0)
    assert learnt.model.shape_in.weight.abs().max() > 0


def test_min_steps_raises_the_epoch_count_and_holds_off_early_stopping():
    data = situations(64, np.random.default_rng(3))  # ~54 train rows: 2 steps per epoch
    run = train_policy(data, TINY, epochs=1, batch_size=32, patience=1, min_steps=12,
                       progress=False)
    epochs = [row["epoch"] for row in run.history if "epoch" in row]
    assert epochs[-1] == 6
    plain = train_policy(data, TINY, epochs=1, batch_size=32, progress=False)
    assert [row["epoch"] for row in plain.history if "epoch" in row] == [1]
    with pytest.raises(ValueError, match="min_steps"):
        train_policy(data, TINY, min_steps=-1, progress=False)


def test_lean_encoder_computes_what_the_stock_torch_encoder_computes():
    from torch import nn

    from thinkmem_ros.policy.training.encoder import Encoder

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, 0.0, activation="gelu", batch_first=True,
                                       norm_first=True)
    stock = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    lean = Encoder(16, 2, 32, 0.0, 2).eval()
    # Same parameter names, so bundles trained with the stock layers still warm-start.
    lean.load_state_dict(stock.state_dict())
    tokens = torch.randn(4, 9, 16)
    keep = (torch.rand(4, 9) > 0.3).float()
    keep[:, 0] = 1.0
    with torch.enable_grad():  # under no_grad the stock layer takes a fused fast path
        expected = stock(tokens, src_key_padding_mask=(1.0 - keep) * -1e4)
    torch.testing.assert_close(lean(tokens, keep), expected.detach(), atol=1e-5, rtol=0)
