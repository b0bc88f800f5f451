"""Polling for a condition that another thread or process makes true.

Why one helper: eight test modules each carried their own copy of this loop.
"""

from __future__ import annotations

import time


def wait(pred, timeout: float = 15.0, step: float = 0.01) -> bool:
    """Whether ``pred()`` became true within ``timeout`` seconds (polled every ``step``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False
