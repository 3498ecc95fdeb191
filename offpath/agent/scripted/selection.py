"""Which plan and step answer a model call: :data:`PLANS` and :data:`DEMO_REQUESTS`, a
request matched to its plan by keywords (:func:`plan_for`, :func:`generic_plan` for an
unknown one), and :func:`locate` over a run's messages, a compacted one included."""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.messages import BaseMessage

from offpath.agent.scripted.plan import (
    RATIO,
    Plan,
    Step,
    logs_call,
    metrics_call,
)
from offpath.agent.scripted.remedy import ACTION, DEPLOY, REPLICAS
from offpath.agent.scripted.triage import DATABASE, INFRA, TRIAGE
from offpath.compaction.accounting import content_text
from offpath.compaction.summary import is_summary, summary_meta

PLANS: tuple[Plan, ...] = (TRIAGE, INFRA, DATABASE, DEPLOY, REPLICAS, ACTION)
#: The demo's user requests, in order: together, an investigation of the fixtures' incident.
DEMO_REQUESTS: list[str] = [p.request for p in PLANS]

_SERVICES = (
    "checkout-api",
    "fulfillment-api",
    "orders-worker",
    "email-notifier",
    "ingress-nginx",
    "orders-db",
    "cart-cache",
)


def generic_plan(request: str) -> Plan:
    """The plan for a request the script does not know: a first look at the service it names
    (checkout-api if none), and an answer that says what this model is."""
    low = request.lower()
    service = next((s for s in _SERVICES if s in low), "checkout-api")
    asks = "\n".join(f"- {r}" for r in DEMO_REQUESTS)
    return Plan(
        "generic",
        request,
        (),
        (
            Step(
                f"I am a scripted demo model and have no plan for this request; taking a generic "
                f"first look at {service}: its pods and recent deploys.",
                (
                    ("pod_status", {"namespace": "all", "selector": f"app={service}"}),
                    ("recent_deploys", {"service": service, "limit": 3}),
                ),
            ),
            Step(
                f"Now the warnings and errors {service} logged in the last 30 minutes, and the "
                "5xx ratio per service.",
                (
                    logs_call(service=service, since="30m", grep="WARN|ERROR|FATAL|fail", limit=50),
                    metrics_call(query=RATIO, start="30m", step="5m"),
                ),
            ),
            Step(
                f"""\
This is the **scripted demo model**, not an LLM: it replays fixed investigations and cannot read or reason about your question. Above are the pods, deploys, recent warnings and errors of {service} and the 5xx ratio per service, as a starting point.

Configure an LLM (`OPENAI_API_KEY`, see the README) for real answers. The requests this model has scripted answers for are:
{asks}""",
            ),
        ),
    )


def _words(text: str) -> str:
    return " ".join(text.lower().split())


def plan_for(request: str) -> Plan:
    """The plan for a request: its own if it is one of :data:`DEMO_REQUESTS`, else the plan
    with the most keyword hits (ties: the earlier), else :func:`generic_plan`."""
    text = _words(request)
    for plan in PLANS:
        if text == _words(plan.request):
            return plan
    best, hits = None, 0
    for plan in PLANS:
        n = sum(1 for k in plan.keywords if re.search(rf"(?<![\w-]){re.escape(k)}(?![\w])", text))
        if n > hits:
            best, hits = plan, n
    return best or generic_plan(request)


def _plan_by_key(key: str, request: str) -> Plan | None:
    if key == "generic":
        return generic_plan(request)
    return next((p for p in PLANS if p.key == key), None)


def locate(messages: Sequence[BaseMessage]) -> tuple[Plan, int]:
    """(plan, index of the next step) for a model call over ``messages``."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.type == "human" and not is_summary(m):
            done = sum(1 for x in messages[i + 1 :] if x.type == "ai")
            return plan_for(content_text(m.content)), done
    # No request left: a compaction cut this run's request into the summary. The run's kept
    # AI messages name their plan and step; else the summary quotes the request.
    start = max((i for i, m in enumerate(messages) if is_summary(m)), default=-1)
    summary = messages[start] if start >= 0 else None
    request = str(summary_meta(summary).get("request") or "") if summary else ""
    later = [m for m in messages[start + 1 :] if m.type == "ai"]
    for m in reversed(later):
        meta = m.response_metadata or {}
        plan = _plan_by_key(str(meta.get("scripted_plan", "")), request)
        if plan is not None and isinstance(meta.get("scripted_step"), int):
            return plan, meta["scripted_step"] + 1
    return plan_for(request), len(later)
