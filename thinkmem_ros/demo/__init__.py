"""The main job: stream -> (bag -> thinking_node ->) activations -> score, plot, summary.

``run_demo(DemoConfig(...))`` runs the ROS job with one consolidation round
(``round.round_steps()``: before bag -> consolidator discovers, retrains, pushes v2 ->
after bag), with ``consolidation=False`` the plain ROS job (``ros_steps()``), or with
``offline=True`` the same scoring over the policy runtime alone (``offline_steps()``).
A new stage is added with ``insert_before(steps, "report", step)``.
"""

from __future__ import annotations

from dataclasses import replace

from thinkmem_ros.demo.steps import DemoConfig, DemoContext, Step, insert_before, run_steps

__all__ = ["DemoConfig", "DemoContext", "Step", "insert_before", "run_steps", "run_demo",
           "default_steps"]


def default_steps(config: DemoConfig) -> list[Step]:
    """Return the steps of the configured mode (ROS unless ``config.offline``)."""
    if config.offline:
        from thinkmem_ros.demo.offline import offline_steps

        return offline_steps()
    if config.consolidation:
        from thinkmem_ros.demo.round import round_steps

        return round_steps()
    from thinkmem_ros.demo.ros import ros_steps

    return ros_steps()


def _ros_missing() -> str | None:
    """Why the ROS path cannot run here (rclpy or the message packages missing), or None."""
    try:
        import rclpy  # noqa: F401
        import sensor_msgs.msg  # noqa: F401
        import std_msgs.msg  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def run_demo(config: DemoConfig, steps: list[Step] | None = None, console=None) -> dict:
    """Run the demo and return its summary (also written to ``out_dir/summary.json``)."""
    from rich.console import Console

    console = console or Console(quiet=config.quiet)
    fallback = None if config.offline else _ros_missing()
    if fallback is not None and steps is None:
        console.print(f"[bold yellow]ROS 2 Python packages are not importable ({fallback}); "
                      "running the offline demo instead[/]")
        config = replace(config, offline=True)
    ctx = DemoContext(config=config, console=console)
    ctx.summary["mode"] = "offline" if config.offline else "ros"
    ctx.summary["consolidation"] = bool(config.consolidation and not config.offline)
    if fallback is not None:
        ctx.summary["fallback_reason"] = fallback
    summary = run_steps(steps if steps is not None else default_steps(config), ctx)
    _add_total(summary)
    return summary


def _add_total(summary: dict) -> None:
    """Put the total wall time (known only after the report step) into summary.json too."""
    import json
    from pathlib import Path

    path = summary.get("summary_json")
    if path and Path(path).is_file():
        on_disk = json.loads(Path(path).read_text())
        on_disk["total_s"] = summary["total_s"]
        Path(path).write_text(json.dumps(on_disk, indent=2) + "\n")
