"""The CPU accounting of ``thinkmem bench transport`` (the full bench is never run here)."""

import math
import os
import subprocess
import sys

from thinkmem_ros.bench.transport import _own_cpu_s, _proc_cpu_s


def _burn(seconds):
    start = _own_cpu_s()
    while _own_cpu_s() - start < seconds:
        sum(range(10_000))


def test_proc_and_rusage_clocks_agree_on_this_process():
    _burn(0.2)
    own, proc = _own_cpu_s(), _proc_cpu_s(os.getpid())
    assert own >= 0.2 and abs(own - proc) < 0.1  # /proc ticks are 10 ms


def test_another_process_is_measured_and_a_gone_one_is_nan():
    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.process_time()\n"
                              "while time.process_time()-t<0.3: pass\ntime.sleep(5)"])
    try:
        deadline = 50
        while _proc_cpu_s(child.pid) < 0.25 and deadline:
            deadline -= 1
            subprocess.run(["sleep", "0.1"], check=True)
        assert _proc_cpu_s(child.pid) >= 0.25
    finally:
        child.kill()
        child.wait(5)
    assert math.isnan(_proc_cpu_s(child.pid))
