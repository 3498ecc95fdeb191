"""API keys and tenants: who may call the API, and which sessions are theirs.

A key is ``op_`` and 43 random URL-safe chars, shown once when it is created
(``offpath keys create --tenant NAME``) and stored as its SHA-256 only (the keys
are random: a slow hash adds nothing). A key belongs to a tenant; an admin key
sees every tenant's sessions and the global ``/stats``.

A session belongs to the tenant whose key first wrote to it (``sessions`` table).
Another tenant gets 404 for it, not 403, so session ids do not leak. A thread of a
team's own agent (the middleware, in the team's process) is a session of kind
``own agent``, owned by the tenant the middleware names (``OWN_AGENT_TENANT``, default
``default``): it registers the thread at its first model call and keeps
its size, so its tenant's keys list, read and compact it like an API session; offpath
never writes it (its checkpointer is the agent's, at ``sessions.checkpoints``).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Field, SQLModel

from offpath.stores.db.engine import insert_for

log = logging.getLogger("offpath.tenants")

#: The tenant of everything when ``AUTH_DISABLED=true``, and of sessions older than keys.
DEFAULT_TENANT = "default"
#: A key's known prefix; ``PREFIX_CHARS`` of it (with the ``op_``) are kept to name it.
KEY_PREFIX = "op_"
PREFIX_CHARS = 10
#: How long a looked-up key is remembered in this process (a revoked key stops within it).
CACHE_S = 5.0


class ApiKey(SQLModel, table=True):
    """An API key, stored as its SHA-256; ``prefix`` names it in lists."""

    __tablename__ = "api_keys"

    id: int | None = Field(default=None, primary_key=True)
    key_hash: str = Field(max_length=64, unique=True)
    prefix: str = Field(max_length=16)
    tenant: str = Field(max_length=64)
    admin: bool = False
    created_at: datetime = Field(sa_type=sa.DateTime(timezone=True))
    revoked_at: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))


class SessionOwner(SQLModel, table=True):
    """Which tenant owns a session (the first to write to it)."""

    __tablename__ = "sessions"

    session_id: str = Field(primary_key=True, max_length=128)
    tenant: str = Field(max_length=64, index=True)
    created_at: datetime = Field(sa_type=sa.DateTime(timezone=True))
    last_activity: datetime = Field(sa_type=sa.DateTime(timezone=True))
    #: The thread's size after offpath's last write to it (None: not written since
    #: migration 0007): the session list sorts by it without reading checkpoints.
    messages: int | None = None
    chars: int | None = None
    #: :data:`API` (offpath's own checkpointer) or :data:`OWN_AGENT` (a team's own agent,
    #: whose checkpointer is at ``checkpoints``; None: offpath's). Migration 0009.
    kind: str = Field(default="api", max_length=16)
    checkpoints: str | None = Field(default=None, sa_type=sa.Text)
    #: What no compaction removes from the thread's model calls (its system prompt, given to
    #: the agent or in the thread), in chars, and the threshold it is compacted under, as the
    #: middleware last saw them (None: not seen since migration 0011). Over the threshold:
    #: every call is, and ``/readyz`` and the session's page say so.
    fixed_chars: int | None = None
    threshold_chars: int | None = None


#: The kinds of session (``sessions.kind``).
API = "api"
OWN_AGENT = "own agent"


# each model's table (SQLModel sets ``__table__`` on a table model but does not declare it)
KEYS: sa.Table = ApiKey.__table__  # type: ignore[attr-defined]
SESSIONS: sa.Table = SessionOwner.__table__  # type: ignore[attr-defined]


class UnknownKey(LookupError):
    """No active key matches (to revoke)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a tenant, admin or not."""

    tenant: str
    admin: bool = False

    def sees(self, owner: str | None) -> bool:
        """May this caller see a session owned by ``owner`` (None: no owner)?"""
        return self.admin or owner == self.tenant


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def create_key(engine: Engine, tenant: str, admin: bool = False) -> str:
    """A new key for ``tenant``; returned once, stored hashed."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(KEYS).values(
                key_hash=_hash(key),
                prefix=key[:PREFIX_CHARS],
                tenant=tenant,
                admin=admin,
                created_at=_now(),
            )
        )
    return key


def revoke_key(engine: Engine, key_or_prefix: str) -> int:
    """Revoke the key (given whole, or by the prefix ``keys list`` shows); how many were.

    Raises :class:`UnknownKey` if none matches."""
    match = (
        KEYS.c.key_hash == _hash(key_or_prefix)
        if len(key_or_prefix) > PREFIX_CHARS
        else KEYS.c.prefix == key_or_prefix
    )
    with engine.begin() as conn:
        n = conn.execute(
            sa.update(KEYS).where(match, KEYS.c.revoked_at.is_(None)).values(revoked_at=_now())
        ).rowcount
    if not n:
        if len(key_or_prefix) < PREFIX_CHARS:
            raise UnknownKey(
                f"{key_or_prefix!r} is no key's prefix: give the key, or its first "
                f"{PREFIX_CHARS} chars as `keys list` shows them"
            )
        raise UnknownKey(f"no active key {key_or_prefix[:PREFIX_CHARS]}...")
    _cache.clear()
    return n


def list_keys(engine: Engine) -> list[dict[str, Any]]:
    """Every key (prefix, tenant, admin, created, revoked), newest first; never the key."""
    q = sa.select(
        KEYS.c.prefix, KEYS.c.tenant, KEYS.c.admin, KEYS.c.created_at, KEYS.c.revoked_at
    ).order_by(KEYS.c.created_at.desc())
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


_cache: dict[str, tuple[float, Principal | None]] = {}


def principal_of(engine: Engine, key: str) -> Principal | None:
    """The caller ``key`` names, or None (unknown or revoked)."""
    digest = _hash(key)
    hit = _cache.get(digest)
    if hit is not None and time.monotonic() - hit[0] < CACHE_S:
        return hit[1]
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(KEYS.c.tenant, KEYS.c.admin).where(
                KEYS.c.key_hash == digest, KEYS.c.revoked_at.is_(None)
            )
        ).first()
    found = Principal(row.tenant, bool(row.admin)) if row is not None else None
    if len(_cache) > 10_000:
        _cache.clear()
    _cache[digest] = (time.monotonic(), found)
    return found


def owner_of(engine: Engine, session_id: str) -> str | None:
    """The tenant that owns ``session_id`` (None: nobody, or no such session)."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(SESSIONS.c.tenant).where(SESSIONS.c.session_id == session_id)
        ).scalar()


def take_session(engine: Engine, session_id: str, tenant: str) -> str:
    """Make ``tenant`` the owner of ``session_id`` if it has none; return its owner (one
    statement and a read: the first writer wins, also between two at once)."""
    now = _now()
    with engine.begin() as conn:
        conn.execute(
            insert_for(engine, SESSIONS)
            .values(session_id=session_id, tenant=tenant, created_at=now, last_activity=now)
            .on_conflict_do_update(
                index_elements=["session_id"],
                set_={"last_activity": now},
                where=SESSIONS.c.tenant == tenant,
            )
        )
        return str(
            conn.execute(
                sa.select(SESSIONS.c.tenant).where(SESSIONS.c.session_id == session_id)
            ).scalar()
        )


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session's ``sessions`` row: its owner, kind and (own agent) checkpointer URL."""

    tenant: str
    kind: str = API
    checkpoints: str | None = None

    @property
    def own_agent(self) -> bool:
        return self.kind == OWN_AGENT


def session_of(engine: Engine, session_id: str) -> SessionInfo | None:
    """The session's owner, kind and checkpointer (None: no such session row)."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(SESSIONS.c.tenant, SESSIONS.c.kind, SESSIONS.c.checkpoints).where(
                SESSIONS.c.session_id == session_id
            )
        ).first()
    return None if row is None else SessionInfo(row.tenant, row.kind or API, row.checkpoints)


def identities(engine: Engine, session_ids: Collection[str]) -> dict[str, tuple[str, datetime]]:
    """``{session_id: (tenant, created_at)}`` of the sessions that have an owner row, in one
    query: who owns each now, and which claim of the id it is (a session deleted and its id
    claimed again has another ``created_at``)."""
    if not session_ids:
        return {}
    q = sa.select(SESSIONS.c.session_id, SESSIONS.c.tenant, SESSIONS.c.created_at).where(
        SESSIONS.c.session_id.in_(list(session_ids))
    )
    with engine.connect() as conn:
        return {r.session_id: (r.tenant, r.created_at) for r in conn.execute(q)}


def note_own_thread(
    engine: Engine,
    session_id: str,
    tenant: str,
    checkpoints: str | None,
    messages: int,
    chars: int,
    *,
    fixed: int | None = None,
    threshold: int | None = None,
) -> bool:
    """Register (or refresh) a thread of a team's own agent as a session of ``tenant``, kind
    :data:`OWN_AGENT`, with its size and last activity now (the middleware, in the
    background), and its ``fixed`` part and ``threshold`` (chars) when given. One statement:
    an existing row is updated only if it is this tenant's own agent thread; returns False
    when the id is another tenant's or an API session's (the thread is then not listed as the
    agent's). Raises the driver's error."""
    now = _now()
    size: dict[str, Any] = {"last_activity": now, "messages": messages, "chars": chars}
    if fixed is not None:
        size |= {"fixed_chars": fixed, "threshold_chars": threshold}
    with engine.begin() as conn:
        done = conn.execute(
            insert_for(engine, SESSIONS)
            .values(
                session_id=session_id,
                tenant=tenant,
                created_at=now,
                kind=OWN_AGENT,
                checkpoints=checkpoints,
                **size,
            )
            .on_conflict_do_update(
                index_elements=["session_id"],
                set_={**size, "checkpoints": checkpoints},
                where=(SESSIONS.c.tenant == tenant) & (SESSIONS.c.kind == OWN_AGENT),
            )
        ).rowcount
    return bool(done)


def forget_session(engine: Engine, session_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.delete(SESSIONS).where(SESSIONS.c.session_id == session_id))


def note_fixed(engine: Engine, session_id: str, fixed: int, threshold: int) -> None:
    """Record the thread's fixed part (what no compaction removes from its model calls) and
    the threshold it is compacted under, in chars, on its session row (an own agent's is
    noted with its size: :func:`note_own_thread`). Best effort, as :func:`note_size`."""
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.update(SESSIONS)
                .where(SESSIONS.c.session_id == session_id)
                .values(fixed_chars=fixed, threshold_chars=threshold)
            )
    except Exception as exc:
        log.warning("could not record the fixed part of session %r: %s", session_id[:40], exc)


def fixed_part(engine: Engine, session_id: str) -> tuple[int, int] | None:
    """``(fixed chars, threshold chars)`` as last recorded for the session (None: not
    recorded)."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(SESSIONS.c.fixed_chars, SESSIONS.c.threshold_chars).where(
                SESSIONS.c.session_id == session_id
            )
        ).first()
    if row is None or row.fixed_chars is None or row.threshold_chars is None:
        return None
    return int(row.fixed_chars), int(row.threshold_chars)


def fixed_over(engine: Engine, limit: int = 3) -> tuple[int, list[tuple[str, int, int]]]:
    """Sessions whose fixed part is over their threshold: how many, and the ``limit`` most
    recently active as ``(session id, fixed chars, threshold chars)``."""
    over = SESSIONS.c.fixed_chars > SESSIONS.c.threshold_chars
    with engine.connect() as conn:
        n = conn.execute(sa.select(sa.func.count()).select_from(SESSIONS).where(over)).scalar()
        rows = conn.execute(
            sa.select(SESSIONS.c.session_id, SESSIONS.c.fixed_chars, SESSIONS.c.threshold_chars)
            .where(over)
            .order_by(SESSIONS.c.last_activity.desc())
            .limit(limit)
        ).all()
    return int(n or 0), [(r[0], int(r[1]), int(r[2])) for r in rows]


def note_size(engine: Engine, session_id: str, messages: int, chars: int) -> None:
    """Record the thread's size (messages, chars) after offpath wrote it (a turn, a chat run,
    a compaction patch); a session with no owner row (a team's own agent) is left alone.
    Best effort: an error is logged, never raised (the write it follows has landed)."""
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.update(SESSIONS)
                .where(SESSIONS.c.session_id == session_id)
                .values(messages=messages, chars=chars)
            )
    except Exception as exc:
        log.warning("could not record the size of session %r: %s", session_id[:40], exc)
