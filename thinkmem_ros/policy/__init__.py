"""The thinking policy: situation window -> which kinds of thinking the LLM should activate.

Without torch (robot side and offboard): ``config`` (architecture presets), ``bundle``
(the shipped model folder and its manifest), ``runtime`` (ONNX Runtime inference),
``value_table`` and ``memctl_heads`` (the learned artefacts shipped beside the model).
With torch, offboard only: ``training`` (model, training loop, export). Nothing is imported
here so ``import thinkmem_ros.policy.runtime`` never pulls in torch.
"""
