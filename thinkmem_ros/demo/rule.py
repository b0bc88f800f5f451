"""The demo's planted rule: coolant_low ... duty_cycle_high ... overheat_alarm.

The overlay itself (missions, kinds of evidence, anticipation scoring) lives in
``world/rule_overlay.py``, shared with ``thinkmem bench rounds``; this module only names
the demo's rule and re-exports what the demo steps use.
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkmem_ros.world.rule_overlay import (
    KINDS,
    Mission,
    PlantedRule,
    anticipation,
    mission_kinds,
    plant_rule,
)

__all__ = ["KINDS", "DemoRule", "Mission", "anticipation", "mission_kinds", "plant_rule"]


@dataclass(frozen=True)
class DemoRule(PlantedRule):
    """The demo's regularity; its names are events the world's streams also emit."""

    first: str = "coolant_low"
    second: str = "duty_cycle_high"
    consequence: str = "overheat_alarm"
