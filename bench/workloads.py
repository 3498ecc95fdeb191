"""Synthetic threads for the benchmarks: realistic mixes of turns, tool calls and
parallel batches, sized in chars and messages, deterministic (seeded)."""

from __future__ import annotations

import random

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

LOG_LINE = "2026-03-02T10:{m:02d}:{s:02d}Z {lvl} {svc} req_id={rid} latency_ms={lat} route=/v1/charge status={st}"
SERVICES = ("payments-api", "ledger-worker", "checkout-web", "postgres-primary", "redis-cache")


def _log(r: random.Random, chars: int) -> str:
    lines, n = [], 0
    while n < chars:
        line = LOG_LINE.format(
            m=r.randint(0, 59),
            s=r.randint(0, 59),
            lvl=r.choice(("INFO", "INFO", "WARN", "ERROR")),
            svc=r.choice(SERVICES),
            rid=r.randint(10**8, 10**9),
            lat=r.randint(5, 900),
            st=r.choice((200, 200, 502, 504)),
        )
        lines.append(line)
        n += len(line) + 1
    return "\n".join(lines)[:chars]


def thread(
    n_messages: int, total_chars: int, seed: int = 1, prefix: str = "m"
) -> list[BaseMessage]:
    """``n_messages`` messages of about ``total_chars`` chars in all: a system prompt, then
    turns of a question, one to six tool steps (a quarter of them parallel batches of 3)
    and an answer. The tool results share what the other messages leave of the size."""
    r = random.Random(seed)
    skeleton: list[tuple] = [("system",)]
    i = 0
    while len(skeleton) < n_messages:
        skeleton.append(("human", i))
        for step in range(r.randint(1, 6)):
            if len(skeleton) >= n_messages - 2:
                break
            k = 3 if r.random() < 0.25 else 1
            skeleton.append(("ai", i, step, k))
            skeleton += [("tool", i, step, j) for j in range(k)]
        skeleton.append(("answer", i))
        i += 1
    skeleton = skeleton[:n_messages]
    n_tools = sum(1 for s in skeleton if s[0] == "tool") or 1
    per_result = max(20, (total_chars - 120 * (len(skeleton) - n_tools)) // n_tools)
    out: list[BaseMessage] = []
    for spec in skeleton:
        kind = spec[0]
        if kind == "system":
            out.append(SystemMessage(id=f"{prefix}-sys", content="You are an SRE assistant."))
        elif kind == "human":
            out.append(
                HumanMessage(
                    id=f"{prefix}-h{spec[1]}",
                    content=f"Turn {spec[1]}: why is {r.choice(SERVICES)} returning 502s since 10:30 UTC?",
                )
            )
        elif kind == "ai":
            _, t, step, k = spec
            calls = [
                {
                    "id": f"{prefix}-c{t}-{step}-{j}",
                    "name": "kubectl_logs",
                    "args": {"pod": f"{r.choice(SERVICES)}-7d9f5c-x{j}", "since": "1h"},
                }
                for j in range(k)
            ]
            out.append(
                AIMessage(
                    id=f"{prefix}-a{t}-{step}", content="Checking the logs.", tool_calls=calls
                )
            )
        elif kind == "tool":
            _, t, step, j = spec
            cid = f"{prefix}-c{t}-{step}-{j}"
            out.append(
                ToolMessage(id=f"{prefix}-t{cid}", content=_log(r, per_result), tool_call_id=cid)
            )
        else:
            out.append(
                AIMessage(
                    id=f"{prefix}-f{spec[1]}",
                    content=f"Turn {spec[1]}: pool exhaustion at 10:3{spec[1] % 10}:07Z (64/64 in use).",
                )
            )
    # a cut skeleton may end inside a tool step: drop a trailing unanswered call
    called = {c["id"] for m in out if isinstance(m, AIMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in out if isinstance(m, ToolMessage)}
    while (
        out and isinstance(out[-1], AIMessage) and {c["id"] for c in out[-1].tool_calls} - answered
    ):
        out.pop()
    assert not (called - answered) or out, "unbalanced"
    return out


def turn_messages(i: int, chars: int, seed: int, prefix: str) -> list[dict]:
    """One turn as API dicts: a question, a tool call with ``chars`` of log, an answer."""
    r = random.Random(seed * 1000 + i)
    cid = f"{prefix}-c{i}"
    return [
        {
            "type": "human",
            "id": f"{prefix}-h{i}",
            "content": f"Turn {i}: check {r.choice(SERVICES)}",
        },
        {
            "type": "ai",
            "id": f"{prefix}-a{i}",
            "content": "",
            "tool_calls": [{"id": cid, "name": "kubectl_logs", "args": {"since": "1h"}}],
        },
        {"type": "tool", "id": f"{prefix}-t{i}", "tool_call_id": cid, "content": _log(r, chars)},
        {"type": "ai", "id": f"{prefix}-f{i}", "content": f"Turn {i} looked at."},
    ]
