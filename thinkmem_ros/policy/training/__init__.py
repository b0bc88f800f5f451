"""The torch half of the policy: model, training loop and ONNX export (offboard only).

Nothing outside training, the consolidator and the benchmarks imports this package; the
robot runs the exported ONNX bundle through ``policy.runtime`` without torch.
"""
