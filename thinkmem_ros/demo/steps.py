"""The demo as a list of named steps over one shared context.

Each step is a small function of :class:`DemoContext`; the runner times it, prints it and
guarantees clean-up (a started node is stopped even when a later step fails). A later
feature (e.g. a consolidator round) joins the demo by inserting a :class:`Step` into the
list before ``report``, without touching the steps already here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thinkmem_ros.world.rule_overlay import MIN_MISSION_S

SCENARIO_DEFAULT = "mixed"


@dataclass
class DemoConfig:
    """What the demo runs; validated on construction, errors name the bad field."""

    out_dir: Path = Path("demo_output")
    scenario: str = SCENARIO_DEFAULT
    duration_s: float = 288.0  # with consolidation: the "before" stream, cut into missions
    rate_hz: float = 0.0  # 0 = the bundle's frame rate
    seed: int = 7
    bundle: Path | None = None  # None = the shipped default bundle
    offline: bool = False
    frame_trigger: str = "timer"  # the node's frame_trigger parameter
    node_command: tuple[str, ...] | None = None  # None = the thinking_node console script
    node_start_timeout_s: float = 60.0
    settle_s: float = 1.5  # wait after playback for the last activations
    ros_domain_id: int | None = None  # None = keep the environment's, or pick one at random
    quiet: bool = False  # no live display (tests, CI logs)
    # one consolidation round (ROS mode only): before bag -> round -> v2 -> after bag
    consolidation: bool = True
    # episodes of the before stream: 10 of 16 carry the rule; discovery needs ~8 repetitions
    # against this world's natural event structure (5 were too few to promote anything)
    missions: int = 16
    # and missions that carry none of it, as most of a fleet's missions never see a given
    # rule: without them its first code sits in 15 of 16 missions and cannot be judged
    # against real cases, so discovery rightly makes it wait (24 missions of 12 s)
    plain_missions: int = 8
    after_duration_s: float = 96.0  # 8 missions of 12 s, 5 of them carrying the rule
    after_missions: int = 8
    # the anchored fine-tune's measured setting (RetrainConfig defaults): old weights move at
    # base_lr, what the round adds at retrain_lr; 15 epochs halve the old 30-epoch time
    retrain_epochs: int = 15
    retrain_lr: float = 4e-3  # RetrainConfig.lr
    gate: dict[str, float] = field(default_factory=dict)  # GateConfig overrides; {} = as is
    store_timeout_s: float = 60.0  # played experiences must reach the store within this
    round_timeout_s: float = 600.0
    swap_timeout_s: float = 60.0  # the node must run the pushed bundle within this

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        for key in ("duration_s", "node_start_timeout_s", "after_duration_s", "store_timeout_s",
                    "round_timeout_s", "swap_timeout_s"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be a number > 0, got {value!r}")
        for key in ("rate_hz", "settle_s"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{key} must be a number >= 0, got {value!r}")
        for key, low in (("missions", 1), ("after_missions", 1), ("retrain_epochs", 1),
                         ("plain_missions", 0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{key} must be an integer >= {low}, got {value!r}")
        for missions, seconds, what in (
                (self.missions + self.plain_missions, self.duration_s, "missions"),
                (self.after_missions, self.after_duration_s, "after_missions")):
            # only the round cuts missions; checked before any list of them is built
            if self.consolidation and not self.offline and missions * MIN_MISSION_S > seconds:
                raise ValueError(f"{what}: {missions} missions in {seconds:g} s are shorter "
                                 f"than {MIN_MISSION_S:g} s each; use fewer or a longer "
                                 "duration")
        if not (math.isfinite(self.retrain_lr) and self.retrain_lr > 0):
            raise ValueError(f"retrain_lr must be a number > 0, got {self.retrain_lr!r}")
        if self.frame_trigger not in ("timer", "samples"):
            raise ValueError(f"frame_trigger must be 'timer' or 'samples', "
                             f"got {self.frame_trigger!r}")
        if self.ros_domain_id is not None and not 0 <= self.ros_domain_id <= 232:
            raise ValueError(f"ros_domain_id must be in [0, 232], got {self.ros_domain_id}")
        if self.bundle is not None:
            self.bundle = Path(self.bundle)


@dataclass
class DemoContext:
    """State handed from step to step, and the summary that becomes summary.json."""

    config: DemoConfig
    console: Any  # rich.console.Console
    artefacts: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    cleanups: list[Callable[[], None]] = field(default_factory=list)


@dataclass(frozen=True)
class Step:
    """One named stage of the demo."""

    name: str
    run: Callable[[DemoContext], None]
    description: str = ""


def run_steps(steps: list[Step], ctx: DemoContext) -> dict[str, Any]:
    """Run ``steps`` in order, recording each one's seconds in ``summary['steps']``.

    Clean-ups registered by steps run in reverse order whatever happens, so a failing
    step never leaves a node process or a ROS context behind.
    """
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise ValueError(f"step names must be unique, got {names}")
    timings = ctx.summary.setdefault("steps", {})
    started = time.perf_counter()
    try:
        for index, step in enumerate(steps, 1):
            ctx.console.print(f"[bold cyan][{index}/{len(steps)}] {step.name}[/] "
                              f"{step.description}")
            t0 = time.perf_counter()
            step.run(ctx)
            timings[step.name] = round(time.perf_counter() - t0, 3)
    finally:
        while ctx.cleanups:
            try:
                ctx.cleanups.pop()()
            except Exception as exc:  # clean-up must not hide the step's own error
                ctx.console.print(f"[yellow]clean-up failed: {exc}[/]")
    ctx.summary["total_s"] = round(time.perf_counter() - started, 3)
    return ctx.summary


def insert_before(steps: list[Step], name: str, step: Step) -> list[Step]:
    """Return a copy of ``steps`` with ``step`` placed before the step called ``name``."""
    index = next((i for i, s in enumerate(steps) if s.name == name), None)
    if index is None:
        raise ValueError(f"no step named {name!r}; steps are {[s.name for s in steps]}")
    return [*steps[:index], step, *steps[index:]]
