"""The facts of a list of messages: :class:`Fact`, each message's facts found once per
process (:func:`warm`, cached by what they depend on), merged in order by :func:`extract`,
and ranked by what an investigator needs (:func:`rank`). A message's facts found in another
process are taken by the message's key (:func:`key_digest`, :func:`found_now`, :func:`take`;
:mod:`offpath.stores.facts` carries them)."""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from langchain_core.messages import BaseMessage

from offpath.compaction.facts.patterns import ERROR_LINE, KIND_WEIGHT, NOISE_LINE, SAID_ONLY, find
from offpath.compaction.facts.reading import (
    fact_blocks,
    role_age,
    split_spans,
    split_values,
    tool_arguments,
)
from offpath.compaction.facts.sections import clip_around
from offpath.compaction.fields import message_field
from offpath.compaction.summary import (
    archived_as,
    is_summary,
    looks_like_instruction,
    may_hold_instruction,
)


@dataclass(slots=True)
class Fact:
    """One fact: its ``value`` (as written, spaces collapsed), ``kind``, the id of the first
    message it was seen in and the line there, how many messages hold it, and how it was
    used: ``stated`` by the agent (its text, its tool calls' arguments), ``said`` by it in its
    own words (its text, not a tool call), ``asked`` by the user (a request), ``carried`` from
    an earlier summary, ``noise``: seen only on noise lines of tool output (healthy table
    rows, listings, object metadata)."""

    value: str
    kind: str
    message_id: str
    line: str
    messages: int = 1
    stated: bool = False
    order: int = 0
    asked: bool = False
    carried: bool = False
    noise: bool = True
    error: bool = False  # seen on a line that reports an error or a failure
    said: bool = False
    age: int = 0  # carried: spans since it was first pinned, as its summary lists it (0: last)
    _seen: set[str] = field(default_factory=set, repr=False)

    @property
    def tool_only(self) -> bool:
        """Only tool output holds it: neither the agent nor the user used it, and no earlier
        summary carried it."""
        return not (self.stated or self.asked or self.carried)

    @property
    def grouped(self) -> bool:
        """An opaque value only tool output holds (a time of day, a request, trace or commit
        id): never listed one by one; :func:`~offpath.compaction.facts.pin` writes such
        values as one line per kind (a time range, a count and how to recall them)."""
        if not self.tool_only:
            return False
        if self.kind == "timestamp":
            return ":" in self.value
        return self.kind in _OPAQUE

    @property
    def score(self) -> int:
        """Higher first: kind weight (-1 for a time of day without its date: a schedule's
        times are rarely what a task turns on; -1 for a path or URL only tool output holds),
        +3 stated by the agent and +3 more said in its own words, +4 asked by the user, +5
        carried from an earlier summary, +2 on a line that reports an error, + up to 3 for
        recurrence. 0 (never listed): a bare number nobody used (not stated, asked, carried
        nor recurring), a fact seen only on noise lines and never used, a :attr:`grouped`
        value."""
        # the fields read once (:attr:`tool_only` and :attr:`grouped` inlined): a job ranks
        # and filters its thousand facts by score several times
        kind, value, stated, asked, carried = (
            self.kind,
            self.value,
            self.stated,
            self.asked,
            self.carried,
        )
        tool_only = not (stated or asked or carried)
        if tool_only and (
            self.noise
            or (kind == "number" and self.messages < 2)
            or ((":" in value) if kind == "timestamp" else kind in _OPAQUE)  # grouped
        ):
            return 0
        return (
            KIND_WEIGHT[kind]
            - (kind == "timestamp" and ":" in value and "-" not in value)
            - (tool_only and kind in ("path", "url"))
            + 3 * stated
            + 3 * self.said  # the agent's conclusions, figures and names in its own words
            + 4 * asked
            + 5 * carried  # pinned or concluded before: kept ahead (no telephone game)
            + 2 * self.error
            + min(self.messages - 1, 3)
        )


#: :class:`Fact`'s fields in order, as :func:`_merged` passes them (positionally).
FACT_FIELDS = (
    "value", "kind", "message_id", "line", "messages", "stated", "order", "asked", "carried",
    "noise", "error", "said", "age", "_seen",
)  # fmt: skip


#: The least chars of a user message read as a document it pasted rather than a request
#: (:func:`_observe`: its values are not ranked as asked).
DOCUMENT_MIN_CHARS = 10_000


#: What follows a tool call's name (``get_booking({``) or an argument's key (``"booking":``)
#: where a summary quotes a call (its arguments as JSON; a function named in words,
#: ``parse_config()``, is no call).
_CALL_NAME_AFTER = "({"
_KEY_AFTER = '":'


def _call_syntax(text: str, value: str, offset: int) -> bool:
    """``value`` at ``offset`` of ``text`` (an earlier summary's) is the syntax of a tool call
    it quotes: the call's name, or an argument's key inside the call. The agent has its
    tools' names and their parameters; the call was read for facts where it was made (its
    arguments are)."""
    end = offset + len(value)
    if text.startswith(_CALL_NAME_AFTER, end):
        return True
    if not (offset > 0 and text[offset - 1] == '"' and text.startswith(_KEY_AFTER, end)):
        return False
    opened = text.rfind(_CALL_NAME_AFTER, 0, offset)
    return opened > max(text.rfind("})", 0, offset), text.rfind("\n", 0, offset))


#: offpath's note in a message it shortened, with the original's length.
_SHORTENED = re.compile(r"\[offpath: [\d,]+ of this message's ([\d,]+) chars are not shown")


def is_document(text: str) -> bool:
    """``text`` (a user message's) is a document pasted rather than a request: at least
    :data:`DOCUMENT_MIN_CHARS` chars, or shortened by offpath from that many."""
    if len(text) >= DOCUMENT_MIN_CHARS:
        return True
    note = _SHORTENED.search(text)
    return note is not None and int(note.group(1).replace(",", "")) >= DOCUMENT_MIN_CHARS


#: The kinds a block of each role is not read for (any other role: :data:`SAID_ONLY`).
_SKIPPED: dict[str, frozenset[str]] = {
    "agent": frozenset(),
    "carried": frozenset(),
    "carried said": frozenset(),
    "carried stated": frozenset(),
    "user": frozenset({"term"}),
}

#: The roles of a summary's lines of values (:func:`~offpath.compaction.facts.pin`), by the
#: label after their kind: none, ``(stated)``, ``(said)`` by the agent, ``(asked)`` by the user.
_VALUE_ROLES = frozenset({"values", "stated values", "said values", "asked values"})

#: Kinds of opaque ids: only tool output holding them, they are :attr:`Fact.grouped`.
_OPAQUE = frozenset({"sha", "trace_id", "uuid"})


class Seen(NamedTuple):
    """One value's occurrences in one message: the first one's kind, line and message id
    (a pinned entry of an earlier summary names its own), the ids of the blocks it was
    found in by :func:`find` (a tool argument alone counts no message), and how it was
    used there (see :class:`Fact`). A named tuple: a job merges thousands of them, read
    from the fact store or found, and a tuple is built five times faster than a frozen
    dataclass."""

    value: str
    kind: str
    message_id: str
    line: str
    found_in: tuple[str, ...]
    stated: bool
    asked: bool
    carried: bool
    clear: bool  # seen at least once off a noise line
    error: bool
    said: bool
    age: int  # a carried value: how many spans older than the last one it was listed in


def _observe(m: BaseMessage) -> tuple[Seen, ...]:
    """The facts of one message, in order of first appearance: what :func:`extract` merges.
    Depends on nothing but the message, so it is computed once per message (cached)."""
    seen: dict[str, dict[str, Any]] = {}
    mid0 = archived_as(m)  # what the facts cite: a request's copy, the request
    for value, line in tool_arguments(m):  # an identifier by its use: passed to a tool
        entry = seen.get(value)
        if entry is None:
            entry = seen[value] = {
                "kind": "argument",
                "message_id": mid0,
                "line": line,
                "found_in": [],
                "stated": False,
                "asked": False,
                "carried": False,
                "clear": False,
                "error": False,
                "said": False,
                "age": 0,
            }
        entry["stated"] = entry["clear"] = True
    for text, role, mid in fact_blocks(m):
        role, quoted_age = role_age(role)
        if role in _VALUE_ROLES:  # a summary's values by kind: each one
            # carried as it is, stated still if it was
            spans = split_spans(text)
            for age, value in (
                (len(spans) - 1 - k, v)
                for k, group in enumerate(spans)
                for v in split_values(group)
            ):
                if value in seen:  # quoted on a line before: how it was used still counts
                    entry = seen[value]
                    entry["stated"] = entry["stated"] or role != "values"
                    entry["asked"] = entry["asked"] or role == "asked values"
                    entry["said"] = entry["said"] or role == "said values"
                elif not looks_like_instruction(value):
                    found = find(value)
                    whole = len(found) == 1 and found[0][0] == value
                    seen[value] = {
                        "kind": found[0][1] if whole else "argument",
                        "message_id": mid,
                        "line": value,
                        "found_in": [mid],
                        "stated": role != "values",
                        "asked": role == "asked values",
                        "carried": True,
                        "clear": True,
                        "error": False,
                        "said": role == "said values",
                        "age": age,
                    }
            continue
        instruction: dict[int, bool] = {}  # line start -> the line reads as one
        noisy: dict[int, bool] = {}  # line start -> a noise line (tool output only)
        errors: dict[int, bool] = {}  # line start -> it reports an error
        test_lines = may_hold_instruction(text)
        data = role == "data"
        # a user message this long is a document pasted (a demonstration, a log, a file),
        # not a request: its values are not what the user named or fixed
        asks = role == "user" and not is_document(text)
        carried = role.startswith("carried")
        for value, kind, offset in find(text, _SKIPPED.get(role, SAID_ONLY)):
            if carried and kind in SAID_ONLY and _call_syntax(text, value, offset):
                continue
            entry = seen.get(value)
            line = ""
            start = 0
            if entry is None or test_lines or data:  # the line is needed
                start = text.rfind("\n", 0, offset) + 1
                end = text.find("\n", offset)
                line = text[start : end if end >= 0 else len(text)]
                if test_lines:
                    if start not in instruction:
                        instruction[start] = looks_like_instruction(line)
                    if instruction[start]:
                        continue
            if entry is None:
                entry = seen[value] = {
                    "kind": kind,
                    "message_id": mid,
                    "line": clip_around(line, offset - start, value),
                    "found_in": [mid],
                    "stated": False,
                    "asked": False,
                    "carried": False,
                    "clear": False,
                    "error": False,
                    "said": False,
                    "age": quoted_age,
                }
            elif mid not in entry["found_in"]:
                entry["found_in"].append(mid)
            if data:
                if start not in noisy:
                    noisy[start] = bool(NOISE_LINE.search(line))
                    errors[start] = not noisy[start] and bool(ERROR_LINE.search(line))
                if not noisy[start]:
                    entry["clear"] = True
                entry["error"] = entry["error"] or errors[start]
            else:
                entry["clear"] = True
                own = role in ("agent", "carried said")
                entry["stated"] = entry["stated"] or own or role in ("action", "carried stated")
                entry["said"] = entry["said"] or own
                entry["asked"] = entry["asked"] or asks
                entry["carried"] = entry["carried"] or role.startswith("carried")
    return tuple(
        Seen(
            value,
            e["kind"],
            e["message_id"],
            e["line"],
            tuple(e["found_in"]),
            e["stated"],
            e["asked"],
            e["carried"],
            e["clear"],
            e["error"],
            e["said"],
            e["age"],
        )
        for value, e in seen.items()
    )


#: Messages whose facts are kept per worker process (a compaction's shortened results,
#: guard, check before the swap and loss report all read the same messages, and a message
#: kept at one compaction is read again when the next one removes it).
OBSERVED_CACHE_SIZE = 8_192


#: Key digests by message object (held, so that its ``id`` stays its own) while
#: :func:`unchanged_messages` is entered; None: not entered (each key digests its message).
_DIGESTS: ContextVar[dict[int, tuple[BaseMessage, bytes]] | None] = ContextVar(
    "offpath_fact_digests", default=None
)


#: Merges and their rankings made while :func:`unchanged_messages` is entered, by the digests
#: of their messages: ``[facts, ranked or None]``, kept until it is left (None: not entered).
_KEPT: ContextVar[dict[tuple[bytes, ...], list[Any]] | None] = ContextVar(
    "offpath_fact_merges", default=None
)


@contextmanager
def unchanged_messages() -> Iterator[None]:
    """Within it (in this thread or task), a message object's key digest is computed once:
    the caller changes no message in place meanwhile (a compaction job: its thread read from
    the checkpoint, its patch made of new messages). The guard's pins, the archive's index
    and the loss report of one job each look up the facts of the same removed messages by
    their keys (tens of thousands of chars hashed each time). Its merges and rankings
    (:func:`extract`, :func:`extract_ranked`) are kept for it too, whatever other threads
    merge meanwhile (a worker's jobs at once would push each other's out of the process's
    few kept merges, and each job would merge and rank its facts again)."""
    token = _DIGESTS.set({})
    kept = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(kept)
        _DIGESTS.reset(token)


#: How a message is read for facts, in the key its facts are kept by: a change of the reading
#: (text cut by offpath read without the runs its cuts split) makes the facts another
#: process stored before it (:mod:`offpath.stores.facts`) be found again, not taken.
_READING = "cuts-2"


class _Key:
    """A message by what its facts depend on (type, id, summary marker, content, tool
    calls), hashed; it holds the message only until its facts are computed."""

    __slots__ = ("digest", "message")

    def __init__(self, message: BaseMessage) -> None:
        self.message: BaseMessage | None = message
        memo = _DIGESTS.get()
        if memo is not None and (known := memo.get(id(message))) is not None:
            if known[0] is message:
                self.digest = known[1]
                return
        content = message.content
        calls = message_field(message, "tool_calls") or ()
        text = "\x00".join(
            (
                _READING,
                message.type,
                str(message.id),
                "s" if is_summary(message) else "",
                content if isinstance(content, str) else repr(content),
                repr(calls) if calls else "",
            )
        )
        self.digest = hashlib.blake2b(
            text.encode("utf-8", "surrogatepass"), digest_size=16
        ).digest()
        if memo is not None:
            memo[id(message)] = (message, self.digest)

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and other.digest == self.digest


#: A message's facts as this process keeps them: each :class:`Seen`'s fields as a plain tuple.
#: The collector stops tracking a plain tuple of strings, numbers and such tuples at its first
#: pass; a named tuple it tracks for good, and each full collection walked the ~170,000 that
#: :data:`OBSERVED_CACHE_SIZE` messages' facts are.
Kept = tuple[tuple[Any, ...], ...]
#: Facts found by another process (:func:`preload`), by key digest, until first asked for.
_LOADED: OrderedDict[bytes, Kept] = OrderedDict()
_LOADED_LOCK = threading.Lock()
#: Per thread, how many messages' facts it found itself (``n``): :func:`found_here`.
_FOUND = threading.local()


@functools.lru_cache(maxsize=OBSERVED_CACHE_SIZE)
def _observed(key: _Key) -> Kept:
    message, key.message = key.message, None  # the cache keeps the digest, not the text
    assert message is not None
    with _LOADED_LOCK:
        loaded = _LOADED.pop(key.digest, None)
    if loaded is not None:
        return loaded
    _FOUND.n = getattr(_FOUND, "n", 0) + 1
    return tuple(map(tuple, _observe(message)))


def found_here() -> int:
    """How many messages' facts the calling thread has found itself so far, neither cached
    in this process nor taken from another (:func:`take`): a job's difference across its
    work counts the messages whose facts it paid for."""
    return int(getattr(_FOUND, "n", 0))


def facts_of(message: BaseMessage) -> tuple[Seen, ...]:
    """The facts of ``message``, found once per process and kept (as :func:`warm` keeps them)."""
    return tuple(map(Seen._make, _observed(_Key(message))))


def key_digest(message: BaseMessage) -> bytes:
    """The key a message's facts are kept by: a digest of what they depend on (type, id,
    summary marker, content, tool calls; 16 bytes). Not :func:`offpath.compaction.shorten.
    digest`, which gives a shortened result its original's digest: their facts differ."""
    return _Key(message).digest


def found_now(message: BaseMessage) -> tuple[Seen, ...]:
    """The facts of ``message``, found now and not kept in this process (for a process that
    hands them on: :class:`offpath.stores.facts.FactStore`)."""
    return _observe(message)


def take(digest: bytes, seen: Iterable[tuple[Any, ...]]) -> None:
    """Hold ``seen``, the facts of the message whose :func:`key_digest` is ``digest`` as
    another process found them (each one's :class:`Seen` fields, in order), until they are
    first asked for (then cached as if found here); at most :data:`OBSERVED_CACHE_SIZE` are
    held."""
    kept = tuple(s if type(s) is tuple else tuple(s) for s in seen)
    with _LOADED_LOCK:
        _LOADED[digest] = kept
        _LOADED.move_to_end(digest)
        while len(_LOADED) > OBSERVED_CACHE_SIZE:
            _LOADED.popitem(last=False)


#: Results of :func:`extract` kept per process, by the digests of their messages in order.
MERGED_CACHE_SIZE = 8
_MERGED: OrderedDict[tuple[bytes, ...], tuple[Fact, ...]] = OrderedDict()
_MERGED_LOCK = threading.Lock()


def warm(messages: Iterable[BaseMessage]) -> None:
    """Find the facts of each of ``messages`` and keep them (per process, as :func:`extract`
    does) before anything needs them: shortening a tool result (its marker lists the facts
    of the part not shown), the fact guard's pins and the loss report of a compaction then
    find them ready. The middleware calls it for the messages each model call is the first
    to see, on a background thread, while the model answers (else a run that
    shortens older results finds the facts of about 280,000 chars of an SRE session in its
    model calls' path)."""
    for m in messages:
        _observed(_Key(m))


def extract(messages: Sequence[BaseMessage]) -> list[Fact]:
    """The facts of ``messages``, one per distinct value, with where each was first seen
    (the line it is on) and how it was used (see :class:`Fact`).

    Lines that read as instructions to an assistant (injected text) are skipped: their
    contents are never pinned into a summary, which the model reads in the user's role.

    Each message's facts are found once per process and merged here in order (a compaction pays only
    for the messages it has not read before); the result is the
    same as reading the messages afresh. The last few results are kept too (the guard and
    the loss report of one compaction extract the same removed messages): their facts are
    shared between the calls, read them and never change them.
    """
    return list(_merged(messages)[1])


def _merged(messages: Sequence[BaseMessage]) -> tuple[tuple[bytes, ...], tuple[Fact, ...]]:
    """:func:`extract`'s facts of ``messages`` as kept (shared: never changed), with the
    digests of the messages they are kept by."""
    keys = [_Key(m) for m in messages]
    digests = tuple(k.digest for k in keys)
    own = _KEPT.get()
    if own is not None and (mine := own.get(digests)) is not None:
        return digests, mine[0]
    with _MERGED_LOCK:
        kept = _MERGED.get(digests)
        if kept is not None:
            _MERGED.move_to_end(digests)
    if kept is not None:
        if own is not None:
            own[digests] = [kept, None]
        return digests, kept
    facts: dict[str, Fact] = {}
    for key in keys:
        for seen in _observed(key):  # unpacked, each flag set only when seen: thousands a job
            value, kind, first, line, found_in, stated, asked, carried, clear, error, said, age = (
                seen
            )
            fact = facts.get(value)
            if fact is None:  # most values: made whole at once
                ids = {first, *found_in}
                # positional, in the order of :data:`FACT_FIELDS` (a test pins it to Fact's):
                # a job makes a thousand, and fourteen keywords cost 2.3x the call
                facts[value] = Fact(
                    value,
                    kind,
                    first,
                    line,
                    len(ids),  # messages
                    bool(stated),
                    len(facts),  # order
                    bool(asked),
                    bool(carried),
                    not clear,  # noise
                    bool(error),
                    bool(said),
                    age if age > 0 else 0,
                    ids,  # _seen
                )
                continue
            ids = fact._seen
            for mid in found_in:
                if mid not in ids:
                    ids.add(mid)
                    fact.messages += 1
            if clear:
                fact.noise = False
            if stated:
                fact.stated = True
            if asked:
                fact.asked = True
            if carried:
                fact.carried = True
            if error:
                fact.error = True
            if said:
                fact.said = True
            if age > fact.age:
                fact.age = age
    merged = tuple(facts.values())
    if own is not None:
        own[digests] = [merged, None]
    with _MERGED_LOCK:
        _MERGED[digests] = merged
        while len(_MERGED) > MERGED_CACHE_SIZE:
            _MERGED.popitem(last=False)
    return digests, merged


def rank(facts: Iterable[Fact]) -> list[Fact]:
    """``facts`` most important first: by :attr:`Fact.score`, then first seen first."""
    return sorted(facts, key=lambda f: (-f.score, f.order))


#: :func:`extract_ranked`'s rankings, by the digests of their messages: ``(facts, ranked)``, valid
#: while ``facts`` is what :data:`_MERGED` keeps for them.
_RANKED: dict[tuple[bytes, ...], tuple[tuple[Fact, ...], tuple[Fact, ...]]] = {}


def extract_ranked(messages: Sequence[BaseMessage]) -> tuple[list[Fact], list[Fact]]:
    """``extract(messages)`` and ``rank`` of it, ranked once per merge kept (the guard's
    pins, the archive's index and the loss report of one compaction rank the same removed
    messages' facts; a subset taken from it in order is ranked as ``rank`` ranks it: a stable
    sort on a total key)."""
    digests, facts = _merged(messages)
    own = (_KEPT.get() or {}).get(digests)  # the caller's own (unchanged_messages)
    if own is not None and own[0] is facts and own[1] is not None:
        return list(facts), list(own[1])
    with _MERGED_LOCK:
        kept = _RANKED.get(digests)
    if kept is not None and kept[0] is facts:
        order = kept[1]
    else:
        order = tuple(rank(facts))
    if own is not None and own[0] is facts:
        own[1] = order
    if kept is not None and kept[0] is facts:
        return list(facts), list(order)
    with _MERGED_LOCK:
        _RANKED[digests] = (facts, order)
        for stale in [d for d in _RANKED if d not in _MERGED]:
            del _RANKED[stale]
    return list(facts), list(order)


def stated_facts(messages: Sequence[BaseMessage]) -> list[Fact]:
    """The facts the agent stated itself, earlier summaries included (what the fidelity
    benchmark marks in a transcript)."""
    return [f for f in extract(messages) if f.stated or f.carried]
