"""Offline summarizer: fills the seed's template from the messages themselves, no model.

Used when no LLM is configured. Deterministic: the same
messages give the same text. What goes where:

* **Investigating**: the latest request (the turn in progress, else the last
  request in the compacted messages), else the earlier summary's line (the session moves on);
* **Key findings**: the earlier summary's findings first (at most half the
  bullets), then the agent's own sentences that state facts (numbers,
  identifiers, errors), then lines of tool output that carry errors, numbers,
  identifiers and timestamps; rare lines beat lines repeated with other numbers
  (a repeated log line appears once, with its count). Noise never counts: object
  metadata (``Annotations:``, ``Labels:`` ...), bare metric names, questions to
  the user. Tool output is quoted as data, never as the user's words;
* **Ruled out**: earlier ones, plus the evidence against: the agent's negative
  results ("no ... were found", "not the cause", "ruled out", healthy checks)
  and tool output lines that report a healthy check;
* **Current state**: the last thing the agent said (whole sentences, never cut
  mid-word), and its last tool call.

The text says that it is an offline summary. It stays under 400 words.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from offpath.compaction.budget import LEFT_OUT
from offpath.compaction.facts.sections import head_before, without_cut_runs
from offpath.compaction.frontier import is_follow_up
from offpath.compaction.planner import CompactionPlan
from offpath.compaction.prompt import SummaryPrompt, render_content, tool_label
from offpath.compaction.standing import standing_blocks, without_standing
from offpath.compaction.summarizers.base import SummaryResult
from offpath.compaction.summary import (
    fit_text,
    is_summary,
    looks_like_instruction,
    summary_body,
    text_cap,
    words_for,
)

OFFLINE_NOTE = "_Offline summary (no LLM): lines taken from the messages._"
#: Under this text budget (chars) the summary has no room for :data:`OFFLINE_NOTE`: the facts
#: come first; the job's record and the summary's metadata name the summarizer.
NOTE_MIN_CAP = 1_200
MAX_BULLETS = 12
MAX_BULLET_CHARS = 180
MAX_WORDS = 390

_ERROR = re.compile(
    r"error|exception|fail|fatal|panic|refused|timed? ?out|exhaust|oom|killed|denied|crash|"
    r"traceback|unavailable|unhealthy|evict|throttl|critical|(status|code|http)[=: ]*5\d\d",
    re.IGNORECASE,
)
_TIMESTAMP = re.compile(r"\d{1,2}:\d{2}(:\d{2})?|\d{4}-\d{2}-\d{2}")
_NUMBER = re.compile(r"\d")
_IDENT = re.compile(r"[a-z0-9]+[-_.][a-z0-9]+", re.IGNORECASE)
_DIGITS = re.compile(r"[0-9a-f]{6,}|\d+", re.IGNORECASE)
_RULED_OUT = re.compile(
    r"\brul(ed|e|ing) out\b|\bnot (the|a) (root )?(cause|culprit|issue|problem)\b"
    r"|\bisn't (the|a) (cause|culprit|issue|problem)\b|\bunrelated\b|\bnot related\b"
    r"|\blooks? (fine|healthy|normal|ok)\b|\b(is|are|was|were) (healthy|normal|fine|stable)\b"
    r"|\bwithin (limits|normal range)\b|\bno (errors?|issues?|problems?|anomal\w*|restarts?|"
    r"evidence|sign)\b|\bno [\w-]+(?: [\w-]+){0,4} (were|was|is|are) (found|seen|detected|"
    r"reported|present|available)\b|\bnothing (unusual|abnormal|suspicious|wrong)\b"
    r"|\bcan be (excluded|ignored)\b|\b(0|zero) errors\b|\bhealth ?checks? (pass|ok)",
    re.IGNORECASE,
)
#: A tool output line that reports a healthy check (evidence for **Ruled out**).
_HEALTHY = re.compile(
    r"\b(status|health|state)[=: ]+\"?(healthy|ok|up|passing|green)\b|\ball checks passed\b"
    r"|\bno errors? found\b",
    re.IGNORECASE,
)
#: Object metadata and other lines that are never findings ("noise lines").
_NOISE = re.compile(
    r"^(annotations|labels|selector|tolerations|node-selectors|mounts|volumes|environment|"
    r"image id|container id|controlled by|qos class|priority class name|service account|"
    r"conditions|events|args|command|host port|port|ip|ips|node|start time|volume mounts)\s*:"
    r"|^[\w.:/@-]+$",
    re.IGNORECASE,
)
#: Sentences that ask or offer rather than state (not findings, not the current state).
_ASKS = re.compile(
    r"\?\s*$|^(would you like|do you want|shall i|let me know|next steps|recommendations)\b"
    r"|^(\d+\.\s*)?(check|verify|investigate|reduce|confirm|consider|review|try|run|look|"
    r"increase|decrease|adjust|monitor|ensure|inspect)\b",
    re.IGNORECASE,
)
_SECTION = re.compile(r"^\*\*(Investigating|Key findings|Ruled out|Current state):\*\*\s*(.*)$")


@dataclass(slots=True)
class _Earlier:
    investigating: str = ""
    findings: list[str] = field(default_factory=list)
    ruled_out: str = ""


class OfflineSummarizer:
    """Template-filling summarizer with no model; ``name`` is ``"offline"``."""

    name = "offline"

    def summarize(self, plan: CompactionPlan, prompt: SummaryPrompt) -> SummaryResult:
        """Summarize ``plan.removed``; ``prompt`` is not used (kept for the protocol)."""
        earlier = _parse_earlier([m for m in plan.removed if is_summary(m)])
        fresh = [m for m in plan.removed if not is_summary(m)]

        investigating = plan.request or _last_request(fresh) or earlier.investigating or ""
        investigating = _clip(investigating.strip().replace("\n", " "), 300) or "(not stated)"

        carried = (earlier.findings or [])[: MAX_BULLETS // 2]
        findings = carried + _findings(fresh, MAX_BULLETS - len(carried), set(carried))

        # the earlier summary's items one by one: an item found again is listed once
        ruled = (
            [r.strip() for r in earlier.ruled_out.replace(LEFT_OUT, "").rstrip(".").split("; ")]
            if earlier.ruled_out and "nothing ruled out" not in earlier.ruled_out
            else []
        )
        ruled += _ruled_out(fresh)
        ruled = [r.rstrip(".") for r in ruled if r]
        ruled_text = "; ".join(dict.fromkeys(ruled)) + "." if ruled else "nothing ruled out yet"

        state = _current_state(fresh)
        cap = text_cap(plan.summary_chars)
        max_words = min(MAX_WORDS, words_for(cap))
        while True:
            text = "\n".join(
                [
                    f"**Investigating:** {investigating}",
                    "**Key findings:**",
                    *(f"- {f}" for f in findings or ["nothing specific found yet"]),
                    f"**Ruled out:** {_clip(ruled_text, 400)}",
                    f"**Current state:** {state}",
                    *(("", OFFLINE_NOTE) if cap is None or cap >= NOTE_MIN_CAP else ()),
                ]
            )
            fits = len(text.split()) <= max_words and (cap is None or len(text) <= cap)
            if fits or not findings:
                break
            findings = findings[:-1]
        return SummaryResult(text=fit_text(text, cap), model="offline")


def _parse_earlier(summaries: list[BaseMessage]) -> _Earlier:
    out = _Earlier()
    for s in summaries:
        section = None
        for line in summary_body(s).splitlines():
            m = _SECTION.match(line.strip())
            if m:
                section, rest = m.group(1), m.group(2).strip()
                if section == "Investigating" and rest and not out.investigating:
                    out.investigating = rest
                elif section == "Ruled out" and rest:
                    out.ruled_out = rest
                continue
            if section == "Key findings" and line.strip().startswith("- "):
                bullet = line.strip()[2:].strip()
                if bullet and bullet not in out.findings:
                    out.findings.append(bullet)
    return out


def _last_request(messages: list[BaseMessage]) -> str:
    """The last substantive request among ``messages``: its first paragraph, the standing
    instructions left out, a follow-up ("continue") passed over."""
    standing = standing_blocks(messages)
    for m in reversed(messages):
        if m.type == "human":
            text = without_standing(_text(m.content), standing)
            if text and not is_follow_up(text):
                return text.split("\n\n")[0]
    return ""


def _findings(messages: list[BaseMessage], limit: int, seen: set[str]) -> list[str]:
    if limit <= 0:
        return []
    candidates: list[tuple[str, str, int, bool]] = []  # (line, signature, order, the agent's)
    sources: dict[str, str] = {}  # line -> the tool whose output it quotes
    for m in messages:
        text = _text(m.content)
        if m.type == "ai":
            lines = _sentences(text)
        elif m.type == "tool":
            lines = text.splitlines()
        else:
            continue
        for line in lines:
            line = _plain(line)[:1_000]
            if line.endswith(":") or looks_like_instruction(line) or _NOISE.search(line):
                continue  # a heading, metadata, a bare name, an injected instruction
            if m.type == "ai" and _ASKS.search(line):
                continue
            if len(line) >= 12 and (_NUMBER.search(line) or _ERROR.search(line)):
                candidates.append((line, _DIGITS.sub("#", line), len(candidates), m.type == "ai"))
                if m.type == "tool":
                    failed = getattr(m, "status", None) == "error"
                    source = _source(m.name)
                    sources.setdefault(line, f"{source}, FAILED" if failed else source)
    counts = Counter(sig for _, sig, _, _ in candidates)
    scored = []
    first_of: dict[str, int] = {}
    for line, sig, order, stated in candidates:
        if sig in first_of:
            continue
        first_of[sig] = order
        score = 3 * bool(_ERROR.search(line)) + bool(_TIMESTAMP.search(line)) + 4 * stated
        score += bool(_IDENT.search(line)) + (
            2 if counts[sig] <= 2 else 1 if counts[sig] <= 5 else 0
        )
        scored.append((-score, order, line, counts[sig]))
    scored.sort()
    picked: list[tuple[int, str]] = []
    for _, order, line, count in scored:
        bullet = _clip(line, MAX_BULLET_CHARS)
        if line in sources:  # quoted as data, never as words of the user
            bullet = f"`{bullet}` ({sources[line]} output)"
        if count > 2:
            bullet += f" ({count} similar lines)"
        if bullet not in seen:
            seen.add(bullet)
            picked.append((order, bullet))
        if len(picked) >= limit:
            break
    return [bullet for _, bullet in sorted(picked)]  # in conversation order


def _ruled_out(messages: list[BaseMessage]) -> list[str]:
    out = []
    for m in messages:
        if m.type == "ai":
            for sentence in _sentences(_text(m.content)):
                sentence = _plain(sentence)
                if looks_like_instruction(sentence) or _ASKS.search(sentence):
                    continue
                if _RULED_OUT.search(sentence) and not sentence.endswith(":"):
                    out.append(_clip(sentence, MAX_BULLET_CHARS))
        elif m.type == "tool":
            for line in _text(m.content).splitlines():
                line = _plain(line)
                if (
                    _HEALTHY.search(line) or _RULED_OUT.search(line)
                ) and not looks_like_instruction(line):
                    out.append(f"`{_clip(line, MAX_BULLET_CHARS)}` ({_source(m.name)} output)")
    return list(dict.fromkeys(out))[-4:]


def _current_state(messages: list[BaseMessage]) -> str:
    said = ""
    call = ""
    for m in reversed(messages):
        if isinstance(m, AIMessage):
            if not call and m.tool_calls:
                c = m.tool_calls[-1]
                args = json.dumps(c.get("args") or {}, ensure_ascii=False, default=str)
                quoted = f"{c.get('name')}({_clip(args, 120)})".replace("`", "'")
                call = f"Last tool call: `{quoted}`."  # the call is data: quoted
            if not said:
                sentences = [
                    _plain(x)
                    for x in _sentences(_text(m.content))
                    if not looks_like_instruction(x) and not _ASKS.search(x)
                ]
                said = _whole_sentences([x for x in sentences if x], 300)
        if said and call:
            break
    parts = [p for p in (said, call) if p]
    return " ".join(parts) if parts else "no agent message in the compacted part"


def _source(name: str | None) -> str:
    """Who wrote a quoted line: the tool, by its name if that is an identifier (a tool's
    name is data: one holding a sentence is never written)."""
    return tool_label(name) or "tool"


def _sentences(text: str) -> list[str]:
    """``text`` split into sentences and lines (list items and headings apart)."""
    return [s for s in re.split(r"(?<=[.!?])\s+|\n", text) if s.strip()]


def _whole_sentences(sentences: list[str], limit: int) -> str:
    """As many whole sentences as fit in ``limit`` chars (the first one clipped at a word)."""
    out = ""
    for sentence in sentences:
        joined = f"{out} {sentence}".strip()
        if len(joined) > limit:
            break
        out = joined
    return out or (_clip(sentences[0], limit) if sentences else "")


def _text(content: Any) -> str:
    """A message's text as the summary quotes it: no run of chars that a cut offpath made
    may have split (a shortened result's head and tail), so no word cut mid-way is quoted;
    its markdown tables one line per row (:func:`_untabled`)."""
    return _untabled(without_cut_runs(render_content(content)))


#: A markdown table's row, and the rule under its heading row (``|---|:--:|``).
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")


def _untabled(text: str) -> str:
    """``text`` with each markdown table written one line per row, each cell after its
    column's heading (``first timeout: 14:05:04.7; p99 > 2 s from: 14:05``): quoted alone, a
    row's pipes, a heading row and the rule under it say nothing (``| | first timeout |``)."""
    if "|" not in text:
        return text
    lines = text.split("\n")
    out: list[str] = []
    k = 0
    while k < len(lines):
        if k + 1 < len(lines) and _TABLE_ROW.match(lines[k]) and _TABLE_RULE.match(lines[k + 1]):
            heading = _cells(lines[k])
            k += 2
            while k < len(lines) and _TABLE_ROW.match(lines[k]):
                cells = _cells(lines[k])
                pairs = [
                    f"{name}: {cell}" if name else cell
                    for name, cell in zip([*heading, *[""] * len(cells)], cells, strict=False)
                    if cell
                ]
                if pairs:
                    out.append("; ".join(pairs))
                k += 1
            continue
        out.append(lines[k])
        k += 1
    return "\n".join(out)


def _cells(row: str) -> list[str]:
    """A markdown table row's cells, stripped (``| a | b |`` -> ``["a", "b"]``)."""
    return [cell.strip() for cell in row.strip().removeprefix("|").removesuffix("|").split("|")]


def _plain(text: str) -> str:
    """A line without markdown emphasis, list marks or heading marks; a number's minus sign
    that starts it stays (``-2`` the replica, ``-5%``)."""
    text = re.sub(r"\s+", " ", text.replace("**", "").replace("`", "")).strip()
    lead = len(text) - len(text.lstrip("-*#> "))
    if lead and text[lead - 1] == "-" and text[lead : lead + 1].isdigit():
        lead -= 1
    return text[lead:].rstrip("-*#> ").strip()


def _clip(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` chars, cut at a word boundary (never mid-word)."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    if " " in cut and not text[limit - 3].isspace():
        cut = cut.rsplit(" ", 1)[0]
    elif " " not in cut:  # one run of chars: before the word the cut splits, if it does
        cut = head_before(text, limit - 3)
    return cut.rstrip(" ,;:") + "..."
