"""The main job: stream -> (bag -> thinking_node ->) activations -> score, plot, summary.

``run_demo(DemoConfig(...))`` runs the ROS job, or with ``offline=True`` the same scoring
over the policy runtime alone. The job is a list of named steps (``ros_steps()``,
``offline_steps()``); a new stage is added with ``insert_before(steps, "report", step)``.
"""

from __future__ import annotations

from .steps import DemoConfig, DemoContext, Step, insert_before, run_steps

__all__ = ["DemoConfig", "DemoContext", "Step", "insert_before", "run_steps", "run_demo",
           "default_steps"]


def default_steps(config: DemoConfig) -> list[Step]:
    """Return the steps of the configured mode (ROS unless ``config.offline``)."""
    if config.offline:
        from .offline import offline_steps

        return offline_steps()
    from .ros import ros_steps

    return ros_steps()


def run_demo(config: DemoConfig, steps: list[Step] | None = None, console=None) -> dict:
    """Run the demo and return its summary (also written to ``out_dir/summary.json``)."""
    from rich.console import Console

    console = console or Console(quiet=config.quiet)
    ctx = DemoContext(config=config, console=console)
    ctx.summary["mode"] = "offline" if config.offline else "ros"
    return run_steps(steps if steps is not None else default_steps(config), ctx)
