"""How offpath names a session in its log lines."""

from __future__ import annotations

import hashlib


def tag(session_id: str) -> str:
    """The session's tag in log lines, ``[tag] ...``: 8 hex chars of a hash of the whole id.

    The first 8 chars of the id were not enough (``[holmesgp]`` matched two sessions). The job's
    first log line also gives the whole id.
    """
    return hashlib.blake2b(session_id.encode(), digest_size=4).hexdigest()
