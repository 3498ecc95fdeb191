"""Offline summarizer: fills the seed's template from the messages themselves, no model.

Used when no LLM is configured (issue 2, item 9b). Deterministic: the same
messages give the same text. What goes where:

* **Investigating**: the earlier summary's line, else the first request in the
  compacted messages, else the quoted request of the turn in progress;
* **Key findings**: the earlier summary's findings first (at most half the
  bullets), then lines of tool output and agent text that carry errors,
  numbers, identifiers and timestamps; rare lines beat lines repeated with other
  numbers (a repeated log line appears once, with its count);
* **Ruled out**: earlier ones, plus agent sentences that rule something out;
* **Current state**: the last thing the agent said, and its last tool call.

The text says that it is an offline summary. It stays under 400 words.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

from langchain_core.messages import AIMessage, BaseMessage

from offpath.compaction.planner import CompactionPlan
from offpath.compaction.prompt import SummaryPrompt, render_content
from offpath.compaction.summarizers.base import SummaryResult
from offpath.compaction.summary import is_summary, looks_like_instruction, summary_body

OFFLINE_NOTE = "_Offline summary: no LLM is configured; these lines were extracted from the compacted messages._"
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
    r"ruled out|not the cause|isn't the cause|is not the cause|unrelated|looks (fine|healthy|normal)|"
    r"no (errors?|issues?|problems?) (in|with|on)|can be excluded|excluded",
    re.IGNORECASE,
)
_SECTION = re.compile(r"^\*\*(Investigating|Key findings|Ruled out|Current state):\*\*\s*(.*)$")


@dataclass(slots=True)
class _Earlier:
    investigating: str = ""
    findings: list[str] | None = None
    ruled_out: str = ""


class OfflineSummarizer:
    """Template-filling summarizer with no model; ``name`` is ``"offline"``."""

    name = "offline"

    def summarize(self, plan: CompactionPlan, prompt: SummaryPrompt) -> SummaryResult:
        """Summarize ``plan.removed``; ``prompt`` is not used (kept for the protocol)."""
        earlier = _parse_earlier([m for m in plan.removed if is_summary(m)])
        fresh = [m for m in plan.removed if not is_summary(m)]

        investigating = earlier.investigating or _first_request(fresh) or plan.request or ""
        investigating = _clip(investigating.strip().replace("\n", " "), 300) or "(not stated)"

        carried = (earlier.findings or [])[: MAX_BULLETS // 2]
        findings = carried + _findings(fresh, MAX_BULLETS - len(carried), set(carried))

        ruled = (
            [earlier.ruled_out]
            if earlier.ruled_out and "nothing ruled out" not in earlier.ruled_out
            else []
        )
        ruled += _ruled_out(fresh)
        ruled_text = "; ".join(dict.fromkeys(ruled)) if ruled else "nothing ruled out yet"

        state = _current_state(fresh)
        while True:
            text = "\n".join(
                [
                    f"**Investigating:** {investigating}",
                    "**Key findings:**",
                    *(f"- {f}" for f in findings or ["nothing specific found yet"]),
                    f"**Ruled out:** {_clip(ruled_text, 400)}",
                    f"**Current state:** {state}",
                    "",
                    OFFLINE_NOTE,
                ]
            )
            if len(text.split()) <= MAX_WORDS or not findings:
                break
            findings = findings[:-1]
        return SummaryResult(text=text, model="offline")


def _parse_earlier(summaries: list[BaseMessage]) -> _Earlier:
    out = _Earlier(findings=[])
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


def _first_request(messages: list[BaseMessage]) -> str:
    for m in messages:
        if m.type == "human":
            text = render_content(m.content).strip()
            if text:
                return text.split("\n\n")[0]
    return ""


def _findings(messages: list[BaseMessage], limit: int, seen: set[str]) -> list[str]:
    if limit <= 0:
        return []
    candidates: list[tuple[str, str, int]] = []  # (line, signature, order)
    sources: dict[str, str] = {}  # line -> the tool whose output it quotes
    for m in messages:
        text = render_content(m.content)
        if m.type == "ai":
            lines = [s for s in re.split(r"(?<=[.!?])\s+|\n", text) if s]
        elif m.type == "tool":
            lines = text.splitlines()
        else:
            continue
        for line in lines:
            line = _plain(line)[:1_000]
            if line.endswith(":") or looks_like_instruction(line):
                continue  # a heading, or an instruction to an assistant: not a finding
            if len(line) >= 12 and (_NUMBER.search(line) or _ERROR.search(line)):
                candidates.append((line, _DIGITS.sub("#", line), len(candidates)))
                if m.type == "tool":
                    sources.setdefault(line, m.name or "tool")
    counts = Counter(sig for _, sig, _ in candidates)
    scored = []
    first_of: dict[str, int] = {}
    for line, sig, order in candidates:
        if sig in first_of:
            continue
        first_of[sig] = order
        score = 3 * bool(_ERROR.search(line)) + bool(_TIMESTAMP.search(line))
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
        if m.type != "ai":
            continue
        for sentence in re.split(r"(?<=[.!?])\s+|\n", render_content(m.content)):
            sentence = _plain(sentence)
            if looks_like_instruction(sentence):
                continue
            if _RULED_OUT.search(sentence) and not sentence.endswith(":"):
                out.append(_clip(sentence, MAX_BULLET_CHARS))
    return out[-4:]


def _current_state(messages: list[BaseMessage]) -> str:
    said = ""
    call = ""
    for m in reversed(messages):
        if isinstance(m, AIMessage):
            if not call and m.tool_calls:
                c = m.tool_calls[-1]
                args = json.dumps(c.get("args") or {}, ensure_ascii=False, default=str)
                call = f"last tool call: {c.get('name')}({_clip(args, 120)})"
            text = " ".join(
                line
                for line in _plain(render_content(m.content)).split(". ")
                if not looks_like_instruction(line)
            )
            if text and not said:
                said = _clip(text, 300)
        if said and call:
            break
    parts = [p for p in (said, call) if p]
    return "; ".join(parts) if parts else "no agent message in the compacted part"


def _plain(text: str) -> str:
    """A line without markdown emphasis, list marks or heading marks."""
    text = re.sub(r"\s+", " ", text.replace("**", "").replace("`", ""))
    return text.strip().strip("-*#> ").strip()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
