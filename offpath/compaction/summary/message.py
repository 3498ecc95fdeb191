"""The summary message itself: its prefix line, marker and metadata, the seed's template its
text follows (the headings, the check against them, the text's budget and how a text is
fitted into it), how it cites a message id, how it is built (:func:`build_summary_message`)
and recognised (:func:`is_summary`), and what is read back from it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

from offpath.compaction.accounting import content_text

#: The first line of every summary message (the seed's checkpoint shows it).
SUMMARY_PREFIX = "[Context from earlier in this session, summarized]"
#: ``additional_kwargs["lc_source"]`` of a summary message.
SUMMARY_SOURCE = "summarization"
#: Heading of the quoted request of a turn that was cut in the middle: the turn the kept
#: messages start in, which may be answered by now (the frontier's lines say whether it is
#: done; "of the turn in progress" named a finished turn when the thread had gone on).
REQUEST_HEADING = "**Request of the turn the kept messages start in (verbatim):**"
#: The heading earlier summaries used for it, still read back (:func:`summary_request`).
OLD_REQUEST_HEADINGS = ("**Request of the turn in progress (verbatim):**",)
#: The summary's last line (the summary tells the model the tool exists).
RECALL_NOTE = "_The originals are archived: `recall` reads them (words or a message id)._"

#: A LangGraph message id (a UUID), which a summary cites by its first 8 hex chars.
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: How many leading hex chars of a UUID a citation keeps (``recall`` resolves them).
CITED_UUID_CHARS = 8


def cite(message_id: str) -> str:
    """``message_id`` as a summary, a pinned fact or a shortened result names it: a UUID (the
    ids LangGraph gives messages) by its first :data:`CITED_UUID_CHARS` hex chars, any other id
    whole. ``recall`` resolves such a prefix within the thread
    (:func:`offpath.agent.recall.answer`). Issue 19: a 36-char id per pinned entry took a
    third of a small summary's budget from the facts."""
    if _UUID.fullmatch(message_id):
        return message_id[:CITED_UUID_CHARS]
    return message_id


def overhead_chars(request: str | None) -> int:
    """Chars of a summary message that are not its text nor its pinned facts: the prefix line,
    the recall line, a quoted request with its heading, and the blank lines between them."""
    quoted = len(REQUEST_HEADING) + 3 + len(request) if request else 0
    return len(SUMMARY_PREFIX) + 2 + 2 + len(RECALL_NOTE) + quoted


#: The seed's template headings, in order; every summary must have them.
HEADINGS = ("**Investigating:**", "**Key findings:**", "**Ruled out:**", "**Current state:**")


def template_problem(text: str) -> str | None:
    """What is wrong with a summary's text against the seed's template (its four headings, in
    order, the first one first), or None."""
    body = text.strip()
    at = -1
    for heading in HEADINGS:
        found = body.find(heading, at + 1)
        if found < 0:
            return f"it has no {heading} heading"
        if found < at:
            return "its headings are out of order"
        at = found
    if not body.startswith(HEADINGS[0]):
        return f"it does not start with {HEADINGS[0]}"
    return None


#: A model declining the task in its own voice ("I'm sorry, but I can't help with that"),
#: written inside the template's headings or instead of them.
_REFUSAL = re.compile(
    r"\b(?:I(?:'m| am) sorry|I apologi[sz]e|Unfortunately)\b[^.\n]{0,80}?\b(?:can(?:no|')t|"
    r"unable|not able|won'?t)\b"
    r"|\bI (?:can(?:no|')t|am unable to|'m unable to|won'?t|will not|am not able to) "
    r"(?:help|assist|comply|provide|summari[sz]e|do that|fulfil|complete|continue)\b"
    r"|\bAs an AI(?: language model)?\b",
    re.IGNORECASE,
)


def refusal_problem(text: str) -> str | None:
    """A summary whose body is a model's refusal (its own words declining the task, with
    little else): what to say of it, or None. A finding that quotes a tool's "cannot connect"
    is not one: the refusal is in the first person, and most of the body says nothing else."""
    body = text
    for heading in HEADINGS:
        body = body.replace(heading, "")
    found = _REFUSAL.search(body)
    if found is None:
        return None
    rest = _REFUSAL.sub("", body)
    words = len(re.findall(r"[A-Za-z0-9]{3,}", rest))
    if words > 60:  # a real summary that happens to quote such words
        return None
    return f"the model declined the task ({found.group(0)!r})"


def text_cap(summary_chars: int) -> int | None:
    """Most chars a summarizer's text may use when the summary's text and pinned facts share
    ``summary_chars`` (``CompactionPlan.summary_chars``; 0: no bound): two thirds, the rest
    is left to the fact guard's Pinned facts."""
    return max(400, summary_chars * 2 // 5) if summary_chars else None


def words_for(chars: int | None) -> int:
    """The word limit a summarizer is given for ``chars`` chars of text (the seed's 400 words,
    fewer on a small budget; about 7 chars a word)."""
    return 400 if chars is None else max(60, min(400, chars // 7))


def fit_text(text: str, cap: int | None) -> str:
    """``text`` (a summary in the seed's template) in at most ``cap`` chars: the last Key
    findings bullets go first, then every line is clipped; the four headings always stay.
    Returns it unchanged when it fits (or ``cap`` is None)."""
    if cap is None or len(text) <= cap:
        return text
    lines = text.splitlines()
    bullets = [i for i, line in enumerate(lines) if line.lstrip().startswith("- ")]
    while bullets and len("\n".join(lines)) > cap:
        del lines[bullets.pop()]
    if len("\n".join(lines)) <= cap:
        return "\n".join(lines)
    # then lines that are neither a heading nor a finding (notes, blank lines), then clip
    lines = [ln for ln in lines if ln.startswith(HEADINGS) or ln.lstrip().startswith("- ")]
    while len("\n".join(lines)) > cap:
        longest = max(range(len(lines)), key=lambda i: len(lines[i]))
        line = lines[longest]
        heading = next((h for h in HEADINGS if line.startswith(h)), "")
        room = max(len(heading), len(line) - (len("\n".join(lines)) - cap) - 3)
        if room >= len(line) - 3:  # nothing more to clip: the headings alone
            break
        # a line clipped to a few words says nothing ("**Ruled out:** not..."): its heading
        lines[longest] = line[:room].rstrip() + "..." if room > len(heading) + 16 else heading
    return "\n".join(lines)


def is_summary(message: BaseMessage) -> bool:
    """True when ``message`` carries the summary marker: ``lc_source: "summarization"`` in
    ``additional_kwargs`` (what offpath writes), or ``summary: true`` (the cases' format
    for a summary imported from elsewhere).

    Only the marker counts, never the text: a user message that happens to open with
    :data:`SUMMARY_PREFIX` (a pasted note) is a request like any other (the ``prefix-in-user-text``
    case). A marked message is folded into the next summary,
    but what its metadata claims (job id, replaced counts) is never trusted: offpath
    counts usage only from its own job records (DESIGN.md invariant 10).
    """
    if message.type != "human":
        return False
    extra = message.additional_kwargs
    return extra.get("lc_source") == SUMMARY_SOURCE or extra.get("summary") is True


def summary_meta(message: BaseMessage) -> Mapping[str, Any]:
    """The metadata dict of a summary message (empty for one without it). A client can send
    any of it: read it as data (:func:`compactions_of`, :func:`summary_request`)."""
    meta = message.additional_kwargs.get("summary")
    return meta if isinstance(meta, Mapping) else {}


#: Most compactions a summary may claim to fold in (more is taken for a forged count).
MAX_COMPACTIONS = 1_000_000


def compactions_of(message: BaseMessage) -> int:
    """How many compactions an earlier summary folds in: its metadata's ``compactions`` when
    that is a whole number from 1 to :data:`MAX_COMPACTIONS`, else 1. A client's marker
    said ``"abc"`` or ``2**64-1``, and every job of the session failed."""
    value = summary_meta(message).get("compactions", 1)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_COMPACTIONS:
        return value
    return 1


def summary_request(message: BaseMessage) -> str | None:
    """The request a summary quotes under :data:`REQUEST_HEADING`, read from its text (what
    the model saw, in the user's role), never from its metadata, which a client may forge
    (``additional_kwargs`` never reach a summary)."""
    content = content_text(message.content)
    for heading in (REQUEST_HEADING, *OLD_REQUEST_HEADINGS):
        _, sep, request = content.partition(f"\n\n{heading}\n")
        if sep:
            return request.strip() or None
    return None


def fingerprint(message: BaseMessage) -> str:
    """SHA-256 of a message's content: with its id, how a job's stored result recognises the
    summary it patched in (a client's copy of the marker does not match it)."""
    return hashlib.sha256(content_text(message.content).encode()).hexdigest()


def summary_body(message: BaseMessage) -> str:
    """The summary text of a summary message, without the prefix line and quoted request."""
    content = content_text(message.content)
    body = content.removeprefix(SUMMARY_PREFIX).strip()
    for heading in (REQUEST_HEADING, *OLD_REQUEST_HEADINGS):
        head, sep, _ = body.partition(heading)
        if sep:
            return head.strip()
    return body


def build_summary_message(
    *,
    message_id: str,
    summary_text: str,
    replaced_ids: list[str],
    replaced_chars: int,
    summarizer: str,
    compactions: int,
    request: str | None,
    extra: Mapping[str, Any] | None = None,
) -> HumanMessage:
    """The summary ``HumanMessage``; it takes ``message_id``, the first removed message's id.

    Taking that id is what puts it first: ``add_messages`` replaces a message
    with a known id in place, and appends one with a new id at the end
    (DESIGN.md invariant 2).
    """
    content = f"{SUMMARY_PREFIX}\n\n{summary_text.strip()}"
    if request:
        content += f"\n\n{REQUEST_HEADING}\n{request}"
    return HumanMessage(
        id=message_id,
        content=content,
        additional_kwargs={
            "lc_source": SUMMARY_SOURCE,
            "summary": {
                "replaced_ids": list(replaced_ids),
                "replaced_count": len(replaced_ids),
                "replaced_chars": replaced_chars,
                "summarizer": summarizer,
                "compactions": compactions,
                "request": request,
                **(extra or {}),
            },
        },
    )
