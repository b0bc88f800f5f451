"""The dense-episodes measurement runs each case in its own capped process and says what
the limit left out (``python -m thinkmem_ros.bench.dense_episodes``)."""

from __future__ import annotations

import subprocess
import sys

from thinkmem_ros.bench.dense_episodes import fleet_log, run
from thinkmem_ros.consolidator.discovery.density import distinct_codes


def test_the_fleet_log_holds_the_dense_robots_episodes():
    log = fleet_log(3, 200, 90)
    assert len(log.episode_ids) == 403 and int(log.source.max()) == 4
    assert distinct_codes(log)[-3:].min() > 64 >= distinct_codes(log)[:-3].max()


def test_each_case_reports_what_the_limit_left_out():
    rows = run(64, 4.0, cases=((3, 200, 90),))
    assert rows[0]["left_out"] == 3 and rows[0]["seconds"] >= 0 and rows[0]["peak_gb"] > 0


def test_bad_options_are_one_line():
    done = subprocess.run([sys.executable, "-m", "thinkmem_ros.bench.dense_episodes",
                           "--max-episode-codes", "-1"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
