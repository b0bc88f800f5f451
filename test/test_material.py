import numpy as np
import pytest

from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.consolidator.material import (
    filler_codes,
    knowledge_material,
    prefix_events,
    situations_from_events,
    with_labels,
)
from thinkmem_ros.core.vocabulary import DISCOVERED_PREFIX, SIGNALS
from thinkmem_ros.world.event_episodes import code_names

CODES = code_names(60)
RULES = [("E001", "E002", "E003"), ("E010", "E011", "E012"), ("E020", "E021", "E022")]


def _units(status="promoted"):
    return [KnowledgeUnit(pattern=r, relation="sequence3", constraints={},
                          thinking=f"{DISCOVERED_PREFIX}{r[-1]}", confidence=0.8, status=status)
            for r in RULES]


def test_shapes_labels_and_prefix_stops_before_consequence():
    data = knowledge_material(_units(), CODES, np.random.default_rng(0), positives_per_unit=10,
                              negatives_per_kind=3, max_events=12)
    assert data.label_names == tuple(f"consider:{r[-1]}" for r in RULES)
    n = 3 * (10 + 4 * 3)
    assert len(data) == n and data.events.shape == (n, 12)
    assert data.signals.shape == (n, 1, len(SIGNALS)) and not data.mask.any()
    assert data.labels.sum() == 30 and (data.labels.sum(1) <= 1).all()
    vocab = ("<pad>",) + data.event_vocabulary
    for row, label in zip(data.events, data.labels):
        names = [vocab[i] for i in row if i]
        assert len(names) == 12
        if label.any():
            rule = RULES[int(label.argmax())]
            ia, ib = names.index(rule[0]), names.index(rule[1])
            assert ia < ib and rule[2] not in names  # fires BEFORE C happens
        else:  # a negative never holds an antecedent in order
            for a, b, _ in RULES:
                assert not (a in names and b in names and names.index(a) < names.index(b))


def test_only_promoted_units_are_internalised():
    units = _units()
    units[1].status = "demoted"
    data = knowledge_material(units, CODES, np.random.default_rng(0), positives_per_unit=4,
                              negatives_per_kind=1)
    assert data.label_names == ("consider:E003", "consider:E022")
    with pytest.raises(ValueError, match="no promoted"):
        knowledge_material(_units("candidate"), CODES, np.random.default_rng(0))


def test_with_labels_aligns_columns_and_unknown_events_rejected():
    data = knowledge_material(_units(), CODES, np.random.default_rng(1), positives_per_unit=4,
                              negatives_per_kind=1)
    wide = with_labels(data, ("hazard",) + data.label_names)
    assert wide.labels[:, 0].sum() == 0
    assert np.array_equal(wide.labels[:, 1:], data.labels)
    with pytest.raises(ValueError, match="vocabulary"):
        situations_from_events([["NOPE"]], np.zeros((1, 1), np.float32), ("x",), CODES, 4)


@pytest.mark.slow
def test_policy_trained_on_material_fires_consider_c_on_held_out_prefixes():
    torch = pytest.importorskip("torch")
    train = pytest.importorskip("thinkmem_ros.policy.training.train")
    torch.set_num_threads(1)
    units = _units()
    data = knowledge_material(units, CODES, np.random.default_rng(0), positives_per_unit=48,
                              negatives_per_kind=8)
    trained = train.train_policy(data, "default", seed=0, epochs=12, progress=False)
    rng = np.random.default_rng(99)
    filler = filler_codes(CODES, units)
    histories, targets = [], []
    for a, b, c in RULES:
        for _ in range(10):
            histories.append(prefix_events([a, b], filler, 16, rng))
            targets.append(f"consider:{c}")
    test = situations_from_events(histories, np.zeros((30, 3), np.float32), data.label_names,
                                  CODES, 16)
    picks = train.predict_proba(trained, test).argmax(1)
    accuracy = np.mean([data.label_names[i] == t for i, t in zip(picks, targets)])
    assert accuracy >= 0.9  # chance is 1/3


def test_one_code_antecedent_negatives_never_hold_the_antecedent():
    unit = KnowledgeUnit(pattern=("E001", "E005"), relation="sequence2", constraints={},
                         thinking=f"{DISCOVERED_PREFIX}E005", confidence=0.8,
                         status="promoted")
    data = knowledge_material([unit], CODES, np.random.default_rng(1), positives_per_unit=8,
                              negatives_per_kind=5, max_events=10)
    assert len(data) == 8 + 5  # filler-only negatives: "A alone" would be a positive
    vocab = ("<pad>",) + data.event_vocabulary
    for row, label in zip(data.events, data.labels):
        names = [vocab[i] for i in row if i]
        assert ("E001" in names) == bool(label[0])
