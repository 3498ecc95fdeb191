"""Usage events' figures and fallback maskings: :func:`chars_saved` (the real reduction a
compaction's usage event records) and :func:`record_masking` (``fallback_maskings``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from offpath.stores.db.tables import MASKINGS, now_utc


def chars_saved(record: Mapping[str, Any]) -> int:
    """The real reduction of one applied compaction, from its record (chars): the thread's
    size before it less its size after (``chars_before`` - ``chars_after``: what it removed,
    less the summary it put in, plus what it cut from kept results). A summary that a later
    compaction folds again is removed by that one but was put in by this one: summed over a
    thread, the savings are what the thread produced less what it holds now, each char
    counted once (``chars_removed`` counts re-folded summaries again).
    A record without the sizes: ``chars_removed`` less ``summary_chars``, else
    ``chars_removed``."""
    before, after = record.get("chars_before"), record.get("chars_after")
    if before is not None and after is not None:
        return max(0, int(before) - int(after))
    removed = int(record.get("chars_removed") or 0)
    return max(0, removed - int(record.get("summary_chars") or 0))


def record_masking(engine: Engine, session_id: str, results: int, chars: int) -> None:
    """Count one fallback masking (``/stats`` ``fallback_maskings``)."""
    with engine.begin() as conn:
        conn.execute(
            sa.insert(MASKINGS).values(
                session_id=session_id, results=results, chars=chars, created_at=now_utc()
            )
        )
