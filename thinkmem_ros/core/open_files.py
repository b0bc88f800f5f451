"""The process's soft limit on open files, raised to what the system allows.

Why: every robot connected to a receiver or the recall service holds a socket, and the
common soft default of 1,024 was reached by 1,200 idle connections: inside the
consolidator `open()` and `sqlite3.connect` then failed, and with them rounds, publishing
and new robots. The hard limit (often 524,288 or more) is what an administrator set; the
soft one is only a default, and a server process may take up to the hard one itself.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
CEILING = 1 << 20
"""Soft limit asked for at most, where the hard one is unlimited."""


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (at most ``CEILING``); the new soft.

    Never fails the caller: a platform without it or a refusal keeps the limit there is.
    """
    try:
        import resource
    except ImportError:  # not a POSIX system
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = CEILING if hard == resource.RLIM_INFINITY else min(hard, CEILING)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return want
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft,
                        want, exc)
    return soft
