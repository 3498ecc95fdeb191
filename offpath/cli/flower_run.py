"""Flower as ``offpath flower`` runs it: Celery's ``flower`` command in this process, with one
change to what it logs. At start-up, and whenever no worker answers within its inspect
timeout (none started yet, or all stopped), Flower warns once per inspect method
("Inspect method active_queues failed", then ``conf``, ``registered``, ``stats``...): four or
more warnings that say nothing is wrong with Flower. They become one line at INFO, said
once per process: Flower shows the workers as they start. An inspection that failed for
another reason (the broker away: "Inspect method %s failed: <error>") stays a warning.

``python -m offpath.cli.flower_run ARGS`` runs ``celery ARGS`` (``-A ... flower ...``).
"""

from __future__ import annotations

import logging
import sys

#: Flower's message when no worker answered an inspect command (``flower/inspector.py``).
NO_ANSWER = "Inspect method %s failed"
SAID = (
    "no worker answered Flower's inspection yet (none is running, or it is still starting): "
    "Flower lists the workers as they start"
)


class NoWorkerYet(logging.Filter):
    """Keeps the first of Flower's no-answer warnings as one INFO line (:data:`SAID`) and
    drops the others; every other record passes unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.quiet = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != NO_ANSWER:
            return True
        if self.quiet:
            return False
        self.quiet = True
        record.msg, record.args = SAID, ()
        record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def main(argv: list[str]) -> None:
    """Run ``celery argv`` with :class:`NoWorkerYet` on Flower's inspector's logger."""
    logging.getLogger("flower.inspector").addFilter(NoWorkerYet())
    from celery.bin.celery import main as celery

    sys.argv = ["celery", *argv]
    celery()


if __name__ == "__main__":
    main(sys.argv[1:])
