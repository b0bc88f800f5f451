"""Serving processes take the open-files limit the system allows, not the 1,024 default.

Every robot connected to a receiver or to recall holds a socket: 1,200 idle connections
used up a 1,024 soft limit, and inside the consolidator ``open()`` and
``sqlite3.connect`` then failed (rounds, publishing, new robots). The processes are
started for real with a low soft limit and their limits read from /proc while they serve.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from thinkmem_ros.core.open_files import raise_open_files_limit
from thinkmem_ros.link.security import write_signing_keypair

ROOT = Path(__file__).resolve().parents[1]
LOW = 256


def _low_soft_limit() -> None:
    """Run in the child before exec: a soft limit far below the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW, hard))


def _soft_limit_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


def _serving_soft_limit(argv: list[str], cwd: Path) -> int:
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=cwd,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            preexec_fn=_low_soft_limit)
    try:
        assert proc.stdout.readline().startswith("READY "), "did not start"
        return _soft_limit_of(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _hard_limit_wanted() -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="needs /proc")
@pytest.mark.parametrize("mode", ["service", "receive"])
def test_a_serving_process_raises_its_soft_open_files_limit(tmp_path, mode):
    if _hard_limit_wanted() <= LOW:
        pytest.skip(f"the hard limit here is {_hard_limit_wanted()}: nothing to raise")
    if mode == "service":
        _, sign = write_signing_keypair(tmp_path / "keys", "c")
        argv = ["-m", "thinkmem_ros.consolidator.service", "--db", str(tmp_path / "c.db"),
                "--publish-dir", str(tmp_path / "pub"), "--signing-key", str(sign),
                "--bind", "tcp://127.0.0.1:*", "--curve", "off"]
    else:
        argv = ["-m", "thinkmem_ros.cli", "consolidator", "receive", "--db",
                str(tmp_path / "c.db"), "--bind", "tcp://127.0.0.1:*", "--curve", "off"]
    assert _serving_soft_limit(argv, tmp_path) == _hard_limit_wanted()


def test_the_raise_keeps_what_it_cannot_change():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(LOW, hard), hard))
        assert raise_open_files_limit() == _hard_limit_wanted()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == _hard_limit_wanted()
        assert raise_open_files_limit() == _hard_limit_wanted()  # already there: kept
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
