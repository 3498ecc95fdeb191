"""``recent_deploys`` and ``pod_status``'s implementations: helm history over
``deploys.json`` and ``kubectl get pods -o wide`` over ``pods.json``."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from langchain_core.tools import tool

from offpath.agent.sre_tools.fixtures import (
    MAX_CHARS,
    ToolError,
    answers_errors,
    cap_answer,
    fixture_now,
    int_arg,
    parse_iso,
    read_fixture,
    short_time,
)


# ---------------------------------------------------------------- recent_deploys
def _helm_time(text: str) -> str:
    return parse_iso(text).strftime("%a %b %e %H:%M:%S %Y")


@answers_errors
def _recent_deploys(service: str, limit: int = 10) -> str:
    limit, limit_note = int_arg(limit, "limit", 1, 50)
    doc = read_fixture("deploys.json")
    releases = {r["release"]: r for r in doc["releases"]}
    key, now = str(service or "").strip().lower(), fixture_now()
    if key in ("", "all", "*"):
        rows = sorted(
            (
                (h["updated"], r["release"], r["namespace"], h)
                for r in releases.values()
                for h in r["history"]
            ),
            key=lambda x: x[0],
            reverse=True,
        )[:limit]
        lines = [f"releases across the cluster, most recent first (as of {short_time(now)}):"]
        lines.append(
            f"{'UPDATED':<22}{'RELEASE':<18}{'NAMESPACE':<15}{'REV':<5}{'APP VERSION':<13}STATUS"
        )
        for when, name, ns, h in rows:
            ago = _age(now - parse_iso(when))
            lines.append(
                f"{when:<22}{name:<18}{ns:<15}{h['revision']:<5}{h['app_version']:<13}"
                f"{h['status']} ({ago} ago)"
            )
        lines.append("(recent_deploys(service=<release>) shows a release's changes)")
        return cap_answer(lines[:2], lines[2:], [], lambda n: f"[... {n} rows cut ...]")
    if key not in releases:
        raise ToolError(f"no release named {service!r}. Releases: {', '.join(releases)}")
    rel = releases[key]
    hist = rel["history"][-limit:]
    head = [f"$ helm history {key} -n {rel['namespace']} --max {limit}"]
    head += [f"note: {limit_note}"] if limit_note else []
    head.append(
        f"{'REVISION':<10}{'UPDATED':<26}{'STATUS':<12}{'CHART':<22}{'APP VERSION':<13}DESCRIPTION"
    )
    for h in hist:
        head.append(
            f"{h['revision']:<10}{_helm_time(h['updated']):<26}{h['status']:<12}{h['chart']:<22}"
            f"{h['app_version']:<13}{h['description']}"
        )
    body: list[str] = []
    for h in reversed(hist):
        when = parse_iso(h["updated"])
        body += [
            "",
            f"revision {h['revision']} ({h['app_version']}, {h['status']}): "
            f"{short_time(when)}, {_age(now - when)} before {short_time(now)}",
        ]
        body.append(
            f"  pipeline: {h.get('pipeline', '-')}"
            + (f", {h['trigger']}" if h.get("trigger") else "")
        )
        body.append(f"  canary analysis: {h.get('canary', '-')}")
        for line in h.get("pipeline_log") or []:
            body.append(f"    {line}")
        if h.get("changes"):
            body.append("  changes:")
            body += [f"    {c}" for c in h["changes"]]
        if h.get("values_diff"):
            body.append("  config diff:")
            body += [f"    {line}" for line in h["values_diff"].splitlines()]
    text = "\n".join([*head, *body])
    if len(text) <= MAX_CHARS:
        return text
    note = "[... cut at 8,000 chars: ask with a lower limit for less ...]"
    return text[: MAX_CHARS - len(note) - 1].rsplit("\n", 1)[0] + "\n" + note


def _age(delta: timedelta) -> str:
    """kubectl's AGE: 45s, 12m, 5h, 3d."""
    s = max(int(delta.total_seconds()), 0)
    if s < 120:
        return f"{s}s"
    if s < 3 * 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


# ---------------------------------------------------------------- pod_status
_SEL_SET = re.compile(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$")
_SEL_EQ = re.compile(r"^([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)$")
_SEL_HAS = re.compile(r"^(!?)\s*([\w./-]+)$")


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [p for p in [*parts, cur.strip()] if p]


def _selector(
    selector: str, items: list[dict[str, Any]]
) -> tuple[Callable[[dict[str, str]], bool], str]:
    tests: list[Callable[[dict[str, str]], bool]] = []
    note = ""
    keys = {k for it in items for k in it["metadata"]["labels"]}
    apps = {it["metadata"]["labels"].get("app") for it in items}
    for term in _split_selector(selector):
        if m := _SEL_SET.match(term):
            k, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            tests.append(lambda lab, k=k, op=op, vals=vals: (lab.get(k) in vals) == (op == "in"))
        elif m := _SEL_EQ.match(term):
            k, op, v = m.groups()
            tests.append(lambda lab, k=k, op=op, v=v: (lab.get(k) == v) == (op != "!="))
        elif m := _SEL_HAS.match(term):
            neg, k = m.groups()
            if not neg and k not in keys and k in apps:  # a bare app name: app=<it>
                note = f"selector {k!r} read as app={k}"
                tests.append(lambda lab, v=k: lab.get("app") == v)
            else:
                tests.append(lambda lab, k=k, neg=neg: (k in lab) != bool(neg))
        else:
            raise ToolError(
                f"cannot parse selector term {term!r}: use key=value, key!=value, "
                "key in (a,b), key notin (a,b), key or !key, comma-separated"
            )
    return (lambda lab: all(t(lab) for t in tests)), note


def _pod_row(it: dict[str, Any], now: datetime) -> tuple[list[str], str]:
    meta, st = it["metadata"], it["status"]
    cs = st["containerStatuses"]
    ready = sum(1 for c in cs if c["ready"])
    restarts = sum(c["restartCount"] for c in cs)
    status = st["phase"]
    for c in cs:
        if "terminated" in c["state"]:
            status = c["state"]["terminated"]["reason"]
        elif "waiting" in c["state"]:
            status = c["state"]["waiting"]["reason"]
    last = [c["lastState"].get("terminated") for c in cs if c["lastState"].get("terminated")]
    rs = str(restarts)
    if last:
        rs += f" ({_age(now - parse_iso(last[0]['finishedAt']))} ago)"
    row = [
        meta["name"],
        f"{ready}/{len(cs)}",
        status,
        rs,
        _age(now - parse_iso(meta["creationTimestamp"])),
        st.get("podIP") or "<none>",
        (it["spec"].get("nodeName") or "<none>").split(".")[0],
    ]
    why = []
    if status == "Running":
        for cond in st["conditions"]:
            if cond["type"] == "Ready" and cond["status"] != "True":
                since = parse_iso(cond["lastTransitionTime"])
                why.append(
                    f"Ready=False since {short_time(since)} ({cond.get('reason', '')}: {cond.get('message', '')})"
                )
    for t in last:
        why.append(
            f"{restarts} restarts; last terminated {t['finishedAt']} reason={t['reason']} "
            f"exitCode={t['exitCode']} (ran since {t['startedAt']})"
        )
    return row, "; ".join(why)


@answers_errors
def _pod_status(namespace: str = "shop-prod", selector: str = "") -> str:
    doc, now = read_fixture("pods.json"), fixture_now()
    items = doc["items"]
    namespaces = sorted({it["metadata"]["namespace"] for it in items})
    ns = str(namespace or "").strip().lower()
    every = ns in ("", "all", "*", "--all-namespaces", "-a")
    if not every and ns not in namespaces:
        raise ToolError(f"no namespace {namespace!r}. Namespaces: {', '.join(namespaces)}")
    scoped = [it for it in items if every or it["metadata"]["namespace"] == ns]
    match, note = _selector(str(selector or ""), scoped)
    chosen = [it for it in scoped if match(it["metadata"]["labels"])]
    cmd = "kubectl get pods " + ("-A" if every else f"-n {ns}")
    cmd += f" -l '{selector}'" if selector else ""
    head = [f"$ {cmd} -o wide    (as of {short_time(now)})"]
    head += [f"note: {note}"] if note else []
    if not chosen:
        return "\n".join([*head, "No resources found."])
    headers = ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    rows, details = [], []
    for it in sorted(chosen, key=lambda x: (x["metadata"]["namespace"], x["metadata"]["name"])):
        row, why = _pod_row(it, now)
        if every:
            row.insert(0, it["metadata"]["namespace"])
        rows.append(row)
        if why:
            details.append(f"  {it['metadata']['name']}: {why}")
    if every:
        headers.insert(0, "NAMESPACE")
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "   ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in [headers, *rows]
    ]
    if details:
        lines += ["", "pods not ready or restarted (from their status):", *details]
    return cap_answer(
        head,
        lines,
        [],
        lambda n: f"[... {n} lines cut (8,000-char answer cap): use a selector ...]",
    )


@tool(parse_docstring=True)
def recent_deploys(service: str, limit: int = 10) -> str:
    """Show the recent deploys (helm history) of a service, with each revision's CI pipeline, canary result, changes and config diff.

    Args:
        service: Release name (e.g. checkout-api), or "all" for the latest deploys across the cluster.
        limit: How many revisions (or, with "all", deploys) to show, most recent first, 1-50.
    """
    return _recent_deploys(service, limit)


@tool(parse_docstring=True)
def pod_status(namespace: str = "shop-prod", selector: str = "") -> str:
    """List pods (kubectl get pods -o wide): readiness, status, restarts, age, IP, node; and why pods are not ready or restarted.

    Args:
        namespace: Namespace (shop-prod, data, ingress-nginx), or "all".
        selector: Label selector, e.g. app=checkout-api or app.kubernetes.io/name in (orders-db,cart-cache); empty for all pods.
    """
    return _pod_status(namespace, selector)
