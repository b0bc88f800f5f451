"""The thinking policy: situation window -> which kinds of thinking the LLM should activate.

``config`` (no torch) holds the architecture presets; ``model``, ``train`` and ``export``
need torch and run offboard; ``runtime`` is the robot side (numpy + ONNX Runtime only).
Nothing is imported here so ``import thinkmem_ros.policy.runtime`` never pulls in torch.
"""
