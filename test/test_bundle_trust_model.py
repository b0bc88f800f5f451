"""What a bundle's hash and signature cover is exactly what the robot runs.

Two gaps closed here. An ONNX model may keep tensor values in *external data* files,
which neither the manifest's sha256 nor the signature covers, and which ONNX Runtime opens
relative to the process's working directory: such a model is refused before ONNX Runtime
sees it. And the gate artefacts (values, memory-control probes, anticipation rules) are
parsed from the very bytes that were checked against the signed list, so a file swapped
after the check is never what gets loaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from thinkmem_ros.policy.anticipation_rules import (
    RULES_JSON,
    RULES_META,
    AnticipationRule,
    RuleSet,
)
from thinkmem_ros.policy.bundle import BundleError, load_bundle, read_manifest, write_bundle
from thinkmem_ros.policy.memctl_heads import MEMCTL_JSON, MEMCTL_NPZ, MemctlHeads, ProbeHead
from thinkmem_ros.policy.runtime import PolicyRuntime
from thinkmem_ros.policy.streaming_runtime import StreamingConfig, StreamingEngine
from thinkmem_ros.policy.value_table import VALUES_JSON, VALUES_NPZ, ValueTable
from thinkmem_ros.robot import thinking_gates
from thinkmem_ros.robot.thinking_gates import artefact_hashes, load_gate_artefacts

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.external_data_helper import (  # noqa: E402
    convert_model_to_external_data,
    set_external_data,
    write_external_data_tensors,
)

WEIGHTS = "weights.bin"
REFUSED = "external data files"


# -- defect 1: external data ------------------------------------------------------------
def _rewrite(source: Path, dest: Path, edit, keep_weights: bool) -> Path:
    """A bundle at ``dest`` whose model is ``source``'s after ``edit`` (manifest re-hashed).

    ``edit(model, scratch)`` moves tensors out into files under ``scratch``; with
    ``keep_weights`` those files sit next to ``policy.onnx``, as a real attacker's would.
    """
    model = onnx.load(str(source / "policy.onnx"))
    scratch = dest.with_name(dest.name + ".data")
    scratch.mkdir()
    edit(model, scratch)
    write_bundle(dest, model.SerializeToString(), read_manifest(source))
    if keep_weights:
        for item in scratch.iterdir():
            shutil.copy(item, dest / item.name)
    return dest


def _big_external(model, scratch: Path) -> None:
    """Initialisers of 1 KiB and more into one weights file (onnx's default threshold).

    Before the fix ONNX Runtime loaded this and ran whatever ``weights.bin`` held.
    """
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location=WEIGHTS,
                                   size_threshold=1024)
    write_external_data_tensors(model, str(scratch))


def _external_tensor(array: np.ndarray, name: str, scratch: Path) -> TensorProto:
    """A TensorProto whose values live in ``scratch/WEIGHTS``."""
    tensor = numpy_helper.from_array(array, name)
    raw = tensor.raw_data
    (scratch / WEIGHTS).write_bytes(raw)
    set_external_data(tensor, location=WEIGHTS, offset=0, length=len(raw))
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def _constant_node(model, scratch: Path) -> None:
    """An extra Constant node whose value attribute is external."""
    value = _external_tensor(np.ones(4, np.float32), "c_value", scratch)
    model.graph.node.append(helper.make_node("Constant", [], ["c_out"], value=value))


def _sparse_initialiser(model, scratch: Path) -> None:
    """A sparse initialiser whose values are external."""
    values = _external_tensor(np.ones(2, np.float32), "s_value", scratch)
    indices = numpy_helper.from_array(np.array([0, 3], np.int64), "s_index")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))


def _subgraph_initialiser(model, scratch: Path) -> None:
    """An If node whose branch holds an external initialiser (a subgraph, not the graph)."""
    inner = _external_tensor(np.ones(4, np.float32), "branch_w", scratch)
    out = helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, [4])
    then = helper.make_graph([helper.make_node("Identity", ["branch_w"], ["branch_out"])],
                             "then", [], [out], initializer=[inner])
    other = helper.make_graph([helper.make_node("Constant", [], ["branch_out"],
                                                value=numpy_helper.from_array(
                                                    np.zeros(4, np.float32)))],
                              "else", [], [out])
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "if_cond"))
    model.graph.node.append(helper.make_node("If", ["if_cond"], ["if_out"],
                                             then_branch=then, else_branch=other))


@pytest.mark.parametrize("keep_weights", [True, False], ids=["weights-present", "absent"])
@pytest.mark.parametrize("form", ["streaming", "window"])
def test_external_weights_are_refused_before_onnx_runtime(form, keep_weights, source_bundle,
                                                          window_bundle, tmp_path,
                                                          monkeypatch):
    """With the weights file beside the model (and the process inside the bundle, where
    ONNX Runtime would find it) the model used to load and run unhashed weights; without it,
    ONNX Runtime's own error came back. Either way it is now our one-line refusal."""
    source = source_bundle if form == "streaming" else window_bundle
    folder = _rewrite(source, tmp_path / "ext", _big_external, keep_weights)
    monkeypatch.chdir(folder)
    with pytest.raises(BundleError) as info:
        PolicyRuntime(folder)
    message = str(info.value)
    assert REFUSED in message and repr(WEIGHTS) in message, message
    assert "\n" not in message and str(folder / "policy.onnx") in message
    assert "ONNXRuntimeError" not in message  # refused before ONNX Runtime saw it


@pytest.mark.parametrize("edit", [_constant_node, _sparse_initialiser, _subgraph_initialiser],
                         ids=["constant-attribute", "sparse-initialiser", "subgraph"])
def test_external_tensors_anywhere_in_the_model_are_refused(edit, source_bundle, tmp_path,
                                                            monkeypatch):
    """Not only graph initialisers: attributes, sparse initialisers and subgraphs too."""
    folder = _rewrite(source_bundle, tmp_path / "ext", edit, keep_weights=True)
    monkeypatch.chdir(folder)
    with pytest.raises(BundleError, match=REFUSED):
        PolicyRuntime(folder)


def test_streaming_engine_refuses_external_weights_itself(source_bundle, tmp_path):
    """The per-frame engine reads weights from the bytes it is given: never from elsewhere."""
    folder = _rewrite(source_bundle, tmp_path / "ext", _big_external, keep_weights=True)
    model = (folder / "policy.onnx").read_bytes()
    config = StreamingConfig.from_dict(read_manifest(source_bundle).model_config)
    with pytest.raises(BundleError, match=REFUSED):
        StreamingEngine(model, config, session=None)


@pytest.mark.parametrize("form", ["streaming", "window"])
def test_a_self_contained_bundle_still_loads_and_runs(form, source_bundle, window_bundle):
    source = source_bundle if form == "streaming" else window_bundle
    runtime = PolicyRuntime(source)
    assert runtime.sha256 == load_bundle(source).manifest.sha256
    k, f = runtime.window, len(runtime.signals)
    probs = runtime.predict_one(np.zeros((k, f), np.float32)).probabilities
    assert probs.shape == (1, len(runtime.labels)) and np.isfinite(probs).all()


# -- defect 2: the artefact bytes checked are the bytes loaded ------------------------------
def _value_table(reward: float) -> ValueTable:
    table = ValueTable(["a", "b"], dim=4)
    s = table.assign(np.array([1.0, 0.0, 0.0, 0.0]))
    for _ in range(3):
        table.update(s, "a", reward)
    return table


def _heads(sign: float) -> MemctlHeads:
    return MemctlHeads(ProbeHead(sign * np.ones(4), 0.0), ProbeHead(sign * np.ones(4), 0.0))


def _rules(thinking: str) -> RuleSet:
    return RuleSet((AnticipationRule(("A", "B"), "C", thinking, (30.0,), 60.0),))


@pytest.fixture
def signed_and_forged(tmp_path):
    """(bundle folder with genuine artefacts, its signed list, folder of forged ones).

    The forgeries are self-consistent (each sidecar records its own npz's sha256), so only
    the signed list can tell them apart.
    """
    genuine, forged = tmp_path / "bundle", tmp_path / "forged"
    _value_table(1.0).save(genuine)
    _heads(1.0).save(genuine)
    _rules("consider:C").save(genuine)
    _value_table(-5.0).save(forged)
    _heads(-1.0).save(forged)
    _rules("consider:forged").save(forged)
    return genuine, artefact_hashes(genuine), forged


def _swap_right_after_hashing(monkeypatch, folder: Path, forged: Path) -> None:
    """Fault injection (a race made deterministic): once the gate has read both files of an
    artefact to hash them, the forged pair replaces them on disk, as a local attacker
    winning the race between the signature check and the load would."""
    real = thinking_gates.read_bundle_file
    pending = [{VALUES_NPZ, VALUES_JSON}, {MEMCTL_NPZ, MEMCTL_JSON}, {RULES_JSON, RULES_META}]
    seen: set[str] = set()

    def read_then_swap(path, *args, **kwargs):
        raw = real(path, *args, **kwargs)
        seen.add(Path(path).name)
        for group in [g for g in pending if g <= seen]:
            pending.remove(group)
            for name in group:
                shutil.copyfile(forged / name, folder / name)
        return raw

    monkeypatch.setattr(thinking_gates, "read_bundle_file", read_then_swap)


def test_artefacts_swapped_after_the_signature_check_are_not_loaded(signed_and_forged,
                                                                    monkeypatch):
    folder, listed, forged = signed_and_forged
    want_q, want_w = ValueTable.load(folder).q, MemctlHeads.load(folder).compress.weights
    _swap_right_after_hashing(monkeypatch, folder, forged)
    arts = load_gate_artefacts(folder, {"artefacts": listed}, embedding_dim=4)
    assert arts.errors == [], arts.errors
    np.testing.assert_array_equal(arts.table.q, want_q)
    np.testing.assert_array_equal(arts.heads.compress.weights, want_w)
    # the swap did happen: the files on disk now hold the forgeries
    assert (ValueTable.load(folder).q < 0).any()
    assert (MemctlHeads.load(folder).compress.weights < 0).all()


def test_rules_swapped_after_the_signature_check_are_not_loaded(signed_and_forged,
                                                                monkeypatch):
    """The rules decide which consider:C labels the robot adds and drops: before the fix
    the gate hashed rules.json and rules.meta.json, then RuleSet.load read them again and
    ran a self-consistent forgery swapped in between."""
    folder, listed, forged = signed_and_forged
    _swap_right_after_hashing(monkeypatch, folder, forged)
    arts = load_gate_artefacts(folder, {"artefacts": listed}, embedding_dim=4)
    assert arts.errors == [], arts.errors
    assert arts.rules == _rules("consider:C")
    assert RuleSet.load(folder).labels == ("consider:forged",)  # the swap did happen


def test_rules_parse_from_the_bytes_given_not_from_disk(signed_and_forged, tmp_path):
    folder, _, forged = signed_and_forged
    files = {name: (folder / name).read_bytes() for name in (RULES_JSON, RULES_META)}
    for name in files:
        shutil.copyfile(forged / name, folder / name)
    assert RuleSet.from_files(folder, files) == _rules("consider:C")
    assert RuleSet.from_files(tmp_path / "nowhere", files) == _rules("consider:C")


def test_forged_artefacts_in_place_before_the_check_are_refused(signed_and_forged):
    folder, listed, forged = signed_and_forged
    for name in (VALUES_NPZ, VALUES_JSON, MEMCTL_NPZ, MEMCTL_JSON, RULES_JSON, RULES_META):
        shutil.copyfile(forged / name, folder / name)
    arts = load_gate_artefacts(folder, {"artefacts": listed}, embedding_dim=4)
    assert arts.table is None and arts.heads is None and arts.rules is None
    assert len(arts.errors) == 3 and all("does not match the manifest" in e
                                         for e in arts.errors), arts.errors
