"""Failpoints for the fault-injection tests (``tests/faults``).

``OFFPATH_FAILPOINTS=after_patch`` (a comma-separated list) makes a worker kill
itself with SIGKILL when a job reaches that point, so a test can stop it exactly
between two writes. Unset (always, in production) every call is a no-op.

Points: ``before_start`` (a delivery taken, the job not yet started: its row still
queued), ``before_lock`` (summary written, lock not taken), ``in_patch`` (lock
held, checkpoint not yet written), ``after_archive`` (originals archived, the
patch not yet written), ``after_patch`` (checkpoint written, usage event not yet
recorded), ``after_revert_patch`` (a revert's checkpoint written, its job row not yet
marked ``reverted``).
"""

from __future__ import annotations

import os
import signal

_POINTS = frozenset(
    p.strip() for p in os.environ.get("OFFPATH_FAILPOINTS", "").split(",") if p.strip()
)


def failpoint(name: str) -> None:
    """Die here, at once and without cleanup, if ``name`` is armed."""
    if name in _POINTS:
        os.kill(os.getpid(), signal.SIGKILL)
