#!/usr/bin/env python3
"""Generate examples/incident-checkout-latency.json, the demo's example incident investigation.

A synthetic, internally consistent SRE session in the neutral transcript format of the shared test
transcripts: checkout-api p99 latency jumps to 2.4 s at 14:05 UTC because release v2.14.0 (13:58)
lowered DB_POOL_MAX from 50 to 10 before pgbouncer was in place. Six human turns and 25 tool calls
(kubectl logs/describe/events/top, Prometheus, psql, helm history, git diff), ~102k chars.
All variation comes from random.Random seeded from SEED, so every run writes the same bytes.

Run from the repository root:  python examples/make_incident.py
"""

import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

SEED = 20250311
OUT = Path(__file__).with_name("incident-checkout-latency.json")
NS, SVC = "shop-prod", 'namespace="shop-prod",service="checkout-api"'
IMAGE = "registry.offpath.internal/shop/checkout-api:2.14.0"
DAY = datetime(2025, 3, 11, tzinfo=UTC).timestamp()


def T(hms):
    """'14:04:51.2' or '14:05' -> epoch seconds on the incident day (UTC)."""
    h, m, *s = hms.split(":")
    return DAY + int(h) * 3600 + int(m) * 60 + float(s[0] if s else 0)


def iso(t, ms=True):
    base = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return base + (f".{round(t * 1000) % 1000:03d}Z" if ms else "Z")


def hms(t):
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


def noise(*key):
    return random.Random(":".join(map(str, (SEED, *key))))


class Pod(NamedTuple):  # a v2.14.0 replica
    name: str
    ip: str
    node: str
    created: float
    ready: float
    killed: float  # stopped by the rollback
    warn: float  # first "slow connection acquire" WARN
    err: float  # first "timeout acquiring connection" ERROR
    waiting: tuple  # range of pool waiters once saturated


def _pod(row):
    name, ip, node, *times, w = row.split()
    return Pod(name, ip, node, *map(T, times), tuple(map(int, w.split("-"))))


#  pod                  ip         node          created  ready    killed   first WARN first ERROR waiting
NEW = {p.name: p for p in map(_pod, """\
checkout-api-6f7d9-2 10.42.1.23 ip-10-0-21-88 13:58:38 13:59:10 14:37:08 14:04:51.2 14:05:04.7 17-34
checkout-api-6f7d9-1 10.42.3.17 ip-10-0-12-41 13:59:40 14:00:12 14:38:10 14:06:12.4 14:06:38.9 6-19
checkout-api-6f7d9-3 10.42.5.9  ip-10-0-33-7  14:00:42 14:01:14 14:39:12 14:07:03.6 14:07:31.2 5-16\
""".splitlines())}  # fmt: skip
P1, P2, P3 = (f"checkout-api-6f7d9-{i}" for i in (1, 2, 3))
OLD_STOPPED = {1: "13:59:40", 2: "14:00:42", 3: "14:01:44"}
BACK_READY = {4: "14:36:38", 5: "14:37:40", 6: "14:38:42"}
# every checkout-api pod in the window: ready .. stopped (old 2.13.2, new 2.14.0, rollback pods)
LIFE = {f"checkout-api-5b8c2-{i}": (T("13:00"), T(end)) for i, end in OLD_STOPPED.items()}
LIFE |= {p.name: (p.ready, p.killed) for p in NEW.values()}
LIFE |= {f"checkout-api-5b8c2-{i}": (T(ready), T("15:00")) for i, ready in BACK_READY.items()}
ROLLOUT_DONE, READY_FAIL = T("14:01:44"), T("14:08:47")


# ---------------------------------------------------------------- metric models (per pod, per minute)
def alive(p, t):
    return LIFE[p][0] + 30 <= t < LIFE[p][1] + 60


def weight(p, t):  # ingress EWMA steers away from the slow pod, more so once readiness flaps
    return 1.0 if p != P2 or t < NEW[P2].warn else 0.67 if t < READY_FAIL else 0.5


def rps(p, t):
    total = 430 + 45 * min(max((t - T("13:50")) / 1500, 0), 1)
    share = weight(p, t) / sum(weight(q, t) for q in LIFE if alive(q, t))
    return total * share * noise("rps", p, t).uniform(0.985, 1.015)


def err_frac(p, t):
    r = noise("err", p, t)
    if p in NEW and t >= NEW[p].err + 30:
        return (0.052 if p == P2 else 0.024) * r.uniform(0.9, 1.1)
    return r.uniform(0.0003, 0.0005)


FIXED_P99 = {(P2, "14:03"): 0.34, (P2, "14:04"): 0.52, (P2, "14:05"): 2.41, (P1, "14:06"): 0.36}
FIXED_P99 |= {(P1, "14:07"): 2.36, (P3, "14:07"): 0.33, (P3, "14:08"): 2.28}
FIXED_P99 = {(p, T(m)): v for (p, m), v in FIXED_P99.items()}


def p99(p, t):
    r = noise("p99", p, t)
    if p not in NEW:
        return r.uniform(0.168, 0.192)
    sat = t >= NEW[p].warn
    return FIXED_P99.get((p, t)) or (r.uniform(2.28, 2.46) if sat else r.uniform(0.19, 0.26))


def waiting(p, t):
    if p not in NEW or t < NEW[p].warn:
        return {(P2, T("14:03")): 1, (P2, T("14:04")): 3}.get((p, t), 0)
    return noise("wait", p, t).randint(*NEW[p].waiting)


def live_sum(fn, t):
    return sum(fn(p, t) for p in LIFE if alive(p, t))


def errors(p, t):
    return rps(p, t) * err_frac(p, t)


def err_ratio(t):
    return live_sum(errors, t) / live_sum(rps, t)


# ---------------------------------------------------------------- output formatting
def prom(query, series, start=None, end=None, at=None):
    """A Prometheus API response; series = [(labels, fn(t) -> value or None)]."""
    rows, kind = [], "matrix" if start is not None else "vector"
    for labels, fn in series:
        if kind == "vector":
            rows.append({"metric": labels, "value": [int(at), f"{fn(at):.4g}"]})
            continue
        vals = [
            [t, f"{fn(t):.4g}"] for t in range(int(start), int(end) + 1, 60) if fn(t) is not None
        ]
        rows += [{"metric": labels, "values": vals}] if vals else []
    when = (
        f"range: {iso(start, False)} .. {iso(end, False)}  step=60s"
        if start
        else f"time: {iso(at, False)}"
    )
    body = ",\n ".join(json.dumps(r, separators=(",", ":")) for r in rows)
    head = f'query: {query}\n{when}\n{{"status":"success","data":{{"resultType":"{kind}","result":['
    return head + (f"\n {body}\n" if rows else "") + "]}}"


def by_pod(fn):
    return [({"pod": p}, lambda t, p=p: fn(p, t) if alive(p, t) else None) for p in LIFE]


def table(headers, rows):
    """psql-style table."""
    rows = [[str(c) for c in r] for r in rows]
    w = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = [
        " " + " | ".join(c.ljust(w[i]) for i, c in enumerate(cells)) for cells in [headers, *rows]
    ]
    rule = "+".join("-" * (x + 2) for x in w)
    return "\n".join(
        [lines[0].rstrip(), rule] + [x.rstrip() for x in lines[1:]] + [f"({len(rows)} rows)"]
    )


def parse(rows):
    return [r.split("|") for r in rows.strip().splitlines()]


def ago(now, t):  # kubectl's relative ages
    s = int(now - t)
    return f"{s}s" if s < 120 else f"{s // 60}m{s % 60}s" if s < 600 else f"{s // 60}m"


# ---------------------------------------------------------------- pod logs: one stream per pod, sliced
LOG = dict(
    line.split(" ", 1)
    for line in """\
boot INFO boot msg="starting checkout-api" version=2.14.0 commit=9c41e7b pod={pod}
config INFO config msg="config loaded" env=prod access_log_sample=0.002 db_host=orders-db-primary.data.svc:5432 redis=cart-cache.data.svc:6379
pool INFO db.pool msg="pool initialised" pool=orders min=2 max=10 acquire_timeout_ms=2000
redis INFO cache msg="redis connected" addr=cart-cache.data.svc:6379 pool_size=32
lease INFO leader msg="acquired lease" lease=checkout-reservation-sweeper holder={pod}
sweeper INFO sweeper msg="sweeper started" workers=4 pool=orders interval=30s
listen INFO http msg="listening" addr=:8080 metrics=:9090
access {level} http req={rid:012x} {path} status={status} dur_ms={dur} db_wait_ms={wait} ua={ua}
kafka INFO kafka msg="published" topic=order-events partition={part} offset={offset}
cache INFO cache msg="stats" window=60s hits={hits} misses={misses} hit_ratio=0.94 p99_ms={p99:.2f}
runtime INFO runtime msg="stats" goroutines={g} heap_mb={heap} gc_pause_p99_ms={gc:.1f}
sweep INFO sweeper msg="sweep done" expired={n} batches={b} held_conns=4 dur_ms={ms}
warn WARN db.pool msg="slow connection acquire" pool=orders wait_ms={ms} in_use=10/10 waiting={w} suppressed={sup}
error ERROR db.pool msg="timeout acquiring connection after 2000ms" pool=orders in_use=10/10 waiting={w} suppressed={sup}\
""".splitlines()
)
PATHS = ["GET /v1/cart/{c}", "POST /v1/cart/{c}/items", "GET /v1/shipping/quote"]
PATHS += ["POST /v1/checkout/confirm", "POST /v1/payments/intent", "GET /v1/promo/{p}"]
BASE_MS, PATH_WEIGHTS = [40, 70, 90, 160, 210, 30], [34, 18, 12, 16, 12, 8]
UAS = ["web-frontend/5.31.0", "ios/7.12.1", "android/7.12.0", "web-frontend/5.31.0"]
PROMOS = ["SPRING25", "FREESHIP", "WELCOME10"]
FIRST_WARN = {}  # pod -> (wait_ms, waiting) of the first pool WARN, quoted by the assistant


def build_stream(p: Pod):
    r, out, leader = noise("log", p.name), [], p.name == P2

    def emit(t, key, **fields):
        level, logger, text = LOG[key].format(**fields).split(" ", 2)
        out.append((t, f"{iso(t)} {level:<5} {logger:<8} {text}"))

    boot = p.created + 7.3
    startup = ["boot", "config", "pool", "redis"] + (["lease", "sweeper"] if leader else [])
    for k, key in enumerate(startup):
        emit(boot + 0.17 * k + 1.2 * (key in ("lease", "sweeper")), key, pod=p.name)
    emit(p.ready - 0.4, "listen")
    t = p.ready
    while t < p.killed:  # access log sampled 1 in 500 at ~150 req/s per pod
        t += r.expovariate(0.3 * weight(p.name, t) * (1.1 if t > T("14:05") and not leader else 1))
        i = r.choices(range(6), weights=PATH_WEIGHTS)[0]
        path = PATHS[i].format(c=f"c_{r.getrandbits(30):08x}", p=r.choice(PROMOS))
        status = r.choices([200, 400, 404, 409], weights=[985, 4, 8, 3])[0]
        queued = t >= p.warn and r.random() > 0.3  # saturated pool: most requests queue
        wait = r.randint(120, 1990) if queued else r.choice([0, 0, 0, 1, 2])
        dur = wait + int(BASE_MS[i] * r.lognormvariate(0, 0.45))
        if t >= p.err and r.random() < err_frac(p.name, t + 30) * 1.5:  # acquire timed out
            status, wait, dur = 503, 2000, 2000 + r.randint(2, 14)
        level, ua = "INFO" if status < 500 else "ERROR", r.choice(UAS)
        emit(
            t,
            "access",
            level=level,
            rid=r.getrandbits(48),
            path=path,
            status=status,
            dur=dur,
            wait=wait,
            ua=ua,
        )
        if i == 3 and status == 200 and r.random() < 0.5:
            emit(t + 0.004, "kafka", part=r.randint(0, 11), offset=r.randint(4_810_000, 4_890_000))
    for k in range(int((p.killed - p.ready) // 60)):  # per-minute stats
        ts, hot = p.ready + 60 * k + r.uniform(0, 2), p.ready + 60 * k > p.warn
        hits = r.randint(6900, 7400) if leader else r.randint(8100, 8800)
        misses = int(hits * r.uniform(0.058, 0.066))
        emit(ts, "cache", hits=hits, misses=misses, p99=r.uniform(0.5, 0.9))
        g = r.randint(*(1100, 1500) if leader and hot else (700, 1100) if hot else (360, 430))
        emit(ts + 0.01, "runtime", g=g, heap=r.randint(170, 230), gc=r.uniform(0.3, 1.4))
    for k in range(int((p.killed - boot) // 30) if leader else 0):  # the reservation sweeper
        ts, ms = boot + 32 + 30 * k + r.uniform(0, 1), r.randint(21000, 29500)
        emit(ts, "sweep", n=r.randint(90, 240), b=r.randint(3, 6), ms=ms)
    for k, x in enumerate(range(int(p.warn), int(p.killed), 20)):  # rate-limited: 1 line / 20 s
        ms, w, sup = r.randint(900, 1900), r.randint(*p.waiting), r.randint(40, 160)
        if k == 0:
            (ms, w), sup = FIRST_WARN.setdefault(p.name, (ms, min(w, 9))), 0
        emit(p.warn if k == 0 else x + r.uniform(0, 1), "warn", ms=ms, w=w, sup=sup)
    for k, x in enumerate(range(int(p.err), int(p.killed), 15)):  # 1 line / 15 s
        sup = 0 if k == 0 else r.randint(90, 140) if leader else r.randint(25, 60)
        emit(p.err if k == 0 else x + r.uniform(0, 1), "error", w=r.randint(*p.waiting), sup=sup)
    return sorted(out)


STREAMS = {name: build_stream(p) for name, p in NEW.items()}


def klogs(pod, a, b):
    args = {"namespace": NS, "pod": pod, "container": "checkout-api", "since_time": iso(a, False)}
    text = "\n".join(line for t, line in STREAMS[pod] if a <= t < b)
    return "kubectl_logs", args | {"until_time": iso(b, False)}, text


# ---------------------------------------------------------------- kubectl, psql, helm, git outputs
OTHER_EVENTS = """\
13:41:03|Normal|SuccessfulCreate|cronjob/cart-expiry-report|Created job cart-expiry-report-29031221
13:41:58|Normal|Completed|job/cart-expiry-report-29031221|Job completed
13:52:17|Normal|SuccessfulRescale|horizontalpodautoscaler/search-api|New size: 4; reason: cpu resource utilization (percentage of request) above target
14:10:30|Normal|SuccessfulCreate|cronjob/cart-expiry-report|Created job cart-expiry-report-29031250
14:11:22|Normal|Completed|job/cart-expiry-report-29031250|Job completed"""
ROLLOUT_EVENTS = """\
0|Normal|ScalingReplicaSet|deployment/checkout-api|Scaled up replica set checkout-api-6f7d9 {up}
0|Normal|SuccessfulCreate|replicaset/checkout-api-6f7d9|Created pod: {pod}
0|Normal|Scheduled|pod/{pod}|Successfully assigned shop-prod/{pod} to {node}.eu-west-1.compute.internal
1.5|Normal|Pulling|pod/{pod}|Pulling image "{image}"
5.6|Normal|Pulled|pod/{pod}|Successfully pulled image "{image}" in 4.1s
7|Normal|Created|pod/{pod}|Created container checkout-api
7.2|Normal|Started|pod/{pod}|Started container checkout-api
62|Normal|ScalingReplicaSet|deployment/checkout-api|Scaled down replica set checkout-api-5b8c2 {down}
62|Normal|Killing|pod/checkout-api-{old}|Stopping container checkout-api"""
STEPS = [(P2, "5b8c2-1", "to 1", "to 2 from 3"), (P1, "5b8c2-2", "to 2 from 1", "to 1 from 2")]
STEPS += [(P3, "5b8c2-3", "to 3 from 2", "to 0 from 1")]
PROBE_503 = "Readiness probe failed: HTTP probe failed with statuscode: 503"


def events(now):
    ev = [(T(t), *rest) for t, *rest in parse(OTHER_EVENTS)]
    for pod, old, up, down in STEPS:
        fill = dict(pod=pod, old=old, up=up, down=down, node=NEW[pod].node, image=IMAGE)
        ev += [
            (NEW[pod].created + float(dt), *rest)
            for dt, *rest in parse(ROLLOUT_EVENTS.format(**fill))
        ]
    rows = [(ago(now, t), *rest) for t, *rest in sorted(ev)]
    for pod, n, first, last in [(P1, 3, "14:12:40", "14:15:02"), (P2, 11, "14:08:47", "14:15:21")]:
        seen = f"{ago(now, T(last))} (x{n} over {ago(T(last), T(first))})"
        rows.append((seen, "Warning", "Unhealthy", f"pod/{pod}", PROBE_503))
    rows.insert(0, ("LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "   ".join(c.ljust(w[i]) for i, c in enumerate(r[:4])) + "   " + r[4] for r in rows
    )


def describe(pod, now):
    p = NEW[pod]
    unhealthy = f"{ago(now, T('14:15:21'))} (x11 over {ago(T('14:15:21'), READY_FAIL)})"
    return f"""\
Name:             {pod}
Namespace:        {NS}
Service Account:  checkout-api
Node:             {p.node}.eu-west-1.compute.internal/{p.node[3:].replace("-", ".")}
Start Time:       Tue, 11 Mar 2025 {hms(p.created)} +0000
Labels:           app.kubernetes.io/name=checkout-api
                  app.kubernetes.io/version=2.14.0
                  pod-template-hash=6f7d9
Status:           Running
IP:               {p.ip}
Controlled By:    ReplicaSet/checkout-api-6f7d9
Containers:
  checkout-api:
    Image:          {IMAGE}
    Ports:          8080/TCP, 9090/TCP
    State:          Running
      Started:      Tue, 11 Mar 2025 {hms(p.created + 7.2)} +0000
    Ready:          True
    Restart Count:  0
    Limits:         cpu: 1, memory: 768Mi
    Requests:       cpu: 500m, memory: 512Mi
    Liveness:       http-get http://:8080/livez delay=10s timeout=1s period=10s #success=1 #failure=3
    Readiness:      http-get http://:8080/readyz delay=20s timeout=1s period=5s #success=1 #failure=3
    Environment:
      APP_ENV:                     prod
      DB_HOST:                     orders-db-primary.data.svc
      DB_USER:                     checkout_api
      DB_PASSWORD:                 <set to the key 'password' in secret 'checkout-api-db'>
      DB_POOL_MAX:                 10
      DB_POOL_MIN:                 2
      DB_POOL_ACQUIRE_TIMEOUT_MS:  2000
      REDIS_URL:                   redis://cart-cache.data.svc:6379/0
      ACCESS_LOG_SAMPLE:           0.002
      LEADER_ELECTION_LEASE:       checkout-reservation-sweeper
Conditions:
  Type              Status
  Ready             True
  ContainersReady   True
QoS Class:          Burstable
Node-Selectors:     node-pool=general
Events:
  Type     Reason     Age                    From               Message
  Normal   Scheduled  {ago(now, p.created):<22} default-scheduler  Successfully assigned {NS}/{pod} to {p.node}.eu-west-1.compute.internal
  Normal   Pulled     {ago(now, p.created + 5.6):<22} kubelet            Successfully pulled image "{IMAGE}" in 4.1s
  Normal   Started    {ago(now, p.created + 7.2):<22} kubelet            Started container checkout-api
  Warning  Unhealthy  {unhealthy:<22} kubelet            {PROBE_503}"""


def top(now):
    r, nodes = noise("top", now), ["12-41", "14-202", "21-88", "23-150", "33-7", "35-96"]
    out = [f"{'NAME':<46}CPU(cores)   CPU%   MEMORY(bytes)   MEMORY%"]
    for n in nodes:
        cpu, mem = r.randint(1240, 1780), r.randint(8300, 9900)
        name = f"ip-10-0-{n}.eu-west-1.compute.internal"
        out.append(f"{name:<46}{cpu}m        {cpu // 40}%    {mem}Mi          {mem // 158}%")
    out += ["", f"{'NAME':<28}CPU(cores)   MEMORY(bytes)"]
    out += [f"{p:<28}{r.randint(96, 142)}m         {r.randint(288, 331)}Mi" for p in NEW]
    return "\n".join(out)


QUERIES = """\
SELECT c.id, c.user_id, c.items FROM carts c WHERE c.id = $1
COMMIT
INSERT INTO orders (id, cart_id, user_id, total_cents, currency) VALUES ($1, $2, $3, $4, $5)
UPDATE inventory_reservations SET status = 'held', expires_at = now() + interval '15 min'
SELECT code, discount_pct, stackable FROM promo_codes WHERE code = ANY($1)""".splitlines()
PG_COLUMNS = (
    "pid client_addr application_name state wait_event backend_start xact_age query".split()
)
SWEEP_Q = "SELECT id FROM inventory_reservations WHERE expires_at < now() ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED"


def pg_activity():
    r, rows = noise("pg"), []
    states = ["active"] * 14 + ["idle in transaction"] * 12
    r.shuffle(states)
    for p in NEW.values():
        for k in range(10):
            sweeper = p.name == P2 and k < 4  # the reservation sweeper shares the pod's pool
            state = ("active", "idle in transaction")[k % 2] if sweeper else states.pop()
            q = SWEEP_Q if sweeper else r.choice(QUERIES)
            busy = "IO: WALSync" if q == "COMMIT" else r.choice(["", "", "IO: DataFileRead"])
            age = r.uniform(19, 29) if sweeper else r.uniform(0.004, 0.19)
            app = "checkout-api-sweeper" if sweeper else "checkout-api"
            wait = busy if state == "active" else "Client: ClientRead"
            start = hms(p.ready - 20 + k * 0.4)
            row = r.randint(18000, 48000), p.ip, app, state, wait, start, f"00:00:{age:06.3f}"
            rows.append((*row, q[:72]))
    rows.sort(key=lambda x: (x[1], x[2] == "checkout-api", -float(x[6][6:])))  # as ORDER BY below
    return table(PG_COLUMNS, rows)


PG_SUMMARY = parse("""
checkout-api|active|14
checkout-api|idle in transaction|12
checkout-api-sweeper|active|2
checkout-api-sweeper|idle in transaction|2
fulfillment-api|active|3
fulfillment-api|idle|21
orders-worker|active|2
orders-worker|idle|16
postgres_exporter|active|1
psql (sre-assistant, read-only)|active|1
reporting-etl|active|1
reporting-etl|idle|4""")
PG_TOTAL = sum(int(n) for *_, n in PG_SUMMARY)
OTHERS = sum(int(n) for app, _, n in PG_SUMMARY if not app.startswith("checkout"))
PG_STATEMENTS = parse("""
4812331|0.41|38.2|SELECT c.id, c.user_id, c.items FROM carts c WHERE c.id = $1
1094870|2.87|61.5|INSERT INTO orders (id, cart_id, user_id, total_cents, currency) VALUES
1361722|1.12|44.0|UPDATE inventory_reservations SET status = 'held', expires_at = now() +
61544|18.64|212.9|SELECT id FROM inventory_reservations WHERE expires_at < now() ORDER BY
803117|0.36|19.7|SELECT code, discount_pct, stackable FROM promo_codes WHERE code = ANY(
2230906|0.05|11.2|COMMIT""")

HELM = """\
REVISION  UPDATED                   STATUS      CHART               APP VERSION  DESCRIPTION
38        Wed Mar  5 10:21:44 2025  superseded  checkout-api-1.9.3  2.12.4       Upgrade complete
39        Thu Mar  6 16:02:10 2025  superseded  checkout-api-1.9.4  2.13.0       Upgrade complete
40        Mon Mar 10 09:12:37 2025  superseded  checkout-api-1.9.4  2.13.1       Upgrade complete
41        Mon Mar 10 15:47:03 2025  superseded  checkout-api-1.9.5  2.13.2       Upgrade complete
42        Tue Mar 11 13:58:31 2025  deployed    checkout-api-1.10.0 2.14.0       Upgrade complete

pipeline: deploy-prod #8812  triggered by merge of release/2.14.0 (tag v2.14.0, commit 9c41e7b)
  13:52:06 build+test passed   13:57:40 staging smoke passed (1 replica, 12 rps synthetic)
  13:58:31 helm upgrade checkout-api --namespace shop-prod --values deploy/helm/values-prod.yaml
  14:01:44 rollout status: deployment "checkout-api" successfully rolled out (3/3, maxSurge=1, minReadySeconds=30)
  canary analysis: skipped (release PR labelled skip-canary: "small release, config + feature flag")"""

DIFF = """\
$ git log --format='%h %ad %an  %s' --date=format:'%m-%d %H:%M' v2.13.2..v2.14.0
9c41e7b 03-11 13:44 release-bot   release: v2.14.0
a41d2e0 03-11 11:02 D. Kowalczyk  perf(db): shrink per-pod pool ahead of pgbouncer (OPS-1182)
77e0b3f 03-10 17:25 A. Mensah     fix(api): return 409 on duplicate idempotency key
4c9d1aa 03-10 16:58 R. Ishikawa   feat(promo): allow stacking of SPRING25 with FREESHIP
e12f6c8 03-10 16:03 renovate[bot] chore(deps): bump github.com/jackc/pgx/v5 from 5.5.5 to 5.7.2

$ git diff --stat v2.13.2 v2.14.0
 deploy/helm/Chart.yaml                 |  4 +-
 deploy/helm/values-prod.yaml           |  7 ++--
 go.mod                                 |  2 +-
 go.sum                                 |  4 +-
 internal/api/idempotency.go            | 18 ++++++---
 internal/promo/stacking.go             | 61 +++++++++++++++++++++++++++++
 internal/promo/stacking_test.go        | 88 ++++++++++++++++++++++++++++++++++++++++
 7 files changed, 174 insertions(+), 10 deletions(-)

$ git show a41d2e0
commit a41d2e0b51f3c7e92d04a8f6e3b1c09d7a55e214
Author: D. Kowalczyk
Date:   Tue Mar 11 11:02:19 2025 +0000

    perf(db): shrink per-pod pool ahead of pgbouncer (OPS-1182)

    pgbouncer (transaction mode) will multiplex client connections, so each
    pod only needs a small pool. Fail fast instead of queueing for 5 s.
    Config-only change, no code touched.

diff --git a/deploy/helm/values-prod.yaml b/deploy/helm/values-prod.yaml
@@ -31,12 +31,13 @@ env:
   APP_ENV: prod
   DB_HOST: orders-db-primary.data.svc
   DB_NAME: orders
   DB_USER: checkout_api
-  DB_POOL_MAX: "50"
+  # pgbouncer (OPS-1182) multiplexes; keep per-pod pools small
+  DB_POOL_MAX: "10"
   DB_POOL_MIN: "2"
-  DB_POOL_ACQUIRE_TIMEOUT_MS: "5000"
+  DB_POOL_ACQUIRE_TIMEOUT_MS: "2000"
   REDIS_URL: redis://cart-cache.data.svc:6379/0
   ACCESS_LOG_SAMPLE: "0.002"
   LEADER_ELECTION_LEASE: checkout-reservation-sweeper"""


# ---------------------------------------------------------------- the conversation
MSGS, NCALL = [], [0]


def add(kind, content, **extra):
    MSGS.append({"type": kind, "content": content, **extra, "id": f"incident-{len(MSGS) + 1:04d}"})


def ai(text, *calls):
    """An ai message with its tool calls (name, args, output), then one tool message per call."""
    tcs = []
    for name, args, _ in calls:
        NCALL[0] += 1
        tcs.append({"id": f"call_{NCALL[0]:03d}", "name": name, "args": args})
    add("ai", text, **({"tool_calls": tcs} if tcs else {}))
    for tc, (_, _, out) in zip(tcs, calls, strict=True):
        add("tool", out, tool_call_id=tc["id"])


def prange(q, series, a, b):
    args = {"query": q, "start": iso(a, False), "end": iso(b, False), "step": "60s"}
    return "prometheus_query", args, prom(q, series, a, b)


def pinst(q, series, at):
    return "prometheus_query", {"query": q, "time": iso(at, False)}, prom(q, series, at=at)


def const(pairs, label="pod"):
    return [({label: k}, lambda t, v=v: v) for k, v in pairs]


def sql(query, out):
    return "db_query", {"database": "orders", "sql": query}, out


N1, N2, N4, N5, N6 = T("14:16"), T("14:19"), T("14:25"), T("14:29"), T("14:45")
BUCKETS = f"http_server_request_duration_seconds_bucket{{{SVC}}}"
Q_P99 = f"histogram_quantile(0.99, sum by (le, pod) (rate({BUCKETS}[1m])))"
Q_CODES = f"sum by (code) (rate(http_server_requests_total{{{SVC}}}[5m]))"
Q_REDIS = f"histogram_quantile(0.99, sum by (le, cmd) (rate(redis_client_command_duration_seconds_bucket{{{SVC}}}[1m])))"
Q_NODES = 'kube_node_status_condition{condition=~"MemoryPressure|DiskPressure|PIDPressure",status="true"} == 1'
Q_POOL = '{__name__=~"db_pool_(max|in_use|idle|waiting)",namespace="shop-prod",pool="orders"}'
Q_SQL = f"histogram_quantile(0.99, sum by (le, pod) (rate(db_query_duration_seconds_bucket{{{SVC}}}[1m])))"
Q_RPS = f"sum by (pod) (rate(http_server_requests_total{{{SVC}}}[1m]))"
Q_WAIT = 'max by (pod) (db_pool_waiting{namespace="shop-prod",pool="orders"})'
Q_PEAK = 'max by (pod) (max_over_time(db_pool_in_use{namespace="shop-prod",pool="orders"}[1d] offset 35m))'
Q_AVG = 'avg by (pod) (avg_over_time(db_pool_in_use{namespace="shop-prod",pool="orders"}[1d] offset 35m))'
Q_5XX = f'sum(rate(http_server_requests_total{{{SVC},code=~"5.."}}[1m])) / sum(rate(http_server_requests_total{{{SVC}}}[1m]))'
Q_ACTIVITY = """SELECT application_name, state, count(*) AS conns FROM pg_stat_activity
WHERE datname = 'orders' GROUP BY 1, 2 ORDER BY 1, 2;"""
Q_DETAIL = """SELECT pid, client_addr, application_name, state, wait_event_type || ': ' || wait_event AS wait_event,
backend_start::time(0), now() - xact_start AS xact_age, left(query, 72) AS query FROM pg_stat_activity
WHERE application_name LIKE 'checkout-api%' ORDER BY client_addr, application_name DESC, xact_age DESC;"""
Q_LOCKS = """SELECT blocked.pid, blocked.query, blocking.pid AS blocking_pid FROM pg_locks bl
JOIN pg_stat_activity blocked ON blocked.pid = bl.pid
JOIN pg_locks kl ON kl.locktype = bl.locktype AND kl.relation IS NOT DISTINCT FROM bl.relation AND kl.granted
JOIN pg_stat_activity blocking ON blocking.pid = kl.pid WHERE NOT bl.granted;
SELECT calls, round(mean_exec_time::numeric, 2) AS mean_ms, round(max_exec_time::numeric, 1) AS max_ms, left(query, 70)
FROM pg_stat_statements WHERE userid = 'checkout_api'::regrole ORDER BY total_exec_time DESC LIMIT 6;"""
Q_ROLES = "SELECT rolname, rolconnlimit FROM pg_roles WHERE rolname IN ('checkout_api', 'fulfillment_api', 'orders_worker', 'reporting');"
CODES = {"200": 0.9327, "201": 0.0271, "400": 0.0023, "404": 0.0051, "409": 0.0013, "500": 0.0004}
TOTAL1, E503 = live_sum(rps, N1), live_sum(errors, N1)
FAILED = sum(60 * live_sum(errors, t) for t in range(int(T("14:05")), int(T("14:40")), 60))
REDIS = {"get": (0.0004, 0.0007), "mget": (0.0006, 0.0011), "set": (0.0005, 0.0009)}
REDIS_SERIES = [({"cmd": c}, lambda t, c=c: noise("redis", c, t).uniform(*REDIS[c])) for c in REDIS]
TOP_ARGS = {
    "resource": "nodes,pods",
    "namespace": NS,
    "selector": "app.kubernetes.io/name=checkout-api",
}
# checkout-api pods of the past day (revisions 40 and 41)
OLD_PODS = [f"checkout-api-{rs}-{i}" for rs in ("7c4f1", "5b8c2") for i in (1, 2, 3)]
PEAK, AVG = [17, 19, 18, 23, 21, 24], [7.6, 7.9, 7.4, 8.4, 8.1, 8.6]
POOL = {"max": 10, "in_use": 10, "idle": 0}
w2, r_before = FIRST_WARN[P2], rps(P2, T("14:04"))
r_after = rps(P2, T("14:07")), rps(P1, T("14:07"))
p2, p1, p3 = NEW[P2], NEW[P1], NEW[P3]

add(
    "system",
    """\
You are the on-call SRE assistant for the Offpath shop platform (Kubernetes cluster prod-eu-1, region eu-west-1). \
You can read, never change, production: kubectl_logs, kubectl_describe, kubectl_get_events, kubectl_top, \
prometheus_query (PromQL, instant or range), db_query (read-only role on the orders PostgreSQL database), \
deploy_history (helm + CI pipeline records) and deploy_diff (git history between two release tags).

Work from evidence: check before you conclude, say what you ruled out and how, and quote the pod names, timestamps \
and numbers your conclusions rest on. Times are UTC. Prefer the smallest reversible mitigation and say who has to \
run it; never run write operations yourself. Keep answers short enough to paste into the incident channel.""",
)
add(
    "human",
    "checkout-api p99 latency jumped from ~180 ms to 2.4 s at 14:05 UTC and the error rate is around 3%, "
    "mostly 503s at the edge. Pager went off at 14:09. Namespace shop-prod. Can you find out why?",
)
ai(
    "Starting with per-pod p99 over the last 25 minutes to see whether this is every replica or one.",
    prange(Q_P99, by_pod(p99), T("13:50"), T("14:15")),
)
ai(
    "It starts on checkout-api-6f7d9-2 at 14:05, then -1 at 14:07 and -3 at 14:08, and all three are pods of a new "
    "ReplicaSet (6f7d9) that replaced 5b8c2 between 13:59 and 14:01. Checking which status codes the errors are.",
    pinst(
        Q_CODES, const([(c, TOTAL1 * f) for c, f in CODES.items()] + [("503", E503)], "code"), N1
    ),
)
ai(
    f"{E503:.1f} of {TOTAL1:.0f} req/s are 503s ({E503 / TOTAL1:.1%}); 500s are at their usual background level. "
    "Looking at the namespace events around the rollout.",
    ("kubectl_get_events", {"namespace": NS, "sort_by": ".lastTimestamp"}, events(N1 + 10)),
)
ai(
    "The rollout itself was clean (no restarts, no failed pulls), but -2 has been failing readiness with 503 since "
    "14:08:47. Pulling -2's logs around the onset.",
    klogs(P2, T("14:04"), T("14:06:30")),
)
ai(
    "Those are connection-pool acquire timeouts, not slow handlers. Checking how the pool is configured on that pod.",
    ("kubectl_describe", {"kind": "pod", "namespace": NS, "name": P2}, describe(P2, N1 + 25)),
)
ai(
    "Ruling out the cart cache next (Redis command latency from the client side).",
    prange(Q_REDIS, REDIS_SERIES, T("13:50"), T("14:15")),
)
ai(
    "Redis is flat. Checking node and pod resource usage.",
    ("kubectl_top", TOP_ARGS, top(N1)),
)
ai(
    "And node pressure conditions, to be sure nothing is being evicted or throttled.",
    pinst(Q_NODES, [], N1 + 60),
)
ai(f"""\
**What is happening:** requests on checkout-api are queueing for a database connection inside the pod, and the ones that wait longer than 2 s fail with 503.

- **It started on one replica.** p99 on `{P2}` went 0.34 s (14:03) → 0.52 s (14:04) → 2.41 s (14:05); `{P1}` followed at 14:07 (2.36 s) and `{P3}` at 14:08 (2.28 s). The old 5b8c2 pods were at 0.17–0.19 s until they were replaced.
- **Errors are 503s:** {E503:.1f} of {TOTAL1:.0f} req/s ({E503 / TOTAL1:.1%}). Other codes are at normal levels.
- **The logs on -2 say why.** First `slow connection acquire` at {hms(p2.warn)}.2 (`wait_ms={w2[0]} in_use=10/10 waiting={w2[1]}`), first `timeout acquiring connection after 2000ms` at {hms(p2.err)}.7; since then the logger drops 90–140 similar lines per 15 s. The sampled access lines show `db_wait_ms` of several hundred to 2000 ms while the handler time on top is the usual 30–200 ms. So the ~2.4 s p99 is the 2 s acquire timeout plus normal handler time.
- **Pool config on the pod:** `DB_POOL_MAX=10`, `DB_POOL_ACQUIRE_TIMEOUT_MS=2000`, image `checkout-api:2.14.0`. -2 also holds the `checkout-reservation-sweeper` leader lease (sweeper with 4 workers on the same `orders` pool).
- **Rollout:** the 2.14.0 ReplicaSet went out 13:58:38–{hms(ROLLOUT_DONE)}, so -2 broke about 6 minutes after it started taking traffic and 3 minutes after the rollout finished.

**Ruled out:**
- Redis: p99 0.4–1.1 ms per command throughout, cache hit ratio 0.94.
- Nodes: 31–44% CPU, no Memory/Disk/PID pressure conditions, no restarts or OOM kills.
- CPU on the pods: they use only ~0.1 core each. They are waiting, not working, so CPU-based autoscaling will not help.

**Open question:** is the database slow, so each request holds its connection longer, or is a 10-connection pool too small for this traffic? I'd check pg_stat_activity and the query timings next.""")

add(
    "human",
    "Is it the DB? The orders DB had a slow-query problem last month, so that's my first suspect.",
)
ai(
    "Checking from the database side: who holds connections to `orders` and in what state.",
    sql(
        "SHOW max_connections;\n" + Q_ACTIVITY,
        " max_connections\n-----------------\n 300\n(1 row)\n\n"
        + table(["application_name", "state", "conns"], PG_SUMMARY),
    ),
)
ai(
    "checkout-api holds exactly 30 connections and none of them is idle. Listing them per client.",
    sql(Q_DETAIL, pg_activity()),
)
ai(
    "Now lock waits, and whether any statement has got slower.",
    sql(
        Q_LOCKS,
        " pid | query | blocking_pid\n"
        "-----+-------+--------------\n(0 rows)\n\n"
        + table(["calls", "mean_ms", "max_ms", "left"], PG_STATEMENTS),
    ),
)
ai(
    "The database side looks healthy. Checking the pool metrics the app exports.",
    pinst(
        Q_POOL,
        [
            (
                {"__name__": f"db_pool_{m}", "pod": p},
                lambda t, m=m, p=p: POOL[m] if m in POOL else waiting(p, t),
            )
            for p in NEW
            for m in ("max", "in_use", "idle", "waiting")
        ],
        N2,
    ),
)
ai(
    "One more: p99 of the SQL itself per pod (measured by the app, without the acquire wait), before and after the deploy.",
    prange(
        Q_SQL, by_pod(lambda p, t: noise("sql", p, t).uniform(0.009, 0.016)), T("13:50"), T("14:19")
    ),
)
ai(f"""\
**No, the database is not the bottleneck. The connection pool inside checkout-api is.**

**The DB is healthy:**
- SQL p99 measured by the app, excluding the acquire wait, is 9–16 ms on every pod, the same before and after 13:58.
- No blocked lock waits.
- Top checkout statements average 0.05–2.9 ms. The sweeper's `FOR UPDATE SKIP LOCKED` scan averages 18.6 ms, which is normal for it.
- `orders` has {PG_TOTAL} of 300 connections in use.

**The pool is exhausted:**
- checkout-api has exactly **30** server connections: 3 pods × `DB_POOL_MAX=10`. All 30 are `active` or `idle in transaction` (`ClientRead`, meaning Postgres is waiting on the app between statements of a transaction). None is idle.
- The app's own metrics agree: `db_pool_in_use` = `db_pool_max` = 10 and `db_pool_idle` = 0 on all three pods. `db_pool_waiting` is {waiting(P2, N2)} on -2, {waiting(P1, N2)} on -1 and {waiting(P3, N2)} on -3 at 14:19.
- On `{P2}` ({p2.ip}), 4 of the 10 connections belong to `checkout-api-sweeper`, with transactions 19–29 s long. The reservation sweeper shares the request pool, so -2 has only **6** connections for HTTP traffic. That is why it fell over first.
- The connections go straight from the pod IPs (10.42.x.x) to orders-db-primary; there is no pooler in between.

So the time is spent queueing for one of 10 (effectively 6 on -2) client-side connections, not running SQL. The next question is why the pool is 10. Last month's slow-query problem would show up as higher `mean_ms` and a higher SQL p99, and neither has moved.""")

add("human", "What changed in the last deploy?")
ai(
    "Pulling the release history first.",
    ("deploy_history", {"release": "checkout-api", "namespace": NS, "max": 5}, HELM),
)
ai(
    "Now the diff between the previous release (2.13.2, revision 41) and 2.14.0.",
    (
        "deploy_diff",
        {
            "repo": "shop/checkout-api",
            "from": "v2.13.2",
            "to": "v2.14.0",
            "show": ["log", "stat", "a41d2e0"],
        },
        DIFF,
    ),
)
ai(f"""\
**The 2.14.0 deploy cut the DB connection pool from 50 to 10 per pod, and nothing in the path makes up for it yet.**

- **Deploy:** helm revision 42, 13:58:31, pipeline `deploy-prod #8812`, fully rolled out at {hms(ROLLOUT_DONE)}. Canary analysis was **skipped** (release PR labelled `skip-canary`), and staging smoke ran on 1 replica at 12 rps, where a 10-connection pool is plenty.
- **The change** (a41d2e0, "perf(db): shrink per-pod pool ahead of pgbouncer (OPS-1182)") in `deploy/helm/values-prod.yaml`:
  - `DB_POOL_MAX` **50 → 10**
  - `DB_POOL_ACQUIRE_TIMEOUT_MS` **5000 → 2000**, which is the exact 2000 ms in the timeout errors
- **The premise does not hold yet.** The commit assumes pgbouncer in transaction mode multiplexes connections in front of the DB. `DB_HOST` is still `orders-db-primary.data.svc`, and pg_stat_activity shows pod IPs connecting directly. OPS-1182 has not shipped, so the pool change went out before the thing it depends on.
- **Other commits look unrelated:**
  - promo-code stacking (one extra indexed `promo_codes` lookup, 0.36 ms mean)
  - 409 on duplicate idempotency keys
  - pgx 5.5.5 → 5.7.2
  None of these touches pooling or timeouts, and SQL latency has not moved.

This matches the timeline: each pod went bad a few minutes after it started taking full traffic on the new pool, and the one that also runs the sweeper went first.""")

add("human", "Compare the replicas. Why did -2 go first, and are -1 and -3 in the same state now?")
ai(
    "Fetching the three replicas' logs for the same window (14:03:30–14:08:00) in parallel.",
    *(klogs(p, T("14:03:30"), T("14:08")) for p in (P1, P2, P3)),
)
ai(
    "Now per-pod request rate, to see whether load shifted when -2 slowed down.",
    prange(Q_RPS, by_pod(rps), T("14:00"), N4),
)
ai("And pool waiters per pod over the same range.", prange(Q_WAIT, by_pod(waiting), T("14:00"), N4))
ai(f"""\
**-2 went first because it had the fewest connections. The other two followed because load moved onto them. All three are saturated now.**

| | first `slow connection acquire` | first `timeout ... 2000ms` | p99 > 2 s from | waiting now |
|---|---|---|---|---|
| `{P2}` | {hms(p2.warn)} | {hms(p2.err)} | 14:05 | {waiting(P2, N4)} |
| `{P1}` | {hms(p1.warn)} | {hms(p1.err)} | 14:07 | {waiting(P1, N4)} |
| `{P3}` | {hms(p3.warn)} | {hms(p3.err)} | 14:08 | {waiting(P3, N4)} |

- **Why -2 was first:** it holds the `checkout-reservation-sweeper` lease. Its logs show `held_conns=4` on every `sweep done` line, and each sweep takes 21–29 s, so the sweeper keeps 4 of the 10 connections almost all the time. All three pods took equal load until then (~{r_before:.0f} req/s each at 14:04), and on -2 six connections ran out at {hms(p2.warn)}.
- **Why -1 and -3 followed:** once -2 got slow, the ingress (EWMA balancing) moved traffic off it. At 14:07, -2 was down to ~{r_after[0]:.0f} req/s and -1/-3 were up to ~{r_after[1]:.0f} req/s each. With full load on only 10 connections, -1 hit the wall at {hms(p1.warn)} and -3 at {hms(p3.warn)}. Since -2 began failing readiness at 14:08:47, even more traffic has moved to the other two.
- **Current state, all three identical:** `in_use=10/10`, growing waiter queues and goroutine counts (about 400 before → 700–1,500 now), and a steady stream of 2000 ms timeouts. Before the onset the logs on every pod are routine INFO lines: `db_wait_ms` 0–2, 30–300 ms requests, cache hit ratio 0.94.

Restarting or deleting -2 would not help. The sweeper lease would move to another pod and take 4 connections there, and the remaining pods already cannot carry the traffic on 10 connections each.""")

add("human", "What should we do now? We're 30 minutes in.")
ai(
    "Before recommending a pool size, checking DB headroom and the per-role connection limit.",
    sql(
        Q_ROLES,
        table(
            ["rolname", "rolconnlimit"],
            parse("checkout_api|160\nfulfillment_api|80\norders_worker|60\nreporting|10"),
        ),
    ),
)
ai(
    "And how many connections each pod actually used on the old settings over the past day (window ends before the deploy).",
    pinst(Q_PEAK, const(zip(OLD_PODS, PEAK, strict=True)), N5),
)
ai(
    "Average as well, to size the pool properly.",
    pinst(Q_AVG, const(zip(OLD_PODS, AVG, strict=True)), N5),
)
ai(f"""\
**Recommendation: roll back to revision 41 (2.13.2) now.** It is the known-good config (`DB_POOL_MAX=50`, 5000 ms timeout) and the quickest way out.

**Why 10 cannot work:** on the old settings each pod averaged {min(AVG)}–{max(AVG)} connections in use and peaked at **{min(PEAK)}–{max(PEAK)}** over the past day. The sweeper's 4 are part of that. A 10-connection pool is below the daily peak even without the sweeper.

**Headroom for 50 is fine:**
- 3 × 50 = 150 possible connections, under the `checkout_api` role limit of 160.
- Other clients use {OTHERS} connections, so the total stays under `max_connections=300`.
- Real usage will be about 25–75, as it was before 13:58.

**Options, in order:**
1. **`helm rollback checkout-api 41 -n shop-prod`** (owner: on-call / release manager). Takes ~3 min with minReadySeconds=30. It also removes promo stacking and the 409 change; neither was urgent.
2. If the promo feature has to stay: `helm upgrade` 2.14.0 with `--set env.DB_POOL_MAX=50 --set env.DB_POOL_ACQUIRE_TIMEOUT_MS=5000`. This is as quick, but it makes an untested values combination the new revision.
3. **Not recommended:** scaling out to 6 replicas (6 × 10 = 60). It buys capacity, but the sweeper pod stays starved and it just moves the problem.

**After mitigation:**
- Revert a41d2e0 on main, or gate it on OPS-1182 actually being live (`DB_HOST` pointing at pgbouncer).
- Give the reservation sweeper its own small pool so it cannot starve request handling.
- Alert on `db_pool_waiting > 0 for 2m` and on acquire timeouts. Neither our latency nor our CPU alerts pointed at the pool.
- Don't allow `skip-canary` on releases that change pool, timeout or DB settings.""")

add(
    "human",
    "We went with the rollback: `helm rollback checkout-api 41` at 14:36. Can you confirm we've recovered "
    "and write a short summary for the incident doc?",
)
ai("Checking per-pod p99 across the rollback.", prange(Q_P99, by_pod(p99), T("14:25"), N6))
ai("And the overall 5xx ratio.", prange(Q_5XX, [({}, err_ratio)], T("14:25"), N6))
ai(f"""\
**Recovered.** The rollback pods (`checkout-api-5b8c2-4/-5/-6`, ready 14:36:38–14:38:42) serve at p99 0.17–0.19 s. The last 6f7d9 pod was stopped at {hms(p3.killed)}. The 5xx ratio went from {err_ratio(T("14:36")):.1%} at 14:36 to {err_ratio(T("14:41")):.2%} at 14:41, back to the pre-incident baseline.

### Incident summary: checkout-api latency and 503s, 2025-03-11

**Impact:** {hms(p2.warn)}–{hms(p3.killed)} UTC. checkout-api p99 rose from ~0.18 s to ~2.4 s and about 3% of requests failed with 503, roughly {round(FAILED, -3):,.0f} failed requests, checkout confirmations included. The failures happened while waiting for a DB connection, before any write, so there were no partial orders.

**Root cause:** release 2.14.0 (helm rev 42, deployed 13:58:31) included config commit a41d2e0, which lowered `DB_POOL_MAX` from 50 to 10 and `DB_POOL_ACQUIRE_TIMEOUT_MS` from 5000 to 2000 on the assumption that pgbouncer (OPS-1182) fronts orders-db. It does not yet. A pod at ~150 req/s needs 8 connections on average and up to {max(PEAK)} at peak, so requests queued for a connection and failed after 2 s (`timeout acquiring connection after 2000ms`).

**Why it spread:**
- `{P2}` failed first ({hms(p2.warn)}) because the reservation sweeper holds 4 of its 10 connections, leaving 6 for requests.
- Ingress load balancing then shifted traffic to -1 ({hms(p1.warn)}) and -3 ({hms(p3.warn)}), which saturated in turn.

**Ruled out:**
- orders-db: SQL p99 9–16 ms unchanged, no lock waits, {PG_TOTAL}/300 connections.
- Redis: p99 < 1.1 ms, hit ratio 0.94.
- Nodes: no pressure, 31–44% CPU, no restarts.
- The other 2.14.0 commits.

**Detection gap:** the page came at 14:09 on latency. No alert exists on pool waiters or acquire timeouts. The canary was skipped (`skip-canary` label) and the staging smoke test ran at 12 rps on one replica.

**Remediation:** `helm rollback checkout-api 41` at 14:36, recovered by 14:39.

**Follow-ups:**
1. Revert a41d2e0 and re-land it only after OPS-1182 is live (`DB_HOST` → pgbouncer).
2. Give the reservation sweeper a dedicated pool.
3. Add an alert on `db_pool_waiting > 0 for 2m` and on acquire timeouts.
4. Require canary analysis for config changes to pool, timeout and DB settings.
5. Load-test pool settings at production rps before release.
6. Re-ship promo stacking (4c9d1aa) in 2.14.1 without the pool change.""")

SOURCE = {
    "repo": "offpath/example",
    "path": "examples/incident-checkout-latency.json",
    "commit": "generated",
}
DESCRIPTION = "Synthetic SRE investigation: checkout-api p99 2.4 s after deploy v2.14.0 cut DB_POOL_MAX 50->10"


def main():
    """Write OUT. Guarded, so that examples/make_sre_fixtures.py can reuse this module's models."""
    doc = {"source": SOURCE | {"license": "MIT"}, "description": DESCRIPTION, "messages": MSGS}
    OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({len(MSGS)} messages, {NCALL[0]} tool calls)")


if __name__ == "__main__":
    main()
