"""JSON carried inside a string of a message (an OpenAI tool call's ``arguments``, the
arguments of a tool call in ``additional_kwargs``, a streamed call's ``args``, a server tool
call's ``args`` in the content): langchain_core parses it when it builds the message, after
the body's checks have seen only a string. :func:`check_message` reads each such string once,
with the body's own rules, before anything measures or stores it:

* the streaming scan (:class:`~.scan.JsonScan`): nesting counted from where the value lands
  in the message (an object there could not be deeper than ``MAX_JSON_DEPTH`` in the body),
  and its values counted with the body's against ``MAX_JSON_VALUES`` (:class:`JsonBudget`:
  one turn's total);
* the stores' rule (:func:`~offpath.stores.values.unstorable`): no NUL character, lone
  surrogate, integer beyond 64 bits, NaN or Infinity in the parsed value.

An OpenAI tool call's ``arguments`` text is replaced by the object it holds (``arguments``
may be either), so it is parsed once; the other strings are kept as sent and langchain_core
reads them again, within the limits checked here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.utils.json import parse_partial_json

from .checks import unstorable
from .scan import JsonScan, TooMuch

#: Content blocks whose ``args`` text an ``AIMessageChunk`` parses (langchain_core's
#: ``init_server_tool_calls``).
SERVER_CALL_BLOCKS = frozenset({"server_tool_call", "server_tool_call_chunk"})


@dataclass(slots=True)
class JsonBudget:
    """What the JSON inside a turn's strings may still hold: ``max_depth`` (the body's
    ``MAX_JSON_DEPTH``) and ``values_left``: ``MAX_JSON_VALUES`` less the values the body's
    scan counted, less those of the strings read so far; ``max_values`` names the setting's
    value in an answer."""

    max_depth: int
    max_values: int
    values_left: int


@dataclass(frozen=True, slots=True)
class _Slot:
    """A string of a message that is parsed as JSON: where it is (``path``, as 422 answers
    name fields), how many arrays and objects of the body hold it (``depth``), its holder
    and key (to put the parsed value in its place), and how it is parsed (``partial``:
    langchain_core's ``parse_partial_json``, for a streamed call's ``args``)."""

    path: str
    depth: int
    holder: dict[str, Any]
    key: str
    replace: bool = False
    partial: bool = False


def check_message(item: Any, path: str, budget: JsonBudget) -> tuple[Any, str | None]:
    """``(item, problem)``: ``item`` (one message as the client sent it, at ``path`` in the
    body, e.g. ``messages[3]``) with each OpenAI ``arguments`` text replaced by the object it
    holds, and the first problem of a JSON string in it (``"<field>: <what is wrong>"``,
    naming the setting), or None. The message's own fields were checked already (the body's
    scan, :func:`~offpath.stores.values.unstorable`); ``item`` itself is left unchanged."""
    if not isinstance(item, Mapping):
        return item, None
    item = _copy(item)
    for slot in _slots(item, path):
        text = slot.holder[slot.key]
        if not text.strip():
            continue  # blank arguments: no arguments (compaction.formats reads them so)
        value, problem = _read(text, slot, budget)
        if problem is not None:
            return item, problem
        if slot.replace and isinstance(value, Mapping):
            slot.holder[slot.key] = value
    return item, None


def _read(text: str, slot: _Slot, budget: JsonBudget) -> tuple[Any, str | None]:
    """``text`` scanned, parsed and checked as the body is: ``(value, None)``, or ``(None,
    problem)``. A text that is not JSON is left to the message's own checks (a 422 for an
    OpenAI call's arguments, an invalid tool call for langchain_core): ``(None, None)``."""
    room = max(0, budget.max_depth - slot.depth)
    scan = JsonScan(room, budget.values_left, max_messages=budget.values_left + 1)
    try:
        scan.feed(text.encode("utf-8", "surrogatepass"))
    except TooMuch as exc:
        if "closes nothing" in exc.detail:
            return None, None  # not JSON: as the parser would find
        if "MAX_JSON_DEPTH" in exc.detail:
            return None, (
                f"{slot.path}: JSON nested deeper than {budget.max_depth} levels, counted "
                "from the body (MAX_JSON_DEPTH)"
            )
        return None, (
            f"{slot.path}: the body and the JSON inside its strings hold more than "
            f"{budget.max_values} values (MAX_JSON_VALUES)"
        )
    budget.values_left -= scan.values
    try:
        value = json.loads(text, strict=False)  # as langchain_core reads it
    except ValueError:
        if not slot.partial:
            return None, None
        try:
            value = parse_partial_json(text)
        except ValueError:
            return None, None
    return value, unstorable(value, slot.path)


def _slots(message: dict[str, Any], path: str) -> Iterator[_Slot]:
    """The strings of ``message`` that langchain_core parses as JSON when it builds it (a
    copy: :func:`_copy`), as :class:`_Slot` s; depth 2 is the body and its ``messages``."""
    data = message.get("data")
    if isinstance(data, dict) and "type" in message:  # serialized: {type, data}
        at, depth = f"{path}.data", 4
        yield from _calls(data.get("additional_kwargs"), f"{at}.additional_kwargs", depth + 1)
        for k, chunk in _dicts(data.get("tool_call_chunks")):
            if isinstance(chunk.get("args"), str):
                yield _Slot(
                    f"{at}.tool_call_chunks[{k}].args", depth + 2, chunk, "args", False, True
                )
        for k, block in _dicts(data.get("content")):
            if block.get("type") in SERVER_CALL_BLOCKS and isinstance(block.get("args"), str):
                yield _Slot(f"{at}.content[{k}].args", depth + 2, block, "args")
        return
    yield from _calls(message, path, 3, replace=True)
    yield from _calls(message.get("additional_kwargs"), f"{path}.additional_kwargs", 4, True)
    legacy = message.get("function_call")
    if isinstance(legacy, dict) and isinstance(legacy.get("arguments"), str):
        yield _Slot(f"{path}.function_call.arguments", 4, legacy, "arguments", True)


def _calls(holder: Any, path: str, depth: int, replace: bool = False) -> Iterator[_Slot]:
    """The ``arguments`` texts of the OpenAI tool calls in ``holder["tool_calls"]`` (``holder``
    at ``depth``)."""
    if not isinstance(holder, dict):
        return
    for k, call in _dicts(holder.get("tool_calls")):
        function = call.get("function")
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            where = f"{path}.tool_calls[{k}].function.arguments"
            yield _Slot(where, depth + 3, function, "arguments", replace)


def _dicts(items: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    if isinstance(items, list):
        for k, item in enumerate(items):
            if isinstance(item, dict):
                yield k, item


def _copy(item: Mapping[str, Any]) -> dict[str, Any]:
    """``item`` with the dicts and lists on the way to its JSON strings copied (not the values
    themselves): a slot's holder can take the parsed value without changing the caller's."""
    out = dict(item)
    data = out.get("data")
    if isinstance(data, Mapping) and "type" in out:
        out["data"] = data = dict(data)
        _copy_calls(data, "additional_kwargs")
        for key in ("tool_call_chunks", "content"):
            if isinstance(data.get(key), list):
                data[key] = [dict(x) if isinstance(x, Mapping) else x for x in data[key]]
        return out
    _copy_calls(out)
    _copy_calls(out, "additional_kwargs")
    if isinstance(out.get("function_call"), Mapping):
        out["function_call"] = dict(out["function_call"])
    return out


def _copy_calls(holder: dict[str, Any], key: str | None = None) -> None:
    """``holder`` (or ``holder[key]``) with its ``tool_calls`` list, each call and its
    ``function`` copied."""
    if key is not None:
        if not isinstance(holder.get(key), Mapping):
            return
        holder[key] = holder = dict(holder[key])
    calls = holder.get("tool_calls")
    if not isinstance(calls, list):
        return
    copied = []
    for call in calls:
        if isinstance(call, Mapping):
            call = dict(call)
            if isinstance(call.get("function"), Mapping):
                call["function"] = dict(call["function"])
        copied.append(call)
    holder["tool_calls"] = copied
