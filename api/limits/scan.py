"""The streaming check of a JSON body (:class:`JsonScan`): one pass over its bytes as they
arrive, that raises :class:`TooMuch` as soon as the body is nested too deep, holds too many
values or too many ``messages``, before anything is parsed.
"""

from __future__ import annotations

import json
import re

from .checks import short

#: How many bytes of an object key the streaming check keeps (to name a field).
KEY_BYTES = 128
#: A token: a whole string (its closing quote in group 1: absent when the chunk ends inside
#: it) or a structural char. Numbers, true, false, null and spaces are skipped in C.
#: Possessive: the regex engine keeps no state per char of a string (a backtracking pattern
#: costs ~115 bytes of memory per char).
_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(")?|[\[\]{},:]', re.DOTALL)
#: An integer orjson would read as a float (beyond 64 bits): the standard parser reads it.
_LONG_DIGITS = re.compile(rb"\d{19}")
#: Tokens (strings, keys, ``:``, ``,``, brackets) a body may hold per value it may hold: a
#: member ``"k": {},`` is five tokens for one counted value, the most any valid JSON spends.
TOKENS_PER_VALUE = 6
#: The rest of a string that began in an earlier chunk, up to its closing quote.
_STRING_REST = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.DOTALL)


class _Open:
    """An array or object the scan is inside: its items so far (counted at each comma, and
    at its end for one of a single item), whether anything but spaces came after its
    opening bracket, and (an object) the key of the member it is in."""

    __slots__ = ("is_object", "items", "seen", "key", "want_key")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.items = 0
        self.seen = False
        self.key: str | None = None
        self.want_key = is_object


class TooMuch(Exception):
    """A body over one of the limits: ``status`` (413 or 422) and ``detail`` (one line that
    names the field and the setting)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class JsonScan:
    """One pass over a JSON body's bytes as they arrive, chunk by chunk (:meth:`feed`):
    raises :class:`TooMuch` as soon as the body is over a limit, before anything is parsed.

    * nesting deeper than ``max_depth`` arrays and objects (a parser would recurse into it);
    * more than ``max_values`` values in all (array items and object members, at any
      depth): each costs a Python object, a validation and an error line (a 2 MB list of a
      million items costs 1.6 GB and 43 s);
    * more than ``max_messages`` items in the top-level ``messages`` array (``/turns``);
    * more tokens than ``max_values`` values can hold (:data:`TOKENS_PER_VALUE` each): every
      token is a step of the scan, also those that count no value (``:``, keys, a run of
      commas or strings), so a body of them costs no more than one of values;
    * a ``]`` or ``}`` that closes nothing (no JSON text holds one).

    It reads structure only (brackets, commas, where strings start and end, keys), with one
    regular expression that skips strings, numbers and spaces in C: the JSON is not
    validated, which the parser does afterwards. Memory: a few bytes per open array or
    object. A raw NUL byte (no JSON text holds one: UTF-16 or UTF-32, which the scan could
    not read) is refused too.
    """

    def __init__(self, max_depth: int, max_values: int, max_messages: int) -> None:
        self.max_depth = max_depth
        self.max_values = max_values
        self.max_messages = max_messages
        self.stack: list[_Open] = []
        self.values = 0
        self.tokens = 0
        self.read = 0  # bytes fed before this chunk
        self.max_tokens = TOKENS_PER_VALUE * max_values + 2 * max_depth + 2
        self.in_string = False
        self.escaped = False  # a chunk ended inside a string's escape (a backslash)
        self.key: bytearray | None = None  # the key being read (its first KEY_BYTES)
        #: 19 digits in a row somewhere (a number orjson would not read exactly, or text)
        self.long_digits = False
        self._tail = b""  # the last bytes of the previous chunk (digits across chunks)

    def feed(self, data: bytes) -> None:
        """Scan the next ``data`` of the body; raises :class:`TooMuch`."""
        if b"\x00" in data:
            raise TooMuch(422, "body: not UTF-8 JSON (it holds a NUL byte)")
        if not self.long_digits:
            self.long_digits = bool(_LONG_DIGITS.search(self._tail + data[:32]))
            self.long_digits = self.long_digits or bool(_LONG_DIGITS.search(data))
            self._tail = (self._tail + data[-18:])[-18:]
        pos = self._string(data) if self.in_string else 0
        stack = self.stack
        top = stack[-1] if stack else None
        for m in _TOKEN.finditer(data, pos):
            self.tokens += 1
            if self.tokens > self.max_tokens:
                raise TooMuch(
                    422,
                    f"body: more tokens than {self.max_values} JSON values hold (MAX_JSON_VALUES)",
                )
            at, end = m.span()
            c = data[at]
            if top is not None and not top.seen:
                # its first item: a string or bracket here, or a number or literal before
                top.seen = c == 0x22 or c == 0x5B or c == 0x7B or bool(data[pos:at].strip())
            pos = end
            if c == 0x22:  # a string
                closed = m.end(1) >= 0
                if top is not None and top.want_key:
                    key = data[at + 1 : min(end - closed, at + 1 + KEY_BYTES)]
                    if closed:
                        top.key, top.want_key = _key_text(key), False
                    else:
                        self.key = bytearray(key)
                if not closed:  # it goes on in the next chunk
                    self.in_string = True
                    # a backslash left over at the end escapes the next chunk's first char
                    self.escaped = end < len(data)
                    if self.escaped and self.key is not None:
                        self.key += b"\\"
            elif c == 0x2C:  # ,
                if top is not None:
                    top.items = (top.items or 1) + 1
                    self._count(top, 2 if top.items == 2 else 1)
                    top.want_key = top.is_object
            elif c == 0x3A:  # :
                if top is not None:
                    top.want_key = False
            elif c == 0x5D or c == 0x7D:  # ] }
                if top is None:
                    where = self.read + at
                    raise TooMuch(
                        422, f"body: not JSON (the {chr(c)} at byte {where} closes nothing)"
                    )
                if not top.items and top.seen:  # a single item
                    top.items = 1
                    self._count(top, 1)
                stack.pop()
                top = stack[-1] if stack else None
            else:  # [ {
                if len(stack) >= self.max_depth:
                    raise TooMuch(
                        422,
                        f"{self.path()}: nested deeper than {self.max_depth} levels "
                        "(MAX_JSON_DEPTH)",
                    )
                top = _Open(c == 0x7B)
                stack.append(top)
        if top is not None and not top.seen and not self.in_string:
            top.seen = bool(data[pos:].strip())
        self.read += len(data)

    def _string(self, data: bytes) -> int:
        """Skip the rest of a string that began in an earlier chunk; returns where the scan
        goes on (``len(data)``: the string goes on in the next chunk too)."""
        pos = 0
        if self.escaped:
            self.escaped = False
            pos = 1  # the escaped char
        quote = data.find(b'"', pos)
        stop = quote if quote >= 0 else len(data)
        if data.find(b"\\", pos, stop) >= 0:  # an escape before it: the regex, in C
            stop = _STRING_REST.match(data, pos).end()  # type: ignore[union-attr]
        if self.key is not None and len(self.key) < KEY_BYTES:
            self.key += data[: min(stop, KEY_BYTES)]
        if stop >= len(data):
            return len(data)
        if data[stop] == 0x5C:  # a backslash ends the chunk: its char is in the next one
            self.escaped = True
            if self.key is not None and len(self.key) < KEY_BYTES:
                self.key += b"\\"
            return len(data)
        self.in_string = False  # data[stop] is the closing quote
        if self.key is not None:
            self.stack[-1].key, self.stack[-1].want_key = _key_text(bytes(self.key)), False
            self.key = None
        return stop + 1

    def _count(self, top: _Open, n: int) -> None:
        self.values += n
        if self.values > self.max_values:
            raise TooMuch(422, f"body: more than {self.max_values} JSON values (MAX_JSON_VALUES)")
        if (
            top.items > self.max_messages
            and len(self.stack) == 2
            and top is self.stack[1]
            and not top.is_object
            and self.stack[0].is_object
            and self.stack[0].key == "messages"
        ):
            raise TooMuch(
                422,
                f"messages: more than {self.max_messages} messages in one turn (MAX_TURN_MESSAGES)",
            )

    def path(self) -> str:
        """Where the scan is, as the 422 answers name fields: ``messages[3].content`` (at
        most 120 chars: the start of a deep path names the field)."""
        out = ""
        for level in self.stack:
            if level.is_object:
                out += f".{short(level.key or '?', 40)}"
            else:
                out += f"[{max(0, level.items - 1)}]"
            if len(out) > 120:
                return out.lstrip(".")[:120] + "..."
        return out.lstrip(".") or "body"


def _key_text(raw: bytes) -> str:
    """An object key as the parser will read it (escapes decoded: ``"mess\\u0061ges"`` is
    ``messages``), or its raw text if it does not decode."""
    if b"\\" in raw:
        try:
            return str(json.loads(b'"' + raw + b'"'))
        except ValueError:
            pass
    return raw.decode("utf-8", "replace")
