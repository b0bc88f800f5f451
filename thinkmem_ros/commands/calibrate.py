"""``thinkmem calibrate BAG --params FILE``: a recording's adapted signals against a bundle.

Before a robot runs a bundle (or a bundle is trained for it), each signal's adapted values
should be in the unit and range the bundle learned, at a rate that fills its frames. This
reads the bag through the parameter file's signal map (the node's adapters) and reports
per signal: samples, rate, NaN count, p1/p50/p99, the bundle's training range and unit,
and a warning for each mismatch: a declared unit that differs from the bundle's, a median
outside the training range, a sensor slower than the bundle's frame rate (frames would
repeat or mask values), a signal the bundle needs that the map lacks, or one it never
uses; a signal whose messages give no number is told why (``SignalAdapter.why_nan``: an
index past the end of its array, an element no message names, ...). Header stamps are
judged as the node's situation buffer judges them, with the bag's receive times as the
node's clock (``playback.stamp_check``): a signal whose samples the node would refuse as
future (beyond ``future_stamp_tolerance_s``), duplicate or out of order is warned about
with counts. A signal whose message type is not
installed on this machine is read with the bag's own definition and warned about: the
node here refuses to start on it. Exit 0 with warnings printed; 2 on a configuration
error (naming the key).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from thinkmem_ros.commands import check_output, json_report, one_line

HELP = "report a recording's adapted signals (range, rate, unit) against a bundle"

RATE_TOLERANCE = 0.05
"""A sensor more than 5 % slower than the bundle's frame rate is reported."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``thinkmem calibrate``."""
    parser.add_argument("bag", help="recording: rosbag2 folder, a lone .mcap or .db3 "
                                     "file, or ROS 1 .bag file")
    parser.add_argument("--params", required=True,
                        help="node parameter file with the signals map (topics, adapters)")
    parser.add_argument("--bundle", default=None,
                        help="bundle folder to compare with (default: the params file's "
                             "bundle_path, else the shipped default bundle)")
    parser.add_argument("--json", default=None, help="also write the report as JSON here")


def calibrate(bag: str | Path, params: str | Path, bundle: str | Path | None = None) -> dict:
    """The report as a dict: ``signals`` (per signal), ``warnings`` (list), ``bundle``."""
    from thinkmem_ros.core.paths import resolve_bundle_path
    from thinkmem_ros.playback.recording import load_params, read_samples, summarise
    from thinkmem_ros.playback.stamp_check import (
        FUTURE_KEY,
        future_tolerance,
        judge_stamps,
        stamp_warnings,
        with_stamps,
    )
    from thinkmem_ros.policy.bundle import load_bundle

    # read once, as the node reads it: its sections only, its names and types
    values, signal_map = load_params(params)
    warnings = _check_as_the_node_does(signal_map)
    tolerance = future_tolerance(values.get(FUTURE_KEY), str(params))
    if bundle is None:
        bundle = _bundle_path_of(values, params)
    folder = resolve_bundle_path(bundle)
    # verified, not only read: a report against a damaged or tampered bundle would be
    # advice about a model no node will load
    manifest = load_bundle(folder).manifest
    # header stamps are read in the same pass, to be judged as the node's buffer will
    counted, nan_reasons = _counting_why_nan(signal_map)
    samples = read_samples(bag, with_stamps(counted))
    stats = summarise(samples, signal_map.names)
    stamps = judge_stamps(samples, signal_map, tolerance)
    rows: dict[str, dict] = {}
    undecodable = samples.undecodable()
    for name, binding in signal_map.bindings.items():
        row = {"topic": binding.topic, "type": binding.msg_type, "unit": binding.unit,
               "absent": binding.absent, **stats[name]}
        rows[name] = row
        if binding.absent:
            continue
        if binding.topic in undecodable:
            bad, total = undecodable[binding.topic]
            row["undecodable"] = bad
            warnings.append(f"{name}: {bad} of {total} messages on {binding.topic} could not "
                            f"be decoded (wrong type or damaged bag); they are not counted")
        why = _why_no_number(nan_reasons[name].reasons, row["samples"])
        if row["samples"] == 0 or "p50" not in row:
            warnings.append(f"{name}: no usable sample on {binding.topic}{why}")
            continue
        if row["nan"]:
            warnings.append(f"{name}: {row['nan']} of {row['samples']} messages gave no "
                            f"number{why}")
        repeated, count = samples.repeated(name), samples.times[name].size
        if repeated > 0.1 * count:
            warnings.append(f"{name}: {repeated} of {count} samples arrive at the same time "
                            "as the one before (recorded twice, or two publishers on one "
                            "topic?): its rate counts them all")
        gap = samples.gap_warning(name)
        if gap is not None:
            warnings.append(gap)
        row["refused_by_stamp"] = stamps[name].as_row()
        warnings += stamp_warnings(name, stamps[name], tolerance)
        warnings += _against_bundle(name, binding, row, manifest)
    for name in manifest.signals:
        if name not in signal_map.bindings:
            warnings.append(f"{name}: the bundle needs it but the params file has no "
                            "signals entry (declare it absent: true if the robot lacks it)")
    return {"bag": str(bag), "params": str(params), "bundle": str(folder),
            "bundle_frame_rate_hz": manifest.frame_rate_hz,
            "duration_s": samples.duration_s, "signals": rows, "warnings": warnings}


def _check_as_the_node_does(signal_map) -> list[str]:
    """Refuse what the node refuses at start: a field the message lacks, a norm of a number.

    Those mistakes only show as "no usable sample" in the recording; the node names them
    and will not start, so calibration names them too (ValueError, exit 2). A message
    type that is not installed here (a robot's own package) cannot be checked, and the
    node here refuses to start on it: that is a warning, not an error, as the values are
    still read from the bag's own definitions and the robot may have the package. The
    warnings are returned.
    """
    from thinkmem_ros.robot.msg_fields import canonical_type, check_adapter, message_class

    warnings = []
    for name, binding in signal_map.bindings.items():
        if binding.absent:
            continue
        try:
            msg_type = canonical_type(binding.msg_type)
            message_class(msg_type)
        except ValueError as exc:
            warnings.append(_not_installed(name, binding, exc))
            continue
        try:
            check_adapter(msg_type, binding.adapter)
        except ValueError as exc:
            key = getattr(exc, "key", "field")
            raise ValueError(f"signals.{name}.{key}: {exc} (the node refuses to start with "
                             f"it)") from None
    return warnings


def _not_installed(name: str, binding, exc: ValueError) -> str:
    """The warning for a signal whose type the node on this machine cannot subscribe to."""
    return (f"{name}: the node on this machine cannot subscribe to {binding.msg_type} until "
            f"its package is installed, and refuses to start with this file (signals.{name}"
            f".type: {exc}); the values here are read with the bag's own definition")


class _WhyNan:
    """An adapter that counts why its messages gave no number, for the warnings to say.

    The node's adapter only says NaN, and must stay that cheap; calibration reads a
    recording once, so each NaN message is asked again (``SignalAdapter.why_nan``).
    """

    def __init__(self, adapter) -> None:
        from thinkmem_ros.policy.situation import FLOAT32_MAX

        self.adapter = adapter
        self.limit = FLOAT32_MAX
        self.reasons: Counter[str] = Counter()

    def read(self, msg) -> float:
        value = self.adapter.read(msg)
        if math.isnan(value):
            self.reasons[self.adapter.why_nan(msg)] += 1
        elif abs(value) > self.limit:  # summarise counts it unusable, as the node does
            self.reasons["the adapted value is beyond float32 (the node's window type)"] += 1
        return value


def _counting_why_nan(signal_map):
    """(``signal_map`` read through ``_WhyNan`` adapters, those adapters by signal name)."""
    counters = {name: _WhyNan(b.adapter) for name, b in signal_map.bindings.items()}
    bindings = {name: replace(b, adapter=counters[name])
                for name, b in signal_map.bindings.items()}
    return replace(signal_map, bindings=bindings), counters


def _why_no_number(reasons: Counter, total: int) -> str:
    """': <reason> in every message' (or in n of them), most common first; '' for none.

    Each cause has its own fix (an index, an element name, a sensor sending NaN), so the
    warning names it instead of "no usable sample"; three are enough to act on.
    """
    parts = [f"{why} in {'every message' if n == total else f'{n} of {total} messages'}"
             for why, n in reasons.most_common(3)]
    if len(reasons) > 3:
        parts.append(f"{len(reasons) - 3} other reason(s)")
    return ": " + "; ".join(parts) if parts else ""


def _bundle_path_of(values, params) -> str:
    """The node's bundle_path in ``values``, '' when unset (the shipped bundle); else ValueError.

    ``values`` are the parameters the file gives the thinking node
    (``recording.load_params``): a bundle_path in another node's section, or
    nested anywhere else, is not the one the robot runs. A number or a list there is a
    mistake the node refuses; falling back to the shipped bundle would calibrate against a
    bundle the robot never runs, without a word.
    """
    found = values.get("bundle_path")
    if found is None:
        return ""
    if not isinstance(found, str):
        raise ValueError(f"{params}: bundle_path must be a string (a bundle folder, '' for "
                         f"the shipped one), got {found!r}")
    return found


def _find_key(raw, key: str, seen: set[int] | None = None):
    """The first value of ``key`` in nested mappings, each mapping visited once.

    YAML aliases share one object; walking them as a tree is exponential in a 2 kB file.
    """
    seen = set() if seen is None else seen
    if isinstance(raw, dict) and id(raw) not in seen:
        seen.add(id(raw))
        if key in raw:
            return raw[key]
        for value in raw.values():
            found = _find_key(value, key, seen)
            if found is not None:
                return found
    return None


def _training_range(manifest, name: str) -> tuple[float, float]:
    """The bundle's declared [p1, p99], or mean +- 3 std for bundles that declare none."""
    if name in manifest.signal_ranges:
        low, high = manifest.signal_ranges[name]
        return float(low), float(high)
    j = manifest.signals.index(name)
    mean, std = manifest.normalisation["mean"][j], manifest.normalisation["std"][j]
    return float(mean - 3 * std), float(mean + 3 * std)


def _against_bundle(name: str, binding, row: dict, manifest) -> list[str]:
    """Warnings for one read signal against the bundle: unit, range and rate."""
    if name not in manifest.signals:
        return [f"{name}: not a signal of the bundle {list(manifest.signals)}; it is read "
                "but never used"]
    out = []
    want_unit = manifest.signal_units.get(name, "")
    row["bundle_unit"] = want_unit
    if want_unit and binding.unit and want_unit != binding.unit:
        out.append(f"{name}: unit mismatch: the adapter declares {binding.unit!r}, the "
                   f"bundle was trained on {want_unit!r}")
    elif want_unit and not binding.unit:
        out.append(f"{name}: no unit declared; the bundle expects {want_unit!r} (add unit: "
                   f"{want_unit!r} once the adapter converts to it)")
    low, high = _training_range(manifest, name)
    row["bundle_range"] = [low, high]
    if not low <= row["p50"] <= high:
        out.append(f"{name}: median {row['p50']:.4g} is outside the bundle's training range "
                   f"[{low:.4g}, {high:.4g}]; check scale/offset/unit")
    if row["rate_hz"] < manifest.frame_rate_hz * (1 - RATE_TOLERANCE):
        out.append(f"{name}: {row['rate_hz']:.3g} Hz is slower than the bundle's "
                   f"{manifest.frame_rate_hz:g} Hz frames")
    return out


def main(args: argparse.Namespace) -> int:
    """Print the calibration table and warnings; 2 on a configuration or bag error.

    An unwritable or empty --json is refused before the bag is read, not after.
    """
    from thinkmem_ros.playback.bag_files import BagError
    from thinkmem_ros.policy.bundle import BundleError

    if args.json is not None:
        if not args.json:  # skipped as "no --json", the report went nowhere with exit 0
            raise SystemExit("thinkmem calibrate: error: --json needs a file name, got ''")
        check_output(args.json, "thinkmem calibrate: error: --json",
                     replaces=json_report("bag", "signals"))
    try:
        report = calibrate(args.bag, args.params, args.bundle)
    except (ValueError, BagError, BundleError, FileNotFoundError) as exc:
        print(f"thinkmem calibrate: error: {one_line(exc)}", file=sys.stderr)
        return 2
    print(f"{report['bag']}: {report['duration_s']:.1f} s against {report['bundle']} "
          f"({report['bundle_frame_rate_hz']:g} Hz)")
    print(f"{'signal':14s} {'unit':8s} {'rate Hz':>8s} {'p1':>10s} {'p50':>10s} {'p99':>10s}"
          f"  bundle range / unit")
    for name, row in report["signals"].items():
        if row["absent"]:
            print(f"{name:14s} absent by design")
            continue
        rng = row.get("bundle_range")
        rng_text = f"[{rng[0]:.4g}, {rng[1]:.4g}] {row.get('bundle_unit', '')}" if rng else "-"
        print(f"{name:14s} {row['unit'] or '-':8s} {row['rate_hz']:8.2f} "
              f"{row.get('p1', float('nan')):10.4g} {row.get('p50', float('nan')):10.4g} "
              f"{row.get('p99', float('nan')):10.4g}  {rng_text}")
    for warning in report["warnings"]:
        print(f"WARN {warning}")
    print(f"{len(report['warnings'])} warning(s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0
