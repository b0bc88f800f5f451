"""Direct material from Experience.required, schema v1 compatibility and rule labelling."""

import msgpack
import numpy as np

from thinkmem_ros.consolidator.direct import direct_material, heldout_mask, split_heldout
from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.consolidator.retrain import apply_rules, grow, rule_fires
from thinkmem_ros.link.experience import Experience, decode_experience, encode_experience


def rec(i, required, events=(), shape=(4, 3), episode=None):
    return Experience(robot_id="r1", episode_id=episode or f"ep{i}", stamp=float(i),
                      window=np.full(shape, i, np.float32), labels=["trend"],
                      probabilities=[0.5], bundle_version=1, events=list(events),
                      required=required, seq=i)


def test_required_roundtrips_and_v1_records_still_decode():
    back = decode_experience(encode_experience(rec(1, ["trend", "consider:E1"])))
    assert back.required == ["trend", "consider:E1"]
    old = rec(2, None).to_wire()
    del old["required"], old["signal_set"]
    old["v"] = 1
    legacy = decode_experience(msgpack.packb(old, use_bin_type=True))
    assert legacy.required is None and legacy.seq == 2
    old["required"] = ["trend"]  # a v1 record cannot carry fields v1 did not have
    try:
        decode_experience(msgpack.packb(old, use_bin_type=True))
    except ValueError as exc:
        assert "unknown fields" in str(exc)
    else:
        raise AssertionError("v1 record with 'required' was accepted")


def test_direct_material_uses_only_records_that_say_what_was_needed():
    records = [rec(0, ["trend"], ["A", "X", "B"]), rec(1, None), rec(2, []),
               rec(3, ["trend"], shape=(5, 3)), rec(4, ["unknown_label"]),
               rec(5, ["hazard", "inspect_wheel"])]
    material = direct_material(records, label_names=("trend", "hazard"),
                               signal_names=("a", "b", "c"), window=4,
                               event_vocabulary=("A", "B"), max_events=3)
    data = material.data
    # a label outside the set is left out of its row; the row's other labels stay (the
    # hazard positive beside a judge's free-form word was lost with the whole record)
    assert len(data) == 4 and data.labels.tolist() == [[1, 0], [0, 0], [0, 0], [0, 1]]
    assert data.events[0].tolist() == [0, 1, 2]  # unknown X dropped, right-aligned
    assert material.skipped == {"no_required": 1, "shape": 1}
    assert material.labels_left_out == 2


def test_heldout_split_is_by_first_stamp_not_by_id():
    keys = [("r1", f"boot{i}-ep{i}") for i in range(8)] + [("r2", "x"), ("r2", "y")]
    stamps = [float(s) for s in (7, 6, 5, 4, 3, 2, 1, 0, 1, 0)]
    held = heldout_mask(keys, stamps, 0.25)
    # r1 ranked by stamp: ordinals 3 and 7 are stamps 3 and 7 (keys 4 and 0); r2 too few
    assert np.flatnonzero(held).tolist() == [0, 4]
    renamed = [(r, e.replace("boot", "reboot")) for r, e in keys]  # ids change, store not
    assert heldout_mask(renamed, stamps, 0.25).tolist() == held.tolist()
    many = heldout_mask([("r1", f"e{i}") for i in range(400)], list(range(400)), 0.25)
    assert many.sum() == 100
    records = [rec(i, ["trend"], episode=f"ep{i // 3}") for i in range(60)]
    material = direct_material(records, label_names=("trend",), signal_names=("a", "b", "c"),
                               window=4, event_vocabulary=(), max_events=2)
    train, test = split_heldout(material, 0.3)
    assert len(train) + len(test) == 60 and len(test) > 0
    assert not set(train.groups) & set(test.groups)


def test_rules_label_prefixes_before_the_consequence_only():
    unit = KnowledgeUnit(pattern=("A", "B", "C"), relation="sequence3", constraints={},
                         thinking="consider:C", confidence=0.9, status="promoted")
    assert rule_fires(["x", "A", "y", "B"], unit)
    assert not rule_fires(["B", "A"], unit)
    assert not rule_fires(["A", "B", "C"], unit)  # C already happened
    assert grow(("a", "b"), ["b", "c", "a", "d"]) == ("a", "b", "c", "d")
    records = [rec(0, [], ["A", "B"]), rec(1, [], ["B", "A"])]
    material = direct_material(records, label_names=("trend", "consider:C"),
                               signal_names=("a", "b", "c"), window=4,
                               event_vocabulary=("A", "B", "C"), max_events=4)
    labelled = apply_rules(material.data, [unit])
    assert labelled.labels[:, 1].tolist() == [1.0, 0.0]
