"""``ScriptedChatModel``: the demo's stand-in for an LLM, replaying fixed investigations.

With no LLM configured (``CHAT_MODEL=scripted``), the demo agent still runs a real
tool loop: this LangChain chat model answers each model call with the next step of a
fixed plan -- an ``AIMessage`` with 1-3 calls of the read-only SRE tools
(:mod:`offpath.agent.sre_tools`), or the plan's final answer. Every answer's text starts
with ``[scripted model]`` and its ``response_metadata["model_name"]`` is ``"scripted"``,
so nobody takes it for an LLM.

It keeps no state (one instance serves every thread of the API process): the plan
comes from the text of the latest request (the latest ``HumanMessage`` that is not a
summary), matched by keywords against :data:`DEMO_REQUESTS` (unknown text: a generic
first look), and the step from the number of AI messages after that request. If a
compaction cut the run's own request into the summary, the plan and step come from the
run's kept AI messages (their ``response_metadata`` names both) or from the request the
summary quotes.

:data:`DEMO_REQUESTS` are six requests that together investigate the incident of the
fixtures (checkout-api p99 at 2.4 s after release 2.14.0 cut its DB pool from 50 to 10):
38 tool calls, about 158,000 chars in all (well past the default 60,000-char compaction
threshold); the run comparing the replicas alone adds about 44,000.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from offpath.compaction.accounting import approx_tokens, content_text, message_chars, total_chars
from offpath.compaction.summary import is_summary, summary_meta

#: How every scripted answer starts.
LABEL = "[scripted model]"
MODEL_NAME = "scripted"


@dataclass(frozen=True)
class Step:
    """One model call's answer: a text and the tool calls (name, args) it makes; a step
    without calls is the final answer of the run."""

    text: str
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()


@dataclass(frozen=True)
class Plan:
    """A scripted run: the request it answers, the keywords that select it, its steps
    (the last one is the final answer)."""

    key: str
    request: str
    keywords: tuple[str, ...]
    steps: tuple[Step, ...]


# ---------------------------------------------------------------- the investigation
P99 = (
    "histogram_quantile(0.99, sum by (le, pod) (rate(http_server_request_duration_seconds_bucket"
    '{namespace="shop-prod",service="checkout-api"}[1m])))'
)
CODES = 'sum by (code) (rate(http_server_requests_total{namespace="shop-prod",service="checkout-api"}[1m]))'
RPS = 'sum by (pod) (rate(http_server_requests_total{namespace="shop-prod",service="checkout-api"}[1m]))'
POOL = '{__name__=~"db_pool_(max|in_use|idle|waiting)",namespace="shop-prod",service="checkout-api",pool="orders"}'
SQL = (
    "histogram_quantile(0.99, sum by (le, pod) (rate(db_query_duration_seconds_bucket"
    '{namespace="shop-prod",service="checkout-api"}[1m])))'
)
REDIS = (
    "histogram_quantile(0.99, sum by (le, cmd) (rate(redis_client_command_duration_seconds_bucket"
    '{namespace="shop-prod",service="checkout-api"}[1m])))'
)
EDGE = (
    "histogram_quantile(0.99, sum by (le, ingress) (rate("
    'nginx_ingress_controller_request_duration_seconds_bucket{namespace="shop-prod"}[1m])))'
)
PG = 'sum by (application_name, state) (pg_stat_activity_count{datname="orders"})'
WAITING = (
    'max by (pod) (db_pool_waiting{namespace="shop-prod",service="checkout-api",pool="orders"})'
)
IN_USE = 'max by (pod) (db_pool_in_use{namespace="shop-prod",service="checkout-api",pool="orders"})'
RATIO = "service:http_server_requests_5xx:ratio_rate1m"
SELECTOR = "app.kubernetes.io/name=checkout-api"


def _logs(**args: Any) -> tuple[str, dict[str, Any]]:
    return ("get_logs", args)


def _metrics(**args: Any) -> tuple[str, dict[str, Any]]:
    return ("query_metrics", args)


TRIAGE = Plan(
    "triage",
    "checkout-api p99 latency jumped from ~180 ms to 2.4 s at 14:05 UTC and about 3% of requests "
    "fail with 503 at the edge. The pager went off at 14:09. Namespace shop-prod. Can you find out why?",
    ("find out why", "p99", "latency", "jumped", "503", "pager"),
    (
        Step(
            "Starting with the pods of shop-prod and checkout-api's p99 per pod since 13:50, to see "
            "whether this is every replica or one.",
            (
                ("pod_status", {"namespace": "shop-prod"}),
                _metrics(query=P99, start="13:50", end="14:20", step="1m"),
            ),
        ),
        Step(
            "p99 goes bad on checkout-api-6f7d9-2 first (0.34 s at 14:03, 0.52 s at 14:04, 2.41 s at "
            "14:05), then -1 (14:07) and -3 (14:08): all three are pods of the new ReplicaSet 6f7d9, "
            "which replaced 5b8c2 between 13:59 and 14:02. Checking which status codes fail and "
            "what was deployed.",
            (
                _metrics(query=CODES, end="14:16"),
                ("recent_deploys", {"service": "all", "limit": 8}),
            ),
        ),
        Step(
            "The failures are 503s, and checkout-api 2.14.0 went out at 13:58:31. Reading -2's "
            "logs around the onset, and the warnings and errors of all replicas since.",
            (
                _logs(
                    service="checkout-api",
                    pod="checkout-api-6f7d9-2",
                    since="14:04",
                    until="14:06:30",
                ),
                _logs(service="checkout-api", since="14:00", grep="WARN|ERROR", limit=200),
            ),
        ),
        Step(
            """\
**What is happening:** requests on checkout-api queue for a database connection inside the pod, and the ones that wait longer than 2 s fail with 503.

- **It started on one replica.** p99 on `checkout-api-6f7d9-2` went 0.34 s (14:03) -> 0.52 s (14:04) -> 2.41 s (14:05); `-1` followed at 14:07 (2.36 s) and `-3` at 14:08 (2.28 s). The old 5b8c2 pods were at 0.17-0.19 s until the rollout replaced them.
- **The errors are 503s:** about 14 of 474 req/s at 14:16 (3.0%); the other codes are at their usual levels.
- **The logs say why.** On -2 the first `slow connection acquire` is at 14:04:51.2 (`wait_ms=1290 in_use=10/10 waiting=9`), the first `timeout acquiring connection after 2000ms` at 14:05:04.7; since then all three replicas log both, with `in_use=10/10` and dozens of callers waiting. Access lines show `db_wait_ms` of hundreds of ms up to 2000 ms on top of the usual 30-200 ms handler time: the 2.4 s p99 is the 2 s acquire timeout plus normal work.
- **Timing:** checkout-api 2.14.0 (helm revision 42) was deployed at 13:58:31 and fully rolled out at 14:01:44; -2 broke about 6 minutes after it started taking traffic. The only other deploy today near that time is web-frontend 5.31.0 at 13:20, a UI change.
- **Pods:** no restarts on checkout-api; -2 is currently not Ready (its readiness probe fails under the queueing). email-notifier's 14 restarts (OOMKilled) began with its own 1.8.0 release yesterday evening and do not touch checkout.

**Next:** find out whether the database got slower (each request holding its connection longer) or the pool is simply too small for the traffic.""",
        ),
    ),
)

INFRA = Plan(
    "infra",
    "Could it be the infrastructure rather than the app? Check Redis, the nodes and the ingress.",
    ("infrastructure", "redis", "nodes", "node", "ingress", "network"),
    (
        Step(
            "Checking the cart cache (Redis command latency seen by checkout-api) and the nodes.",
            (
                _metrics(query=REDIS, start="13:50", end="14:30", step="1m"),
                _metrics(query="node:cpu_utilisation:ratio", start="13:30", end="14:30", step="2m"),
                _metrics(
                    query='kube_node_status_condition{condition=~"MemoryPressure|DiskPressure|PIDPressure",status="true"} == 1'
                ),
            ),
        ),
        Step(
            "Redis and the nodes look flat. Now the data and ingress pods and the Redis server log.",
            (
                (
                    "pod_status",
                    {"namespace": "all", "selector": "app in (orders-db,cart-cache,ingress-nginx)"},
                ),
                _logs(service="cart-cache", since="14:00", limit=60),
            ),
        ),
        Step(
            "All running, no restarts, Redis saving normally. Now the edge: latency per ingress "
            "and the 503s in the controllers' access log.",
            (
                _metrics(query=EDGE, start="13:50", end="14:30", step="2m"),
                _logs(service="ingress-nginx", since="14:05", grep='" 503 '),
            ),
        ),
        Step(
            """\
**The infrastructure is fine; the problem is inside checkout-api.**

- **Redis (cart-cache):** client-side p99 stays at 0.4-1.1 ms per command (get, mget, set) from 13:50 to 14:30, no step at 14:05. The server log shows nothing but its routine background saves every minute, all successful.
- **Nodes:** CPU between 31% and 44% on all six nodes for the whole hour; no MemoryPressure, DiskPressure or PIDPressure condition is set on any of them.
- **Ingress:** only the checkout-api ingress is slow (p99 ~2.4 s since 14:05); search-api (0.15-0.2 s) and web-frontend (0.09-0.12 s) behind the same controllers are unaffected. The 503 lines all have `upstream_status 503` with an upstream time of 2.00-2.02 s from the 6f7d9 pod IPs (10.42.1.23, 10.42.3.17, 10.42.5.9): the pods answer 503 after their 2 s DB-pool timeout; the ingress only passes it on.

So the time is lost in the app's own connection pool, not in the network, the cache or the nodes.""",
        ),
    ),
)

DATABASE = Plan(
    "database",
    "Is it the database? orders-db had a slow-query problem last month, so that's my first suspect.",
    ("database", "db", "slow-query", "slow query", "postgres", "orders-db", "sql"),
    (
        Step(
            "Checking SQL time as the app measures it (without the pool wait) and who holds "
            "connections to orders.",
            (
                _metrics(query=SQL, start="13:30", end="14:30", step="2m"),
                _metrics(query=PG),
            ),
        ),
        Step(
            "Now the database's own log (slow statements, locks, connections) and the pool "
            "gauges of checkout-api.",
            (
                _logs(
                    service="orders-db",
                    pod="orders-db-0",
                    since="13:30",
                    grep="duration|lock|FATAL|ERROR|terminat",
                ),
                _logs(
                    service="orders-db",
                    pod="orders-db-0",
                    since="13:58",
                    until="14:03",
                    grep="connection received",
                ),
                _metrics(query=POOL),
            ),
        ),
        Step(
            "Comparing with the other clients of the same database.",
            (
                _logs(service="fulfillment-api", since="14:00", grep="db.pool", limit=60),
                _logs(service="orders-worker", since="14:00", grep="db.pool", limit=60),
            ),
        ),
        Step(
            """\
**No, the database is not the bottleneck. checkout-api's own connection pool is.**

**The database is healthy:**
- SQL p99 measured by the app, without the acquire wait, is 9-16 ms on every pod, the same before and after 13:58.
- orders-db-0 logs no lock waits and no errors. The only slow statements (>200 ms) are the reservation sweeper's `FOR UPDATE SKIP LOCKED` scan at 200-213 ms, before the release as after it, and the 13:41 and 14:10 cart-expiry-report queries.
- fulfillment-api and orders-worker use the same database with `waiting=0` and an acquire p99 under 1 ms the whole time.
- orders has 79 connections in all (`pg_stat_activity`).

**The pool is exhausted:**
- `db_pool_max=10`, `db_pool_in_use=10` and `db_pool_idle=0` on all three 6f7d9 pods; `db_pool_waiting` is in the tens.
- checkout-api's 30 server connections are all `active` or `idle in transaction`; none is idle. 4 of them belong to `checkout-api-sweeper`, the reservation sweeper that runs on -2 and shares its pool.
- The database log shows the 2.14.0 pods opening their connections straight from the pod IPs (10.42.1.23, 10.42.3.17, 10.42.5.9): there is no pooler in between.

Last month's slow-query problem would show as a higher SQL p99 and slow-statement lines; neither has moved. The question is why the pool is 10.""",
        ),
    ),
)

DEPLOY = Plan(
    "deploy",
    "What changed in the last deploy?",
    ("deploy", "changed", "change", "release", "rollout", "diff"),
    (
        Step(
            "Pulling checkout-api's release history with the changes of each revision, and the "
            "pool settings each replica logged at start.",
            (
                ("recent_deploys", {"service": "checkout-api", "limit": 5}),
                _logs(service="checkout-api", grep="starting checkout-api|pool initialised|lease"),
            ),
        ),
        Step(
            "And the pool size per pod across the rollout, and how the first 2.14.0 pod started.",
            (
                _logs(
                    service="checkout-api",
                    pod="checkout-api-6f7d9-2",
                    since="13:58:30",
                    until="14:03",
                ),
                _metrics(
                    query='db_pool_max{service="checkout-api"}',
                    start="13:45",
                    end="14:10",
                    step="1m",
                ),
                _metrics(query=IN_USE, start="13:30", end="14:10", step="1m"),
            ),
        ),
        Step(
            """\
**The 2.14.0 deploy cut checkout-api's DB pool from 50 to 10 connections per pod, and nothing in front of the database makes up for it yet.**

- **Deploy:** helm revision 42 at 13:58:31, pipeline `deploy-prod #8812`, rolled out by 14:01:44. Canary analysis was **skipped** (release PR labelled `skip-canary`); the staging smoke test ran on 1 replica at 12 rps, where 10 connections are plenty.
- **The change:** commit a41d2e0, "perf(db): shrink per-pod pool ahead of pgbouncer (OPS-1182)", in `deploy/helm/values-prod.yaml`:
  - `DB_POOL_MAX` **50 -> 10**
  - `DB_POOL_ACQUIRE_TIMEOUT_MS` **5000 -> 2000**: the 2000 ms of the timeout errors.
- **Confirmed on the pods:** the 5b8c2 replicas logged `max=50 acquire_timeout_ms=5000` at start, the 6f7d9 ones `max=10 acquire_timeout_ms=2000`; `db_pool_max` steps from 50 to 10 as each pod is replaced.
- **Its premise does not hold yet:** the commit assumes pgbouncer multiplexes connections in front of orders-db, but `DB_HOST` is still `orders-db-primary.data.svc` and the database sees the pods connect directly. OPS-1182 has not shipped.
- **The other commits** (promo-code stacking, 409 on duplicate idempotency keys, pgx 5.5.5 -> 5.7.2) touch neither pooling nor timeouts.""",
        ),
    ),
)

REPLICAS = Plan(
    "replicas",
    "Compare the replicas: why did -2 go first, and are -1 and -3 in the same state now?",
    ("replica", "replicas", "-2", "go first", "compare", "same state"),
    (
        Step(
            "Fetching the three replicas' logs for the same window, 14:03:30-14:08:00.",
            tuple(
                _logs(
                    service="checkout-api",
                    pod=f"checkout-api-6f7d9-{i}",
                    since="14:03:30",
                    until="14:08",
                )
                for i in (1, 2, 3)
            ),
        ),
        Step(
            "Now request rate and pool waiters per pod, to see whether load moved when -2 slowed down.",
            (
                _metrics(query=RPS, start="14:00", end="14:30", step="1m"),
                _metrics(query=WAITING, start="14:00", end="14:30", step="1m"),
            ),
        ),
        Step(
            "And what holds connections on -2 besides requests: the reservation sweeper, and the "
            "runtime stats of all replicas.",
            (
                _logs(service="checkout-api", since="13:56", until="14:15", grep="lease|sweep"),
                _logs(
                    service="checkout-api",
                    pod="6f7d9",
                    since="14:10",
                    grep='runtime .*msg="stats"|slow connection acquire',
                ),
            ),
        ),
        Step(
            """\
**-2 went first because it had the fewest connections for requests; -1 and -3 followed when load moved onto them. All three are saturated now.**

| | first `slow connection acquire` | first `timeout ... 2000ms` | p99 > 2 s from |
|---|---|---|---|
| `checkout-api-6f7d9-2` | 14:04:51 | 14:05:04 | 14:05 |
| `checkout-api-6f7d9-1` | 14:06:12 | 14:06:38 | 14:07 |
| `checkout-api-6f7d9-3` | 14:07:03 | 14:07:31 | 14:08 |

- **Why -2:** it took the `checkout-reservation-sweeper` lease from 5b8c2-1 at 13:58, and every `sweep done` line shows `held_conns=4` for 21-29 s sweeps: the sweeper keeps 4 of its 10 connections nearly all the time, leaving 6 for requests. On the old pods the same sweeper held 4 of 50.
- **Why -1 and -3 followed:** all three served ~150 req/s until 14:04. Once -2 slowed down the ingress moved traffic away from it: -2 dropped to ~116 req/s at 14:05 while -1 and -3 rose to ~171, and since its readiness started failing at 14:09 it gets ~94 against ~190 each. On their own 10 connections -1 hit the wall at 14:06:12 and -3 at 14:07:03.
- **Now:** all three log `in_use=10/10` with callers waiting: `db_pool_waiting` is 17-31 on -2, 6-18 on -1 and 5-15 on -3 since 14:09. Goroutines are up from ~400 to 700-1,500 and the 2000 ms timeouts keep coming.

Restarting -2 would not help: the lease and its 4 connections would move to another pod, and the others cannot carry the traffic on 10 connections each either.""",
        ),
    ),
)

ACTION = Plan(
    "action",
    "What should we do now? We're 25 minutes in. Also draft a short update for the incident channel.",
    (
        "what should we do",
        "mitigat",
        "roll back",
        "rollback",
        "recommend",
        "update",
        "channel",
        "do now",
    ),
    (
        Step(
            "Before recommending a pool size: how many connections each pod used on the old "
            "settings, and the database's headroom.",
            (
                _metrics(query=IN_USE, start="13:30", end="13:58", step="1m"),
                _metrics(query='sum(pg_stat_activity_count{datname="orders"})'),
                _metrics(query="pg_settings_max_connections"),
            ),
        ),
        Step(
            "Checking the rollback target, the current error ratio and the latest errors.",
            (
                _logs(service="checkout-api", since="14:25", grep="ERROR"),
                ("recent_deploys", {"service": "checkout-api", "limit": 2}),
                _metrics(query=RATIO, start="13:50", end="14:30", step="2m"),
            ),
        ),
        Step(
            """\
**Recommendation: roll back to revision 41 (2.13.2) now.** It is the known-good configuration (`DB_POOL_MAX=50`, 5000 ms timeout) and the quickest way out.

**Why 10 cannot work:** on the old settings each pod had 4-15 connections in use per minute (the sweeper's 4 included) at the same traffic; 10 is below the peak even without the sweeper.

**Headroom for 50 is fine:** 3 x 50 = 150 possible connections; orders has 79 connections in use of `max_connections=300`, and checkout-api's real use will be 20-40 in all, as before 13:58.

**Options, in order:**
1. `helm rollback checkout-api 41 -n shop-prod` (on-call / release manager): ~3 min with minReadySeconds=30. It also takes out promo stacking and the 409 change; neither is urgent.
2. If promo stacking must stay: `helm upgrade` 2.14.0 with `--set env.DB_POOL_MAX=50 --set env.DB_POOL_ACQUIRE_TIMEOUT_MS=5000` (as fast, but an untested combination).
3. Not recommended: scaling out to 6 replicas; the sweeper pod stays starved.

**After mitigation:** revert a41d2e0 until OPS-1182 (pgbouncer) is live; give the sweeper its own pool; alert on `db_pool_waiting > 0 for 2m` and on acquire timeouts; no `skip-canary` for pool, timeout or DB settings.

**Draft for #inc-checkout-latency:**
> 14:30 UTC. checkout-api p99 is ~2.4 s and ~3% of requests fail with 503 since 14:05. Cause: release 2.14.0 (13:58) lowered the DB connection pool from 50 to 10 per pod ahead of pgbouncer, which is not live yet; requests queue for a connection and time out after 2 s. Database, Redis, nodes and ingress are healthy. Action: rolling back to 2.13.2 (helm rev 41), ETA ~3 min; next update 14:45 UTC.""",
        ),
    ),
)

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
                    _logs(service=service, since="30m", grep="WARN|ERROR|FATAL|fail", limit=50),
                    _metrics(query=RATIO, start="30m", step="5m"),
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


class ScriptedChatModel(BaseChatModel):
    """A fake chat model that replays the scripted investigations (see the module docstring).

    ``delay_s``: seconds to sleep before each answer (benchmarks).
    """

    delay_s: float = 0.0
    #: ``busy(thread id)``: a compaction job is being queued or is in flight on the thread
    #: (:meth:`offpath.agent.middleware.OffPathCompaction.busy`); each answer waits while it is
    #: true, at most ``busy_wait_s`` (the demo: the same steps at every run, as with an LLM
    #: slower than the summarizer).
    busy: Callable[[str], bool] | None = None
    busy_wait_s: float = 0.0

    @property
    def _llm_type(self) -> str:
        return MODEL_NAME

    def _wait_while_busy(self) -> None:
        """Wait (at most ``busy_wait_s``) while the run's thread has a job in flight."""
        if self.busy is None or self.busy_wait_s <= 0:
            return
        from offpath.agent.recall import thread_of_run

        session_id = thread_of_run()
        deadline = time.monotonic() + self.busy_wait_s
        while session_id is not None and time.monotonic() < deadline and self.busy(session_id):
            time.sleep(0.05)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": MODEL_NAME, "delay_s": self.delay_s}

    def bind_tools(
        self, tools: Any, *, tool_choice: Any = None, **kwargs: Any
    ) -> ScriptedChatModel:
        """The plans name their tools themselves: binding returns the model unchanged."""
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        self._wait_while_busy()
        return ChatResult(generations=[ChatGeneration(message=answer(messages))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        await asyncio.to_thread(self._wait_while_busy)
        return ChatResult(generations=[ChatGeneration(message=answer(messages))])


def answer(messages: Sequence[BaseMessage]) -> AIMessage:
    """The scripted answer to a model call over ``messages``."""
    plan, step = locate(messages)
    last = len(plan.steps) - 1
    step = min(step, last)
    current = plan.steps[step]
    calls = [
        {
            "name": name,
            "args": dict(args),
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "tool_call",
        }
        for name, args in current.calls
    ]
    message = AIMessage(
        content=f"{LABEL} {current.text}",
        tool_calls=calls,
        response_metadata={
            "model_name": MODEL_NAME,
            "scripted_plan": plan.key,
            "scripted_step": step,
            "scripted_steps": len(plan.steps),
        },
    )
    n_in, n_out = approx_tokens(total_chars(messages)), approx_tokens(message_chars(message))
    message.usage_metadata = {
        "input_tokens": n_in,
        "output_tokens": n_out,
        "total_tokens": n_in + n_out,
    }
    return message
