"""PolicyConfig validation and presets (no torch needed)."""

import pytest

from thinkmem_ros.policy.config import PRESETS, PolicyConfig


def test_paper_preset_is_the_seed_configuration():
    paper = PRESETS["paper"]
    assert (paper.n_layers, paper.d_model, paper.n_heads, paper.d_ff, paper.dropout) == \
        (4, 192, 6, 768, 0.1)


def test_from_preset_overrides_data_sizes_and_keeps_architecture():
    config = PolicyConfig.from_preset("default", window=16, n_labels=12, max_events=4)
    assert (config.window, config.n_labels, config.max_events) == (16, 12, 4)
    assert config.d_model == PRESETS["default"].d_model
    assert PolicyConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("field, value, words", [
    ("window", 0, "window"),
    ("n_labels", -1, "n_labels"),
    ("d_model", 2.5, "d_model"),
    ("n_heads", True, "n_heads"),
    ("dropout", 1.0, "dropout"),
    ("pooling", "max", "pooling"),
    ("n_event_vocab", -2, "n_event_vocab"),
])
def test_bad_values_name_the_field_and_value(field, value, words):
    with pytest.raises(ValueError, match=words) as info:
        PolicyConfig(**{field: value})
    assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match="d_model=66 must be divisible by n_heads=4"):
        PolicyConfig(d_model=66, n_heads=4)


def test_unknown_preset_and_unknown_field():
    with pytest.raises(ValueError, match="unknown policy preset 'huge'"):
        PolicyConfig.from_preset("huge")
    with pytest.raises(ValueError, match="unknown PolicyConfig fields \\['depth'\\]"):
        PolicyConfig.from_preset("default", depth=3)
