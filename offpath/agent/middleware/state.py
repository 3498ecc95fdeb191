"""The middleware's state and records: :class:`OffPathState` (the agent's state with the
thread's private key), a thread's claim as last read (``_Seen``), one model call (``_Call``)
and an archive write it makes (``_Write``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware import AgentState
from langchain.agents.middleware.types import ModelRequest, PrivateStateAttr

from offpath.stores.leases.claims import Claim


@dataclass(slots=True)
class _Seen:
    claim: Claim | None = None
    at: float = 0.0  # monotonic time of the last read (or failed read)
    failed: bool = False
    reading: bool = False
    #: the prepared job of ``claim`` was asked for by an operator (compact now), as last read
    forced: bool = False
    forced_at: float = 0.0
    #: set once a read has ended (:meth:`OffPathCompaction._await_claim` waits on it)
    read: threading.Event = field(default_factory=threading.Event)


class OffPathState(AgentState):
    offpath: NotRequired[Annotated[dict[str, Any], PrivateStateAttr]]


#: An archive write a model call makes: the job it stores (None: results shortened), and
#: the write itself.
_Write = tuple[str | None, Callable[[], None]]


@dataclass(slots=True)
class _Call:
    """One model call: the request to send, and the state update to return with the answer."""

    request: ModelRequest
    update: dict[str, Any] = field(default_factory=dict)
    chars: int = 0  # what the call is sent (messages), for the calibration
    session_id: str | None = None
    #: the archive writes of this call's shortenings and apply, in the order they were
    #: made, running (one after another) while the model answers
    stored: Future[Any] | None = None
    #: the thread's size as the state had it before the call (put back if a write fails)
    size_before: dict[str, Any] | None = None
