"""How a message is read for facts: its blocks of text by role (the agent's words and tool
calls, the user's request, tool output, an earlier summary whose pinned entries are read back
as the lines and messages they cite), and the tool-call arguments that are facts by their use."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from langchain_core.messages import BaseMessage

from offpath.compaction.facts.patterns import find
from offpath.compaction.facts.sections import (
    AGE_MARK,
    ASKED_LABEL,
    EARLIER_PATTERN,
    INDEX_HEADING,
    LEFT_OUT,
    LISTED_PATTERN,
    PINNED_HEADING,
    QUOTED_PATTERN,
    SAID_LABEL,
    SAID_MARK,
    SINCE_HEADING,
    STATED_LABEL,
    SWAP_HEADING,
    VALUES_PATTERN,
    argument_head,
    without_cut_runs,
)
from offpath.compaction.fields import message_field
from offpath.compaction.frontier import KEPT_AFTER, QUOTED_BELOW
from offpath.compaction.summary import HEADINGS, archived_as, is_summary, summary_body

#: How a summary points at a clipped request's message, or at a request in view
#: (:func:`frontier.into_summary`, :func:`frontier.pointer_line`): ids offpath cites.
_CITATION = re.compile(
    r' \(whole: recall\("[^"]*"\)\)|(?<=\*\*Investigating:\*\* )the request of message \S+, '
    rf"(?:{re.escape(QUOTED_BELOW)}|{re.escape(KEPT_AFTER)})$",
    re.M,
)
#: offpath's own words in a summary's body: a note in italics on a line of its own (the
#: offline summarizer's, the recall line) and what a section says once its lines were left
#: out for space. They name no fact of the session (``recall``, ``messages._``).
_OWN_WORDS = re.compile(rf"^_[^\n]*_$|{re.escape(LEFT_OUT)}", re.M)
#: How offpath points at an archived message (a shortened result's marker, a summary):
#: ``recall("48596bb7", offset=1200)``.
_RECALL_CALL = re.compile(r'recall\("[^"\n]{1,80}"(?:, offset=\d+)?\)')


def fact_blocks(message: BaseMessage) -> Iterable[tuple[str, str, str]]:
    """``(text, role, message_id)`` for each block of a message worth reading for facts.
    ``role``: ``agent`` (its text: its conclusions in its own words), ``action`` (each of its
    tool calls with the first line of each argument), ``user`` (a request), ``carried`` (an
    earlier summary: what was concluded before; its pinned entries are read as the line they
    quote and the message they name, so a fact pinned again keeps its source; ``carried
    said``: the agent's place its body keeps, offpath's own words left out, and a quoted line
    of the agent's own words; ``carried stated``: its findings in words; either followed by `` <n>`` for a line pinned ``n`` compactions
    before, :func:`role_age`; ``stated values``: the scalar arguments of a tool call it
    quotes, in its body or on a pinned line), ``data`` (tool output, the rest of a
    multi-line argument)."""
    from offpath.compaction.accounting import render_content

    mid = archived_as(message)  # what its facts cite: a request's copy, the request
    if is_summary(message):
        text = without_cut_runs(summary_body(message))
        cut = min(
            (
                i
                for i in (
                    text.find(PINNED_HEADING),
                    text.find(SINCE_HEADING),
                    text.find(SWAP_HEADING),
                )
                if i >= 0
            ),
            default=len(text),
        )
        end = text.find(INDEX_HEADING)
        if 0 <= end < cut:
            cut = end  # no pinned entries after the index: it ends the part read back
        body, pinned = text[:cut], text[cut:]
        # ids offpath cites are not facts; the agent's place the body keeps (its request,
        # state, plan, what is done: their words) is read back as said, so that a value the
        # agent said keeps its rank beside the values listed as said once the body that held
        # it is rewritten; the findings in words as stated, ranked with what the agent relied
        # on, above what only a tool held; the lines it quotes from tool output as carried
        for part, role in _body_parts(_OWN_WORDS.sub("", _CITATION.sub("", body))):
            yield part, role, mid
            # a tool call its body quotes (the agent's place: its last call): the arguments
            # were facts by their use, whatever their shape, as on a quoted line below
            if named := _call_arguments(part):
                yield named, "stated values", mid
        sections = (PINNED_HEADING, SINCE_HEADING, SWAP_HEADING)
        within = True  # in a section of pinned entries (not the archive index, a quote after)
        for line in pinned.splitlines()[1:]:
            if line.startswith("**"):
                within = line.startswith(sections)
                continue
            if not within:
                continue
            if quoted := QUOTED_PATTERN.match(line.strip()):
                marks = quoted["tail"].split("; ")
                role = "carried said" if SAID_MARK.lstrip("; ") in marks else "carried"
                age = next((m[4:] for m in marks if AGE_MARK.lstrip("; ") in m), "0")
                yield (
                    quoted["line"],
                    f"{role} {age}" if age.isdigit() and age != "0" else role,
                    (quoted["id"]),
                )
                # a quoted tool call: its arguments were facts by their use, whatever their
                # shape (SDZQKO)
                if named := _call_arguments(quoted["line"]):
                    yield named, "stated values", quoted["id"]
            elif listed := LISTED_PATTERN.match(line.strip()):
                yield listed["values"].replace("`", ""), "carried", listed["id"]
            elif compact := EARLIER_PATTERN.match(line.strip()):
                yield compact["values"].replace("`", ""), "carried", mid
            elif values := VALUES_PATTERN.match(line.strip()):
                label = values["stated"]
                labelled = {
                    STATED_LABEL: "stated values",
                    SAID_LABEL: "said values",
                    ASKED_LABEL: "asked values",
                }.get(label)
                yield values["values"], labelled or "values", mid
        return
    role = {"ai": "agent", "human": "user"}.get(message.type, "data")
    text = without_cut_runs(render_content(message.content))  # no value cut mid-word
    if 'recall("' in text:  # a shortened result's pointer: ids offpath cites are not facts
        text = _RECALL_CALL.sub("recall(...)", text)
    yield text, role, mid
    for call in message_field(message, "tool_calls") or []:
        # the call with the first line of each argument is the agent's action (stated); the
        # rest of a multi-line argument (a heredoc, a file's new content) is data it wrote
        call_args = call.get("args") or {}
        heads = {k: argument_head(v) if isinstance(v, str) else v for k, v in call_args.items()}
        yield (
            f"{call.get('name')}({json.dumps(heads, ensure_ascii=False, default=str)})",
            "action",
            mid,
        )
        for value in call_args.values():
            if isinstance(value, str) and "\n" in value:
                yield value.split("\n", 1)[1], "data", mid


#: A line of a summary's body that quotes tool output (the offline summarizer's
#: ``- `Replicas: 1 desired` (kubectl_describe output)``): data, not what anyone said.
QUOTED_OUTPUT = re.compile(r"` \([^()\s]+ output\)")


def _body_parts(body: str) -> list[tuple[str, str]]:
    """``body`` (a summary's text before its pinned entries) cut into runs of lines, in
    order, each with its role: ``carried said`` for the agent's place (the request, the
    state, the plan, what is done: the agent's and the user's words, word for word),
    ``carried stated`` for the findings in words (what the summarizer chose to say), and
    ``carried`` for a line quoting tool output."""
    parts: list[tuple[list[str], str]] = []
    findings = False
    for line in body.split("\n"):
        if line.startswith("**"):
            findings = line.startswith(HEADINGS[1])
        if QUOTED_OUTPUT.search(line):
            role = "carried"
        else:
            role = "carried stated" if findings else "carried said"
        if not parts or parts[-1][1] != role:
            parts.append(([], role))
        parts[-1][0].append(line)
    return [("\n".join(lines), role) for lines, role in parts]


#: Between the values of two spans on a line of values: ``- ids: a, b; c, d`` (``a, b``
#: pinned by an earlier compaction than ``c, d``); not inside a value quoted as code.
_SPAN_SEPARATOR = re.compile(r"; (?=(?:[^`]*`[^`]*`)*[^`]*$)")


def split_spans(text: str) -> list[str]:
    """The groups of values of a line :func:`pin` lists by value, oldest span first."""
    return _SPAN_SEPARATOR.split(text)


def role_age(role: str) -> tuple[str, int]:
    """A block's role (see :func:`fact_blocks`) and the age of a carried quoted line (``carried
    said 3``: pinned 3 compactions before the summary that holds it; 0: none given)."""
    base, _, age = role.rpartition(" ")
    if base.startswith("carried") and age.isdigit():
        return base, int(age)
    return role, 0


def split_values(text: str) -> list[str]:
    """The values of one span's group of a line :func:`pin` lists by value: separated by
    ``, ``, one that holds a separator quoted as code."""
    out: list[str] = []
    for m in re.finditer(r"`([^`]*)`|([^,`]+(?:,(?! )[^,`]*)*)", text):
        value = (m.group(1) if m.group(1) is not None else m.group(2) or "").strip()
        if value:
            out.append(value)
    return out


def _one_value_less(line: str) -> tuple[str, str] | None:
    """``line`` (a line of values by kind) with one value fewer, and that value: the longest
    (the last at a tie) of its span group that holds the most values (of groups as large, the
    oldest). None: it holds one value, or it is not such a line."""
    values = VALUES_PATTERN.match(line.strip())
    if values is None:
        return None
    groups = [split_values(g) for g in split_spans(values["values"])]
    if sum(len(g) for g in groups) < 2:
        return None
    k = max(range(len(groups)), key=lambda i: (len(groups[i]), -i))
    group = groups[k]
    j = max(range(len(group)), key=lambda i: (len(group[i]), i))
    gone = group.pop(j)
    shown = [", ".join(f"`{v}`" if ", " in v or "; " in v else v for v in g) for g in groups]
    head = line[: line.index(": ") + 2]
    return head + "; ".join(x for x in shown if x), gone


def without_one_value(line: str) -> str | None:
    """``line``, a line of values by kind (``- names (said): a, b; c``), with one value fewer:
    the longest of its span group that holds the most values (of groups as large, the
    oldest), so that every span keeps its share as the line shrinks and the fewest facts go
    for the chars freed. None: it holds one value, or it is not such a line."""
    less = _one_value_less(line)
    return None if less is None else less[0]


def give_up_cost(line: str) -> int:
    """Chars a fact given up from ``line`` frees: the value :func:`without_one_value` would
    take out of it (and its separator), or the whole line when it is no line of values (or
    holds one value). A summary over its budget gives up the dearest first: the fewest facts
    go for the chars it must free (a 40-char pod name before four 8-char figures)."""
    less = _one_value_less(line)
    return len(line) if less is None else len(less[1]) + 2


#: A tool argument's value that is an identifier by its use: one token, no spaces.
_TOKEN_VALUE = re.compile(r"^[#\w][\w.:/@#+-]{2,79}$")


#: The scalar arguments of a quoted tool call's line: ``get_booking({"booking": "SDZQKO"})``.
_CALL_ARGS = re.compile(r'"[\w.-]{1,40}": (?:"([#\w][\w.:/@#+-]{2,79})"|(\d{4,20}))(?=[,}\]])')


def _is_token(text: str) -> bool:
    """``text`` (a tool argument's scalar value) names something: a token with a digit or a
    separator, or in capitals (``XEHQWM``); not a word, not a count under 4 digits."""
    if text.isdigit() and len(text) < 4:  # a count, a limit: not a name
        return False
    return bool(_TOKEN_VALUE.match(text) and not text.isalpha()) or (
        text.isupper() and 4 <= len(text) <= 12
    )


def _call_arguments(text: str) -> str:
    """The scalar arguments of the tool calls ``text`` quotes that name something
    (:func:`_is_token`), as a line of values (``, `` between them); "" for none."""
    return ", ".join(a or b for a, b in _CALL_ARGS.findall(text) if _is_token(a or b))


def read_back(line: str) -> frozenset[str]:
    """The values the next summary reads from ``line`` when an earlier one quoted it
    (:func:`fact_blocks`: the facts :func:`find` gives, and a quoted tool call's scalar
    arguments), as they are written there. A value a tool call passed is a fact by its use,
    whatever its shape (``PUNERT``); on a quoted line of output :func:`find` alone reads it,
    and one of no shape of its own is not read back."""
    values = {v for v, _, _ in find(line)}
    values.update(v for v in _call_arguments(line).split(", ") if v)
    return frozenset(values)


def tool_arguments(message: BaseMessage) -> Iterable[tuple[str, str]]:
    """``(value, line)`` for each scalar argument of the message's tool calls that is one
    token (an id, a name, a number: ``{"reservation_id": "XEHQWM"}``), with the call's line:
    what the agent passed to a tool is a fact whatever its shape."""
    for call in message_field(message, "tool_calls") or []:
        args = call.get("args") or {}
        line = f"{call.get('name')}({json.dumps(args, ensure_ascii=False, default=str)[:200]})"
        stack: list[Any] = [args]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item[:50])
            elif isinstance(item, str | int) and not isinstance(item, bool):
                if _is_token(str(item)):
                    yield str(item), line
