"""The first three scripted investigations: the triage of the latency incident (where the
time goes), then ruling out the infrastructure (Redis, nodes, ingress) and the database."""

from __future__ import annotations

from offpath.agent.scripted.plan import (
    CODES,
    EDGE,
    P99,
    PG,
    POOL,
    REDIS,
    SQL,
    Plan,
    Step,
    logs_call,
    metrics_call,
)

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
                metrics_call(query=P99, start="13:50", end="14:20", step="1m"),
            ),
        ),
        Step(
            "p99 goes bad on checkout-api-6f7d9-2 first (0.34 s at 14:03, 0.52 s at 14:04, 2.41 s at "
            "14:05), then -1 (14:07) and -3 (14:08): all three are pods of the new ReplicaSet 6f7d9, "
            "which replaced 5b8c2 between 13:59 and 14:02. Checking which status codes fail and "
            "what was deployed.",
            (
                metrics_call(query=CODES, end="14:16"),
                ("recent_deploys", {"service": "all", "limit": 8}),
            ),
        ),
        Step(
            "The failures are 503s, and checkout-api 2.14.0 went out at 13:58:31. Reading -2's "
            "logs around the onset, and the warnings and errors of all replicas since.",
            (
                logs_call(
                    service="checkout-api",
                    pod="checkout-api-6f7d9-2",
                    since="14:04",
                    until="14:06:30",
                ),
                logs_call(service="checkout-api", since="14:00", grep="WARN|ERROR", limit=200),
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
                metrics_call(query=REDIS, start="13:50", end="14:30", step="1m"),
                metrics_call(
                    query="node:cpu_utilisation:ratio", start="13:30", end="14:30", step="2m"
                ),
                metrics_call(
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
                logs_call(service="cart-cache", since="14:00", limit=60),
            ),
        ),
        Step(
            "All running, no restarts, Redis saving normally. Now the edge: latency per ingress "
            "and the 503s in the controllers' access log.",
            (
                metrics_call(query=EDGE, start="13:50", end="14:30", step="2m"),
                logs_call(service="ingress-nginx", since="14:05", grep='" 503 '),
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
                metrics_call(query=SQL, start="13:30", end="14:30", step="2m"),
                metrics_call(query=PG),
            ),
        ),
        Step(
            "Now the database's own log (slow statements, locks, connections) and the pool "
            "gauges of checkout-api.",
            (
                logs_call(
                    service="orders-db",
                    pod="orders-db-0",
                    since="13:30",
                    grep="duration|lock|FATAL|ERROR|terminat",
                ),
                logs_call(
                    service="orders-db",
                    pod="orders-db-0",
                    since="13:58",
                    until="14:03",
                    grep="connection received",
                ),
                metrics_call(query=POOL),
            ),
        ),
        Step(
            "Comparing with the other clients of the same database.",
            (
                logs_call(service="fulfillment-api", since="14:00", grep="db.pool", limit=60),
                logs_call(service="orders-worker", since="14:00", grep="db.pool", limit=60),
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
