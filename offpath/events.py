"""Progress of a compaction, for an app that runs ``OffPathCompaction`` in its own agent
("with default logging an app cannot tell that compaction works").

``OffPathCompaction(on_compaction=callback)`` calls ``callback(update)`` with a
:class:`CompactionUpdate` at each step of a compaction of the run's thread:

* ``in_progress``: a job was queued for the thread (a worker is writing its summary);
  ``chars_before`` is the thread's size then;
* ``completed``: the compaction is in the run's state and recorded (job ``applied``):
  ``chars_before`` and ``chars_after`` are the thread's size before and after it;
* ``failed``: it could not be applied (the orphan guard refused its patch, or the store
  failed); the run goes on uncompacted and ``reason`` says why;
* ``cancelled``: the summary no longer fits the thread (job ``skipped: stale``); a new job
  follows when the thread is still over its prepare point.

:meth:`CompactionUpdate.to_acp` gives it in the shape of the Agent Client Protocol's
``session/update`` notifications (``sessionUpdate: "compaction_update"``, camelCase keys),
for an app that forwards it to an editor or a UI. The callback runs on the model call's
thread (``completed``, ``failed``, ``cancelled``) or on the middleware's background writer
(``in_progress``): keep it quick; what it raises is logged and never stops the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["in_progress", "completed", "failed", "cancelled"]


@dataclass(frozen=True, slots=True)
class CompactionUpdate:
    """One step of a compaction of ``session_id`` (the run's ``thread_id``) by job
    ``compaction_id``. Sizes in chars (the seed's measure); ``chars_after`` only once
    ``completed``; ``reason`` for ``failed`` and ``cancelled``."""

    session_id: str
    compaction_id: str
    status: Status
    chars_before: int | None = None
    chars_after: int | None = None
    reason: str | None = None

    def to_acp(self) -> dict[str, Any]:
        """The update as an ACP ``session/update`` notification's ``update`` object:
        ``{"sessionUpdate": "compaction_update", "compactionId": ..., "status": ...,
        "charsBefore": ..., "charsAfter": ..., "reason": ...}`` (keys with no value left
        out)."""
        out: dict[str, Any] = {
            "sessionUpdate": "compaction_update",
            "compactionId": self.compaction_id,
            "status": self.status,
            "charsBefore": self.chars_before,
            "charsAfter": self.chars_after,
            "reason": self.reason,
        }
        return {k: v for k, v in out.items() if v is not None}
