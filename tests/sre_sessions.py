"""SRE investigation sessions of the shape issue 18 measured: several human turns (mostly
"continue"), up to four parallel tool calls, and one huge ``kubectl`` output. Deterministic
(seeded). Used by the integration tests and the peak-context benchmark (``bench/peak.py``).

:func:`sre_session` builds the conversation; :func:`turn_script` splits any multi-turn
conversation into what a live replay needs (the human messages, the model's replies in
order, the scripted tools): the model answers each run's calls with the recorded AI
messages, and each run ends at its turn's text answer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from agent_replay import scripted_tools
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import StructuredTool

SYSTEM = (
    "You are an SRE assistant investigating production incidents on a Kubernetes cluster. "
    "Use kubectl, logs, metrics and deploy history; be specific (pod names, exit codes, "
    "timestamps, numbers); say what you ruled out."
)
NAMESPACES = ("default", "payments", "checkout", "kube-system", "monitoring", "ingress")
SERVICES = (
    "checkout-api",
    "payments-api",
    "ledger-worker",
    "cart-svc",
    "redis-cache",
    "pg-primary",
)
FOLLOW_UPS = (
    "continue",
    "proceed",
    "What about the database? Check pg-primary's connections and slow queries.",
    "continue",
    "And the deploy at 10:28 UTC: what changed in checkout-api?",
    "go on",
    "Summarize what you found, what is ruled out and what to do next.",
)


def _pod(r: random.Random, svc: str) -> str:
    return f"{svc}-{r.randrange(16**5):05x}-{r.randrange(36**5):05x}"


def _pods_table(r: random.Random, chars: int) -> str:
    """``kubectl get pods -A -o wide``: hundreds of healthy rows, a few broken ones."""
    head = "NAMESPACE     NAME                                READY   STATUS    RESTARTS   AGE   IP            NODE"
    lines, n = [head], len(head)
    while n < chars:
        ns = r.choice(NAMESPACES)
        svc = r.choice(SERVICES)
        status, restarts = "Running", 0
        if r.random() < 0.03:
            status, restarts = r.choice((("CrashLoopBackOff", 14), ("OOMKilled", 6)))
        line = (
            f"{ns:<13} {_pod(r, svc):<35} 1/1     {status:<9} {restarts:<10} "
            f"{r.randint(1, 40)}d   10.42.{r.randint(0, 9)}.{r.randint(2, 250):<6} "
            f"ip-10-0-{r.randint(1, 9)}-{r.randint(10, 250)}.ec2.internal"
        )
        lines.append(line)
        n += len(line) + 1
    return "\n".join(lines)[:chars]


def _logs(r: random.Random, svc: str, chars: int) -> str:
    lines, n = [], 0
    while n < chars:
        t = f"2026-03-02T10:{r.randint(20, 59):02d}:{r.randint(0, 59):02d}Z"
        kind = r.random()
        if kind < 0.07:
            line = f"{t} ERROR {svc} upstream timed out after 5000 ms route=/v1/cart req_id={r.randint(10**8, 10**9)}"
        elif kind < 0.12:
            line = f"{t} WARN {svc} pool exhausted: 64/64 connections in use (waiting 212 ms)"
        else:
            line = f"{t} INFO {svc} GET /v1/cart 200 latency_ms={r.randint(5, 400)} req_id={r.randint(10**8, 10**9)}"
        lines.append(line)
        n += len(line) + 1
    return "\n".join(lines)[:chars]


def _describe(r: random.Random, pod: str, chars: int) -> str:
    text = (
        f"Name:         {pod}\nNamespace:    checkout\nNode:         ip-10-0-3-117.ec2.internal\n"
        "Status:       Running\nContainers:\n  app:\n    Image:  registry.example.com/checkout-api:v2.4.2\n"
        "    State:          Running\n    Last State:     Terminated\n      Reason:       OOMKilled\n"
        "      Exit Code:    137\n    Restart Count:  6\n    Limits:\n      cpu:     850m\n"
        "      memory:  512Mi\n    Environment:\n      DEPLOY_ENV:  prod\n      DB_TIMEOUT:  5s\n"
        "Events:\n"
    )
    while len(text) < chars:
        text += (
            f"  Warning  BackOff  {r.randint(1, 59)}m  kubelet  Back-off restarting failed "
            f"container app in pod {pod}\n"
        )
    return text[:chars]


def sre_session(
    seed: int = 0,
    *,
    dump_chars: int = 75_000,
    steps_per_turn: tuple[int, int] = (2, 5),
    result_chars: tuple[int, int] = (800, 6_000),
    parallel: int = 4,
    prefix: str = "sre",
) -> list[BaseMessage]:
    """An incident investigation: a system prompt, a first request, then the follow-ups of
    :data:`FOLLOW_UPS` (8 human turns); each turn 2-5 model steps of 1-``parallel`` parallel
    calls with results of 800-6,000 chars, and a text answer with specifics. The first step
    lists every pod of the cluster (``dump_chars`` chars, one result) with the events."""
    r = random.Random(seed)
    out: list[BaseMessage] = [SystemMessage(id=f"{prefix}-sys", content=SYSTEM)]
    n = 0

    def next_id(kind: str) -> str:
        nonlocal n
        n += 1
        return f"{prefix}-{kind}{n:04d}"

    requests = [
        "Check the pods in the default namespace and across the cluster: checkout is "
        "returning 502s since 10:30 UTC. Find the cause.",
        *FOLLOW_UPS,
    ]
    broken = _pod(r, "checkout-api")
    for t, request in enumerate(requests):
        out.append(HumanMessage(id=next_id("h"), content=request))
        steps = r.randint(*steps_per_turn)
        for step in range(steps):
            calls, results = [], []
            k = r.randint(1, parallel)
            for j in range(k):
                cid = f"{prefix}-call-{t}-{step}-{j}"
                svc = r.choice(SERVICES)
                if t == 0 and step == 0 and j == 0:
                    name, args = "kubectl", {"command": "kubectl get pods -A -o wide"}
                    content = _pods_table(r, dump_chars)
                elif j % 3 == 1:
                    name, args = (
                        "kubectl",
                        {"command": f"kubectl describe pod {broken} -n checkout"},
                    )
                    content = _describe(r, broken, r.randint(*result_chars))
                else:
                    name = "logs"
                    args = {"service": svc, "since": "30m", "pod": _pod(r, svc)}
                    content = _logs(r, svc, r.randint(*result_chars))
                calls.append({"id": cid, "name": name, "args": args})
                results.append(ToolMessage(id=next_id("t"), content=content, tool_call_id=cid))
            text = "" if step else f"Looking at {k} source(s) for turn {t + 1}."
            out.append(AIMessage(id=next_id("a"), content=text, tool_calls=calls))
            out += results
        out.append(
            AIMessage(
                id=next_id("a"),
                content=(
                    f"Turn {t + 1}: {broken} was OOMKilled (Exit Code 137) 6 times since 10:28 "
                    f"UTC; its memory limit is 512Mi and the pool reached 64/64 connections at "
                    f"10:3{t % 10}:07Z. pg-primary is not the cause: its connections stayed at "
                    f"40/200. Next: compare v2.4.2 with v2.4.1 (commit 9f3c2ab)."
                ),
            )
        )
    return out


@dataclass(frozen=True)
class TurnScript:
    """What a live replay of a multi-turn conversation needs."""

    system: SystemMessage | None
    requests: list[HumanMessage]
    replies: list[AIMessage]  # every turn's, in order
    tools: list[StructuredTool]


def turn_script(messages: Sequence[BaseMessage], end_prefix: str = "end") -> TurnScript:
    """The human messages, the model's replies in order and the scripted tools of
    ``messages``; a turn whose last AI message still calls a tool gets a closing text reply
    (the run must end at its turn's answer)."""
    system = messages[0] if isinstance(messages[0], SystemMessage) else None
    requests: list[HumanMessage] = []
    replies: list[AIMessage] = []
    turn: list[AIMessage] = []

    def close() -> None:
        if turn and turn[-1].tool_calls:
            turn.append(AIMessage(id=f"{end_prefix}-{len(requests)}", content="Noted."))
        replies.extend(turn)
        turn.clear()

    for m in messages:
        if isinstance(m, HumanMessage):
            if requests:
                close()
            requests.append(m)
        elif isinstance(m, AIMessage) and requests:
            turn.append(m)
    close()
    return TurnScript(system, requests, replies, scripted_tools(messages))
