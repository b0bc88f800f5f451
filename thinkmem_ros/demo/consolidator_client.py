"""Start the demo's consolidator process and talk to it (``consolidator_proc`` protocol).

Every wait has a deadline: a reader thread turns the child's stdout into a queue of lines,
so a hung or crashed consolidator becomes a ``RuntimeError`` naming what was awaited and
the tail of its log, never a demo that hangs.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

MODULE = "thinkmem_ros.demo.consolidator_proc"


def _child_env() -> dict[str, str]:
    """Environment in which ``python -m`` imports this very thinkmem_ros (checkout or install)."""
    import thinkmem_ros

    root = Path(thinkmem_ros.__file__).resolve().parent.parent
    env = dict(os.environ)
    if "site-packages" not in root.parts:
        env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    return env


class ConsolidatorProcess:
    """A running ``consolidator_proc`` child: ``endpoint``, ``command()``, ``stop()``."""

    def __init__(self, args: list[str], log_path: Path, start_timeout_s: float = 60.0) -> None:
        self.log_path = Path(log_path)
        self._log = self.log_path.open("w")
        self.command_line = [sys.executable, "-m", MODULE, *args]
        self.process = subprocess.Popen(
            self.command_line, env=_child_env(), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="demo-consolidator-out",
                                        daemon=True)
        self._reader.start()
        self.exit_code: int | None = None
        try:
            ready = self._expect("READY", start_timeout_s, "start-up")
        except RuntimeError:
            self.stop()
            raise
        self.endpoint = ready.strip()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # EOF: the child closed stdout (exited)

    def _tail(self) -> str:
        self._log.flush()
        try:
            return self.log_path.read_text()[-3000:]
        except OSError:
            return ""

    def _expect(self, word: str, timeout_s: float, what: str) -> str:
        """Return the payload of the next line starting with ``word`` (other lines skipped)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"consolidator: no {word} reply to {what} within "
                                   f"{timeout_s:.0f} s; log {self.log_path}:\n{self._tail()}")
            try:
                line = self._lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                code = self.process.wait(timeout=5.0)
                raise RuntimeError(f"consolidator exited (code {code}) during {what}; log "
                                   f"{self.log_path}:\n{self._tail()}")
            if line.startswith("ERROR"):
                raise RuntimeError(f"consolidator {what} failed: {line[6:]}")
            if line.startswith(word + " ") or line == word:
                return line[len(word) + 1:]

    def command(self, name: str, timeout_s: float) -> dict:
        """Send one command (``count`` or ``round``) and return its JSON reply."""
        if self.process.poll() is not None:
            raise RuntimeError(f"consolidator is not running (exit code "
                               f"{self.process.returncode}); log {self.log_path}")
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()
        return json.loads(self._expect(name.upper(), timeout_s, f"'{name}'"))

    def stop(self, timeout_s: float = 15.0) -> int:
        """Ask it to quit (stdin), then SIGTERM, then SIGKILL; returns the exit code."""
        if self.exit_code is not None:
            return self.exit_code
        process = self.process
        if process.poll() is None:
            try:
                process.stdin.write("quit\n")
                process.stdin.flush()
                process.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=timeout_s)
        self.exit_code = process.returncode
        self._reader.join(timeout=2.0)
        self._log.close()
        return self.exit_code
