"""The last three scripted investigations: what the deploy changed, why the replicas broke
one after the other, and what to do now (with the incident channel's update)."""

from __future__ import annotations

from offpath.agent.scripted.plan import (
    IN_USE,
    RATIO,
    RPS,
    WAITING,
    Plan,
    Step,
    logs_call,
    metrics_call,
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
                logs_call(
                    service="checkout-api", grep="starting checkout-api|pool initialised|lease"
                ),
            ),
        ),
        Step(
            "And the pool size per pod across the rollout, and how the first 2.14.0 pod started.",
            (
                logs_call(
                    service="checkout-api",
                    pod="checkout-api-6f7d9-2",
                    since="13:58:30",
                    until="14:03",
                ),
                metrics_call(
                    query='db_pool_max{service="checkout-api"}',
                    start="13:45",
                    end="14:10",
                    step="1m",
                ),
                metrics_call(query=IN_USE, start="13:30", end="14:10", step="1m"),
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
                logs_call(
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
                metrics_call(query=RPS, start="14:00", end="14:30", step="1m"),
                metrics_call(query=WAITING, start="14:00", end="14:30", step="1m"),
            ),
        ),
        Step(
            "And what holds connections on -2 besides requests: the reservation sweeper, and the "
            "runtime stats of all replicas.",
            (
                logs_call(service="checkout-api", since="13:56", until="14:15", grep="lease|sweep"),
                logs_call(
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
                metrics_call(query=IN_USE, start="13:30", end="13:58", step="1m"),
                metrics_call(query='sum(pg_stat_activity_count{datname="orders"})'),
                metrics_call(query="pg_settings_max_connections"),
            ),
        ),
        Step(
            "Checking the rollback target, the current error ratio and the latest errors.",
            (
                logs_call(service="checkout-api", since="14:25", grep="ERROR"),
                ("recent_deploys", {"service": "checkout-api", "limit": 2}),
                metrics_call(query=RATIO, start="13:50", end="14:30", step="2m"),
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
