"""ONNX graphs that load and then fail or lie at run time, for fault probes and tests.

Why they are built rather than stored: each must match the inputs and outputs of the
bundle it replaces the graph of (window, signals, labels, embedding width), and ONNX
Runtime accepts all of them at session creation; only the node's load-time test inference
can tell (``robot.hotswap.load_policy``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MODES = ("runtime_fail", "prob_5", "emb_nan")
"""A Reshape no input can satisfy; probabilities of 5.5; a NaN embedding."""


def hostile_graph(manifest, mode: str) -> bytes:
    """A window graph with the manifest's inputs and outputs that fails or lies (``MODES``)."""
    import onnx  # offboard (requirements/train.txt): the robot never builds graphs
    from onnx import TensorProto
    from onnx import helper as oh
    from onnx import numpy_helper as nh

    k, f, n_labels = manifest.window, len(manifest.signals), len(manifest.labels)
    d = manifest.model_config.get("d_model", 16)
    rng = np.random.default_rng(0)
    inits = [nh.from_array((rng.normal(size=(k * f, n_labels)) * 0.01).astype(np.float32),
                           "w1"),
             nh.from_array((rng.normal(size=(k * f, d)) * 0.01).astype(np.float32), "w2")]
    nodes = [oh.make_node("Flatten", ["signals"], ["flat"], axis=1),
             oh.make_node("MatMul", ["flat", "w1"], ["logit"]),
             oh.make_node("Sigmoid", ["logit"], ["p"]),
             oh.make_node("MatMul", ["flat", "w2"], ["e0"])]
    nodes += _tail(mode, inits, nh)
    info = oh.make_tensor_value_info
    graph = oh.make_graph(nodes, "hostile", [
        info("signals", TensorProto.FLOAT, ["batch", k, f]),
        info("mask", TensorProto.FLOAT, ["batch", k, f]),
        info("events", TensorProto.INT64, ["batch", manifest.max_events])], [
        info("probabilities", TensorProto.FLOAT, ["batch", n_labels]),
        info("embedding", TensorProto.FLOAT, ["batch", d])], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _tail(mode: str, inits: list, nh) -> list:
    """The nodes that make the outputs, failing or lying as ``mode`` says."""
    from onnx import helper as oh

    extra = {"runtime_fail": np.array([-1, 7, 11], np.int64),
             "prob_5": np.array(5.0, np.float32), "emb_nan": np.array(np.nan, np.float32)}
    inits.append(nh.from_array(extra[mode], "x"))
    if mode == "runtime_fail":  # a Reshape that no input can satisfy
        return [oh.make_node("Reshape", ["flat", "x"], ["r"]),
                oh.make_node("ReduceSum", ["r"], ["rs"], keepdims=0),
                oh.make_node("Add", ["e0", "rs"], ["embedding"]),
                oh.make_node("Identity", ["p"], ["probabilities"])]
    if mode == "prob_5":
        return [oh.make_node("Add", ["p", "x"], ["probabilities"]),
                oh.make_node("Identity", ["e0"], ["embedding"])]
    return [oh.make_node("Add", ["e0", "x"], ["embedding"]),
            oh.make_node("Identity", ["p"], ["probabilities"])]


def hostile_bundle(source: Path, folder: Path, mode: str) -> Path:
    """A copy of the window bundle ``source`` whose graph is ``hostile_graph(mode)``."""
    from thinkmem_ros.policy.bundle import load_bundle, write_bundle

    manifest = load_bundle(source).manifest
    write_bundle(folder, hostile_graph(manifest, mode), manifest)
    return folder
