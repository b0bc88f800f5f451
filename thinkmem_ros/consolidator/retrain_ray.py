"""Retraining with Ray Train: the anchored fine-tune as torch DDP over Ray workers.

The round's material, warm start and update scales are built once here
(``retrain.finetune_setup``) and handed to ``workers`` Ray Train workers; each runs the same
epochs (``retrain.finetune_loop``) on its share of every batch, with its model wrapped by
``ray.train.torch.prepare_model`` (torch ``DistributedDataParallel`` over gloo), so the
gradient each step applies is the whole batch's. Worker 0 reports the best state as a Ray
Train checkpoint; thresholds are tuned here on the validation rows as in one process.
Validation runs whole on every worker, so early stopping agrees across them. On one
machine this buys nothing on a policy this small (two workers on two cores contend with
the driver); it is what lets retraining follow the data onto a cluster.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from thinkmem_ros.consolidator.engine import EngineError
from thinkmem_ros.consolidator.retrain import (
    Material,
    RetrainConfig,
    finetune_loop,
    finetune_result,
    finetune_setup,
    finish_retrained,
    grown_config,
    running_probabilities,
)
from thinkmem_ros.policy.bundle import Bundle

STATE_FILE = "finetune.pt"


def _worker_loop(conf: dict) -> None:
    """One Ray Train worker: the shared epochs on its share, worker 0 checkpoints."""
    import torch
    from ray import train
    from ray.train.torch import prepare_model

    torch.set_num_threads(conf["threads"])
    context = train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    state, history, best = finetune_loop(conf["setup"], conf["cfg"], rank, world,
                                         wrap=prepare_model)
    if rank == 0:
        with tempfile.TemporaryDirectory() as folder:
            torch.save({"state": state, "history": history, "best": best},
                       Path(folder) / STATE_FILE)
            train.report({"epochs": len(history) - 1, "workers": world},
                         checkpoint=train.Checkpoint.from_directory(folder))
    else:
        train.report({"epochs": len(history) - 1, "workers": world})


def retrain_on_ray(material: Material, current: Bundle, cfg: RetrainConfig,
                   workers: int = 2, storage: Path | str | None = None):
    """``retrain.retrain`` as a Ray Train run; returns a ``TrainedPolicy``.

    Joins the Ray instance this process already uses (``engine.RayEngine``) or starts a
    local one. ``storage`` holds Ray Train's run folder (default: a temporary folder).
    """
    try:
        import ray
        import torch
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
    except ImportError:
        raise EngineError("retraining on Ray needs Ray Train: pip install "
                          "'ray[train]==2.60.0'") from None
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    config = grown_config(material, current)
    teacher = running_probabilities(current, material.train) if cfg.distill > 0 else None
    setup = finetune_setup(material.train, config, current, cfg, teacher)
    with tempfile.TemporaryDirectory() as scratch:
        trainer = TorchTrainer(
            _worker_loop,
            train_loop_config={"setup": setup, "cfg": cfg, "threads": cfg.threads},
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=False,
                                         resources_per_worker={"CPU": 1}),
            run_config=RunConfig(name="thinkmem-retrain",
                                 storage_path=str(storage or scratch)))
        result = trainer.fit()
        if result.checkpoint is None:
            raise RuntimeError(f"Ray Train run ended without a checkpoint: {result.error}")
        with result.checkpoint.as_directory() as folder:
            payload = torch.load(Path(folder) / STATE_FILE, weights_only=False)
    trained = finetune_result(setup, cfg, payload["state"], payload["history"],
                              payload["best"])
    trained.history[0]["ray_train_workers"] = workers
    return finish_retrained(trained, material, current, cfg)
