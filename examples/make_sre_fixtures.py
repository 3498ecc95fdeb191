#!/usr/bin/env python3
"""Generate examples/sre/, the fixtures behind the demo's read-only SRE tools (offpath.agent.sre_tools).

The incident of examples/make_incident.py (checkout-api p99 2.4 s from 14:05 UTC after release
v2.14.0 lowered DB_POOL_MAX from 50 to 10), as the tools see it at 14:30 UTC on 2025-03-11, with
the rest of the cluster around it (other services, the orders database, Redis, the ingress, a
few red herrings). It reuses that generator's models (pods, log streams, per-minute series), so
the numbers agree with the example investigation. Written:

    manifest.json               cluster, "now", covered time ranges, services and their pods
    logs/<service>/<pod>.log    container logs, one line each, RFC 3339 time first
                                (as `kubectl logs --timestamps` prints them), 13:00-14:30
                                plus each container's start-up lines
    metrics.json                per-minute series 13:30-14:30, Prometheus range-query results
    deploys.json                helm-history-like releases per service, with pipeline and changes
    pods.json                   kubectl-get-pods-like List (shop-prod, data, ingress-nginx)
    README.md

All variation comes from random.Random seeded from make_incident.SEED and fixed keys, so every
run writes the same bytes.

Run from the repository root:  python examples/make_sre_fixtures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "sre"


def _load_incident():
    """examples/make_incident.py as a module (its own copy: this script adjusts its LIFE)."""
    spec = importlib.util.spec_from_file_location("make_incident", HERE / "make_incident.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mi = _load_incident()
T, iso, noise, NEW, P1, P2, P3 = mi.T, mi.iso, mi.noise, mi.NEW, mi.P1, mi.P2, mi.P3
NS = mi.NS
NOW = T("14:30")  # the fixtures' "now": the incident is 25 minutes old, nothing rolled back yet
LOG_START, MET_START = T("13:00"), T("13:30")
DAY0 = mi.DAY - 86400  # 10 March


def at(day, hms):
    h, m, s = map(int, hms.split(":"))
    return day + h * 3600 + m * 60 + s


def minute(t):
    return int(t // 60 * 60)


def pg_time(t):
    return iso(t).replace("T", " ")[:-1]  # the same millisecond as the kubectl timestamp


# ---------------------------------------------------------------- checkout-api pods
#: the 2.13.2 replicas of revision 41 (10 March), replaced by the 2.14.0 rollout
OLD = {}
for i, (ip, node) in enumerate(
    [
        ("10.42.2.31", "ip-10-0-14-202"),
        ("10.42.4.12", "ip-10-0-23-150"),
        ("10.42.0.45", "ip-10-0-35-96"),
    ],
    start=1,
):
    name, created = f"checkout-api-5b8c2-{i}", at(DAY0, "15:47:10") + 62 * (i - 1)
    stop = T(mi.OLD_STOPPED[i])
    OLD[name] = mi.Pod(name, ip, node, created, created + 32, stop, stop, stop, (0, 0))
OLD_LEADER = "checkout-api-5b8c2-1"  # ran the reservation sweeper until -2 of 6f7d9 took the lease
HANDOVER = T("13:58:44")
# the old replicas were alive since 10 March: the incident's rate model starts them at 13:00
mi.LIFE.update({name: (p.ready, p.killed) for name, p in OLD.items()})
CHECKOUT = {**OLD, **NEW}
IMAGE_OLD = mi.IMAGE.replace("2.14.0", "2.13.2")


def emit(out, t, level, logger, text):
    out.append((t, f"{iso(t)} {level:<5} {logger:<8} {text}"))


def old_stream(p):
    """An old replica's log: its start-up lines (10 March), then 13:00 until it was stopped."""
    lines = []
    for t, line in mi.build_stream(p):  # its whole life, at 2.13.2 with the old pool settings
        if t < p.ready + 1 or t >= LOG_START:
            line = line.replace("version=2.14.0 commit=9c41e7b", "version=2.13.2 commit=5e0b7a3")
            lines.append(
                (
                    t,
                    line.replace(
                        "max=10 acquire_timeout_ms=2000", "max=50 acquire_timeout_ms=5000"
                    ),
                )
            )
    r = noise("oldlog", p.name)
    if p.name == OLD_LEADER:
        boot = p.created + 7.3
        emit(
            lines,
            boot + 1.88,
            "INFO",
            "leader",
            f'msg="acquired lease" lease=checkout-reservation-sweeper holder={p.name}',
        )
        emit(
            lines,
            boot + 2.05,
            "INFO",
            "sweeper",
            'msg="sweeper started" workers=4 pool=orders interval=30s',
        )
        t = LOG_START + r.uniform(0, 30)
        while t < HANDOVER:
            n, b, ms = r.randint(90, 240), r.randint(3, 6), r.randint(20500, 28900)
            emit(
                lines,
                t,
                "INFO",
                "sweeper",
                f'msg="sweep done" expired={n} batches={b} held_conns=4 dur_ms={ms}',
            )
            t += 30 + r.uniform(0, 1)
        holder = "new_holder=checkout-api-6f7d9-2"
        emit(
            lines,
            HANDOVER,
            "INFO",
            "leader",
            f'msg="lost lease" lease=checkout-reservation-sweeper {holder}',
        )
        emit(lines, HANDOVER + 0.02, "INFO", "sweeper", 'msg="sweeper stopped" reason="lease lost"')
    emit(lines, p.killed, "INFO", "http", 'msg="shutting down" signal=SIGTERM grace=30s')
    emit(lines, p.killed + 1.4, "INFO", "http", 'msg="drained" in_flight=0')
    emit(
        lines,
        p.killed + 1.5,
        "INFO",
        "db.pool",
        f'msg="pool closed" pool=orders open={r.randint(9, 16)}',
    )
    return sorted(lines)


def checkout_logs():
    logs = {name: old_stream(p) for name, p in OLD.items()}
    logs |= {name: [x for x in mi.STREAMS[name] if x[0] < NOW] for name in NEW}
    return logs


# ---------------------------------------------------------------- other services' logs
FULFILLMENT = ["fulfillment-api-7b9e4-1", "fulfillment-api-7b9e4-2"]
WORKERS = ["orders-worker-5d8f1-1", "orders-worker-5d8f1-2"]
INGRESS = ["ingress-nginx-controller-7d9c8-1", "ingress-nginx-controller-7d9c8-2"]
SEARCH = [f"search-api-6c2a7-{i}" for i in (1, 2, 3, 4)]
FRONTEND = [f"web-frontend-9f3b2-{i}" for i in (1, 2, 3)]
NOTIFIER = "email-notifier-74c1d-1"
NOTIFIER_STARTED, NOTIFIER_OOM = T("14:28:21"), T("14:28:03")


def fulfillment_logs(pod):
    r, out = noise("fulfillment", pod), []
    paths = ["GET /v1/fulfillment/orders/o_{x:08x}", "POST /v1/fulfillment/shipments"]
    paths += [
        "GET /v1/fulfillment/warehouses/{w}/capacity",
        "PATCH /v1/fulfillment/orders/o_{x:08x}/status",
    ]
    base = [35, 120, 55, 80]
    t = LOG_START + r.uniform(0, 5)
    while t < NOW:
        i = r.choices(range(4), weights=[50, 15, 20, 15])[0]
        path = paths[i].format(x=r.getrandbits(32), w=r.choice(["dub-1", "dub-2", "ams-1"]))
        status = r.choices([200, 201, 404, 409], weights=[960, 25, 10, 5])[0]
        dur, wait = int(base[i] * r.lognormvariate(0, 0.4)), r.choice([0, 0, 0, 1])
        emit(
            out,
            t,
            "INFO",
            "http",
            f"req={r.getrandbits(48):012x} {path} status={status} dur_ms={dur} db_wait_ms={wait}",
        )
        t += r.expovariate(0.08)
    for k in range(int((NOW - LOG_START) // 60)):
        ts = LOG_START + 60 * k + 11.3 + r.uniform(0, 0.5)
        use = r.randint(2, 7)
        emit(
            out,
            ts,
            "INFO",
            "db.pool",
            f'msg="stats" pool=orders in_use={use}/40 idle={r.randint(14, 19)} waiting=0 acquire_p99_ms={r.uniform(0.2, 0.9):.1f}',
        )
    return sorted(out)


def worker_logs(pod):
    r, out = noise("worker", pod), []
    parts = [0, 2, 4, 6, 8, 10] if pod.endswith("-1") else [1, 3, 5, 7, 9, 11]
    t = LOG_START + r.uniform(0, 10)
    while t < NOW:
        slow = t > T("14:05")  # fewer confirmed orders while checkout fails
        records = r.randint(28, 61) - (r.randint(0, 3) if slow else 0)
        emit(
            out,
            t,
            "INFO",
            "consumer",
            f'msg="batch processed" topic=order-events partition={r.choice(parts)} records={records} lag={r.randint(0, 40)} dur_ms={r.randint(40, 140)}',
        )
        t += 10 + r.uniform(-0.3, 0.3)
    for k in range(int((NOW - LOG_START) // 60)):
        ts = LOG_START + 60 * k + 31.7 + r.uniform(0, 0.5)
        emit(
            out,
            ts,
            "INFO",
            "db.pool",
            f'msg="stats" pool=orders in_use={r.randint(1, 4)}/20 idle={r.randint(12, 16)} waiting=0 acquire_p99_ms={r.uniform(0.2, 0.8):.1f}',
        )
    return sorted(out)


def notifier_logs():
    """The current container of a pod that is OOM-killed every hour or two since yesterday's
    release (a red herring: nothing to do with checkout)."""
    out, t = [], NOTIFIER_STARTED + 0.4
    for dt, level, logger, text in [
        (0, "INFO", "main", 'msg="starting email-notifier" version=1.8.0 commit=d41be09'),
        (0.2, "INFO", "templates", 'msg="preloading templates" count=412 locales=9'),
        (
            0.9,
            "INFO",
            "kafka",
            'msg="consumer joined" group=email-notifier topic=order-events partitions=12',
        ),
        (6.8, "INFO", "templates", 'msg="template cache warm" entries=3708 heap_mb=391'),
        (61.2, "WARN", "runtime", 'msg="heap above soft limit" heap_mb=455 limit_mb=480'),
        (92.4, "WARN", "runtime", 'msg="heap above soft limit" heap_mb=471 limit_mb=480'),
    ]:
        if t + dt < NOW:
            emit(out, t + dt, level, logger, text)
    return out


def ingress_logs():
    """Access log of the two ingress-nginx controllers. Sampled (the fixture would be hundreds of
    MB otherwise): 1 in 3000 requests, and 1 in 100 of those answered 5xx."""
    r, out = noise("ingress"), {p: [] for p in INGRESS}
    ips = {name: p.ip for name, p in CHECKOUT.items()}
    paths = [p.replace("{c}", "c_{c:08x}") for p in mi.PATHS]

    def line(t, client, req, status, size, ua, rlen, rt, upstream, addr, ut):
        stamp = datetime.fromtimestamp(t, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
        ctrl = INGRESS[r.random() < 0.5]
        out[ctrl].append(
            (
                t,
                f'{iso(t)} {client} - - [{stamp}] "{req} HTTP/2.0" {status} {size} "https://shop.offpath.example/" '
                f'"{ua}" {rlen} {rt:.3f} [{upstream}] [] {addr} {size} {ut:.3f} {status} {r.getrandbits(128):032x}',
            )
        )

    t = LOG_START
    while t < NOW:
        m = minute(t)
        pods = [p for p in CHECKOUT if mi.alive(p, m)]
        total = sum(mi.rps(p, m) for p in pods)
        errs = sum(mi.errors(p, m) for p in pods)
        # one line per 3000 requests, plus one per 100 failed ones
        rate = (total - errs) / 3000 + errs / 100
        t += r.expovariate(rate)
        pod = r.choices(pods, weights=[mi.rps(p, m) for p in pods])[0]
        failed = r.random() < (mi.errors(pod, m) / 100) / (
            (mi.rps(pod, m) - mi.errors(pod, m)) / 3000 + mi.errors(pod, m) / 100
        )
        i = r.choices(range(6), weights=mi.PATH_WEIGHTS)[0]
        req = paths[i].format(c=r.getrandbits(30), p=r.choice(mi.PROMOS))
        p = CHECKOUT[pod]
        if failed:
            status, size, ut = 503, 0, 2.0 + r.uniform(0.002, 0.014)
        else:
            status = r.choices([200, 201, 400, 404, 409], weights=[930, 27, 4, 8, 3])[0]
            queued = pod in NEW and t >= p.warn and r.random() > 0.3
            ut = (r.uniform(0.12, 1.99) if queued else 0.001) + mi.BASE_MS[
                i
            ] / 1000 * r.lognormvariate(0, 0.45)
            size = r.randint(180, 2400)
        client = f"10.0.{r.randint(1, 6)}.{r.randint(2, 250)}"
        line(
            t,
            client,
            req,
            status,
            size,
            r.choice(mi.UAS),
            r.randint(300, 900),
            ut + 0.001,
            f"{NS}-checkout-api-8080",
            f"{ips[pod]}:8080",
            ut,
        )
    for upstream, rps_, base, pods in [
        ("web-frontend-3000", 0.03, 0.045, FRONTEND),
        ("search-api-8080", 0.025, 0.06, SEARCH),
    ]:
        t = LOG_START
        while True:
            t += r.expovariate(rps_)
            if t >= NOW:
                break
            ut = base * r.lognormvariate(0, 0.5)
            req = (
                "GET /"
                if upstream.startswith("web")
                else f"GET /v2/search?q=q{r.getrandbits(20):05x}"
            )
            status = r.choices([200, 304, 404], weights=[900, 80, 20])[0]
            addr = f"10.42.{r.randint(0, 5)}.{60 + pods.index(r.choice(pods))}:{upstream.rsplit('-', 1)[1]}"
            line(
                t,
                f"10.0.{r.randint(1, 6)}.{r.randint(2, 250)}",
                req,
                status,
                r.randint(400, 30000),
                r.choice(mi.UAS),
                r.randint(300, 700),
                ut + 0.001,
                f"{NS}-{upstream}",
                addr,
                ut,
            )
    return {p: sorted(v) for p, v in out.items()}


def orders_db_logs():
    """orders-db-0 (primary; log_connections, log_disconnections, log_min_duration_statement=200ms)
    and orders-db-1 (streaming replica)."""
    r, out, replica = noise("pg"), [], []

    def pg(t, pid, who, level, msg, into=out):
        into.append((t, f"{iso(t)} {pg_time(t)} UTC [{pid}] {who}{level}:  {msg}"))

    t = LOG_START + 27.1
    while t < NOW:  # checkpoints every 5 minutes, spread over 270 s
        pg(t, 61, "", "LOG", "checkpoint starting: time")
        w = r.uniform(269.6, 269.95)
        if t + w < NOW:
            bufs = r.randint(3800, 5200)
            pg(
                t + w,
                61,
                "",
                "LOG",
                f"checkpoint complete: wrote {bufs} buffers ({bufs / 1310.72:.1f}%); 0 WAL file(s) added, 0 removed, "
                f"{r.randint(2, 4)} recycled; write={w - 0.04:.3f} s, sync={r.uniform(0.002, 0.009):.3f} s, total={w:.3f} s; "
                f"sync files={r.randint(40, 70)}, longest=0.00{r.randint(1, 4)} s, average=0.001 s; distance={bufs * 8 + r.randint(-900, 900)} kB, "
                f"estimate={bufs * 8 + 1200} kB",
            )
        rt = t + r.uniform(40, 60)
        pg(rt, 88, "", "LOG", "restartpoint starting: time", replica)
        if rt + 269.8 < NOW:
            pg(
                rt + 269.8,
                88,
                "",
                "LOG",
                f"restartpoint complete: wrote {r.randint(3800, 5200)} buffers; write=269.7 s, sync=0.004 s, total=269.8 s",
                replica,
            )
            pg(
                rt + 269.81,
                88,
                "",
                "LOG",
                f"recovery restart point at 3A/{r.getrandbits(28):07X}",
                replica,
            )
        t += 300
    t = LOG_START + r.uniform(60, 200)
    while t < NOW:  # autovacuum
        table = r.choice(
            ["inventory_reservations", "inventory_reservations", "carts", "order_events"]
        )
        dead = r.randint(8000, 41000)
        pg(
            t,
            r.randint(200000, 260000),
            "",
            "LOG",
            f'automatic vacuum of table "orders.public.{table}": index scans: 1, pages: 0 removed, {r.randint(30000, 90000)} remain, '
            f"tuples: {dead} removed, {r.randint(900000, 4000000)} remain, 0 are dead but not yet removable, "
            f"avg read rate: {r.uniform(1, 9):.3f} MB/s, avg write rate: {r.uniform(1, 6):.3f} MB/s, "
            f"system usage: CPU: user: {r.uniform(0.1, 0.9):.2f} s, system: 0.0{r.randint(1, 9)} s, elapsed: {r.uniform(0.8, 4.5):.2f} s",
        )
        t += r.uniform(420, 780)
    t = LOG_START + r.uniform(100, 300)
    while t < NOW:  # the sweeper's scan sometimes crosses 200 ms: before the release as after it
        pid = r.randint(18000, 48000)
        pg(
            t,
            pid,
            "checkout_api@orders ",
            "LOG",
            f"duration: {r.uniform(200.4, 212.9):.3f} ms  statement: {mi.SWEEP_Q}",
        )
        t += r.uniform(360, 900)
    for ts in ("13:41:09.6", "14:10:35.2"):  # the cart-expiry-report cron job
        pg(
            T(ts),
            r.randint(200000, 260000),
            "reporting@orders ",
            "LOG",
            f"duration: {r.uniform(1500, 2100):.3f} ms  statement: SELECT date_trunc('hour', c.updated_at) AS h, count(*) "
            "FROM carts c WHERE c.updated_at < now() - interval '24 hours' AND c.checked_out_at IS NULL GROUP BY 1 ORDER BY 1",
        )

    def connect(t, ip, app, user="checkout_api"):
        pid, port = r.randint(18000, 48000), r.randint(32768, 60999)
        pg(t, pid, "[unknown]@[unknown] ", "LOG", f"connection received: host={ip} port={port}")
        pg(
            t + 0.004,
            pid,
            f"{user}@orders ",
            "LOG",
            f"connection authorized: user={user} database=orders application_name={app} "
            "SSL enabled (protocol=TLSv1.3, cipher=TLS_AES_256_GCM_SHA384, bits=256)",
        )

    def disconnect(t, ip, since, user="checkout_api"):
        s = t - since
        pg(
            t,
            r.randint(18000, 48000),
            f"{user}@orders ",
            "LOG",
            f"disconnection: session time: {int(s // 3600)}:{int(s % 3600 // 60):02d}:{s % 60:06.3f} user={user} "
            f"database=orders host={ip} port={r.randint(32768, 60999)}",
        )

    for p in NEW.values():  # the 2.14.0 pools: min 2 at start, up to max 10 under traffic
        boot = p.created + 7.3 + 0.34
        connect(boot + 0.01, p.ip, "checkout-api")
        connect(boot + 0.02, p.ip, "checkout-api")
        extra = 4 if p.name == P2 else 0
        for k in range(extra):  # the sweeper's connections, from the same pool
            connect(boot + 1.9 + 0.05 * k, p.ip, "checkout-api-sweeper")
        for k in range(8 - extra):
            connect(p.ready + r.uniform(0.5, 40) + k * 0.01, p.ip, "checkout-api")
    for p in OLD.values():  # the 2.13.2 pools close when their pods stop
        for k in range(r.randint(9, 16)):
            disconnect(p.killed + 1.45 + k * 0.002, p.ip, p.ready - r.uniform(0, 5))
        if p.name != OLD_LEADER:
            t = LOG_START + r.uniform(0, 900)
            while t < p.killed:  # idle connections above min are closed and reopened now and then
                disconnect(t, p.ip, t - r.uniform(300, 1800))
                back = t + r.uniform(5, 120)
                if back < p.killed:
                    connect(back, p.ip, "checkout-api")
                t += r.uniform(600, 1500)
    for app, user, ip in [
        ("fulfillment-api", "fulfillment_api", "10.42.1.40"),
        ("orders-worker", "orders_worker", "10.42.4.77"),
    ]:
        t = LOG_START + r.uniform(0, 600)
        while t < NOW:
            disconnect(t, ip, t - r.uniform(600, 3600), user)
            connect(t + r.uniform(1, 90), ip, app, user)
            t += r.uniform(900, 2400)
    pg(
        T("14:12:04.8"),
        r.randint(200000, 260000),
        "postgres@orders ",
        "LOG",
        "connection authorized: user=sre_readonly database=orders application_name=psql (sre-assistant, read-only)",
    )
    return {
        "orders-db-0": sorted(x for x in out if x[0] < NOW),
        "orders-db-1": sorted(x for x in replica if x[0] < NOW),
    }


def redis_logs():
    r, out, t, pid = noise("redis"), [], LOG_START + 14.2, 8812

    def rd(t, mark, msg):
        stamp = datetime.fromtimestamp(t, UTC).strftime("%d %b %Y %H:%M:%S.") + iso(t)[-4:-1]
        out.append((t, f"{iso(t)} {'1:M' if mark != 'C' else f'{pid}:C'} {stamp} {mark} {msg}"))

    while t < NOW:
        rd(t, "*", "10000 changes in 60 seconds. Saving...")
        rd(t + 0.001, "*", f"Background saving started by pid {pid}")
        d = r.uniform(0.9, 1.6)
        rd(t + d, "C", "DB saved on disk")
        rd(
            t + d + 0.001,
            "C",
            f"Fork CoW for RDB: current {r.randint(3, 6)} MB, peak {r.randint(6, 9)} MB, average {r.randint(3, 5)} MB",
        )
        rd(t + d + 0.1, "*", "Background saving terminated with success")
        t, pid = t + 60 + r.uniform(-0.2, 0.2), pid + 1
    return {"cart-cache-0": out}


# ---------------------------------------------------------------- metrics (per minute)
def fmt(v):
    return str(v) if isinstance(v, int) else f"{v:.4g}"


MINUTES = list(range(int(MET_START), int(NOW) + 1, 60))
NODES = [f"ip-10-0-{n}" for n in ("12-41", "14-202", "21-88", "23-150", "33-7", "35-96")]
CODES = {"200": 0.9327, "201": 0.0271, "400": 0.0023, "404": 0.0051, "409": 0.0013, "500": 0.0004}


def pool(p, t):
    """(max, in_use, idle, waiting) of the pod's orders pool at minute t."""
    r = noise("pool", p, t)
    sweeper = 4 if (p == OLD_LEADER and t < HANDOVER) or p == P2 else 0
    if p in OLD:
        use = r.randint(4, 11) + sweeper
        return 50, use, r.randint(3, 8), 0
    q = NEW[p]
    if t < q.ready:
        return 10, sweeper, 2, 0
    if t < q.warn:
        use = min(10, r.randint(5, 8) + sweeper)
        return 10, use, 10 - use, mi.waiting(p, t)
    return 10, 10, 0, mi.waiting(p, t)


def ready(p, t):
    if p == P2 and t >= T("14:09"):
        return 0 if t == NOW or noise("ready", p, t).random() < 0.75 else 1
    return 0 if p == P1 and T("14:13") <= t <= T("14:15") else 1


def cpu(p, t):
    r = noise("cpu", p, t)
    if p in NEW and t >= NEW[p].warn:
        return r.uniform(0.096, 0.142)
    return r.uniform(0.22, 0.31) + (0.02 if p in (OLD_LEADER, P2) else 0)


def goroutines(p, t):
    r = noise("gor", p, t)
    if p in NEW and t >= NEW[p].warn:
        return r.randint(1100, 1500) if p == P2 else r.randint(700, 1100)
    return r.randint(360, 430)


def per_pod(fn, extra=None):
    series = []
    for p in CHECKOUT:
        vals = [[t, fmt(fn(p, t))] for t in MINUTES if mi.alive(p, t)]
        if vals:
            labels = {"namespace": NS, "service": "checkout-api", "pod": p} | (extra or {})
            series.append((labels, vals))
    return series


def flat(labels, lo, hi, key, kind=float):
    r = noise("flat", key)
    vals = [
        [t, fmt(kind(r.uniform(lo, hi)) if kind is float else r.randint(lo, hi))] for t in MINUTES
    ]
    return (labels, vals)


def pg_activity(t):
    """{(application_name, state): connections} on orders at minute t."""
    r = noise("pgact", t)
    rows = {}
    use = idle = 0
    for p in CHECKOUT:
        if p in NEW and t >= NEW[p].created + 8 or p in OLD and t < OLD[p].killed:
            _, u, i, _ = pool(p, t)
            sweep = 4 if (p == OLD_LEADER and t < HANDOVER) or p == P2 else 0
            use, idle = use + u - sweep, idle + i
    busy_tx = round(use * (0.46 if t > NEW[P3].warn else 0.12))
    rows[("checkout-api", "active")] = use - busy_tx
    rows[("checkout-api", "idle in transaction")] = busy_tx
    rows[("checkout-api", "idle")] = idle
    rows[("checkout-api-sweeper", "active")] = 2
    rows[("checkout-api-sweeper", "idle in transaction")] = 2
    for app, a, i in [
        ("fulfillment-api", (2, 5), (19, 23)),
        ("orders-worker", (1, 3), (15, 17)),
        ("reporting-etl", (0, 1), (4, 5)),
    ]:
        rows[(app, "active")], rows[(app, "idle")] = r.randint(*a), r.randint(*i)
    rows[("postgres_exporter", "active")] = 1
    return rows


def metrics():
    out = []

    def add(name, help_, series, aliases=(), unit=""):
        series = [s for s in series if s[1]]
        out.append(
            {"name": name, "help": help_, "unit": unit, "aliases": list(aliases), "result": series}
        )

    other_p99 = [
        flat({"namespace": NS, "service": s}, lo, hi, ("p99", s))
        for s, lo, hi in [
            ("fulfillment-api", 0.061, 0.094),
            ("search-api", 0.14, 0.19),
            ("web-frontend", 0.078, 0.112),
        ]
    ]
    add(
        "http_server_request_duration_seconds:p99",
        "p99 of server-side request duration over 1m (recording rule over http_server_request_duration_seconds_bucket); per pod for checkout-api, per service for the others",
        per_pod(lambda p, t: mi.p99(p, t)) + other_p99,
        [
            "http_server_request_duration_seconds_bucket",
            "http_server_request_duration_seconds",
            "http_request_duration_seconds",
        ],
        "seconds",
    )
    code_series = []
    for code, frac in [*CODES.items(), ("503", None)]:

        def rate(p, t, frac=frac):
            ok = mi.rps(p, t) - mi.errors(p, t)
            return mi.errors(p, t) if frac is None else ok * frac / sum(CODES.values())

        code_series += per_pod(rate, {"code": code})
    add(
        "http_server_requests:rate1m",
        "requests per second over 1m by status code (rate of http_server_requests_total)",
        code_series,
        ["http_server_requests_total", "http_requests_total", "http_server_requests"],
        "requests/s",
    )
    ratio = [
        ({"namespace": NS, "service": "checkout-api"}, [[t, fmt(mi.err_ratio(t))] for t in MINUTES])
    ]
    ratio += [
        flat({"namespace": NS, "service": s}, 0.0002, 0.0006, ("5xx", s))
        for s in ("fulfillment-api", "search-api", "web-frontend")
    ]
    add(
        "service:http_server_requests_5xx:ratio_rate1m",
        "share of requests answered 5xx, over 1m, per service",
        ratio,
        ["error_ratio", "http_server_requests_5xx"],
        "ratio",
    )
    for k, (m, help_) in enumerate(
        [
            ("db_pool_max", "configured maximum connections of the pod's client-side DB pool"),
            ("db_pool_in_use", "connections of the pool checked out (by requests or the sweeper)"),
            ("db_pool_idle", "open connections of the pool not checked out"),
            ("db_pool_waiting", "callers queued for a connection of the pool"),
        ]
    ):
        series = per_pod(lambda p, t, k=k: pool(p, t)[k], {"pool": "orders"})
        for svc, pods, mx, lo, hi in [
            ("fulfillment-api", FULFILLMENT, 40, 2, 7),
            ("orders-worker", WORKERS, 20, 1, 4),
        ]:
            for p in pods:
                labels = {"namespace": NS, "service": svc, "pod": p, "pool": "orders"}
                vals = [mx, (lo, hi), (12, 19), 0][k]
                if isinstance(vals, tuple):
                    series.append(flat(labels, *vals, (m, p), int))
                else:
                    series.append((labels, [[t, fmt(vals)] for t in MINUTES]))
        add(m, help_, series, [], "connections")
    add(
        "db_query_duration_seconds:p99",
        "p99 of SQL statement time measured by the app, without the pool wait (recording rule)",
        per_pod(lambda p, t: noise("sql", p, t).uniform(0.009, 0.016)),
        ["db_query_duration_seconds_bucket", "db_query_duration_seconds"],
        "seconds",
    )
    redis = [
        ({"namespace": NS, "service": "checkout-api", "cmd": c}, [[t, fmt(fn(t))] for t in MINUTES])
        for (lab, fn) in mi.REDIS_SERIES
        for c in [lab["cmd"]]
    ]
    add(
        "redis_client_command_duration_seconds:p99",
        "p99 of Redis command time seen by checkout-api (cart-cache), per command",
        redis,
        ["redis_client_command_duration_seconds_bucket", "redis_client_command_duration_seconds"],
        "seconds",
    )
    add(
        "container_cpu_usage_seconds:rate1m",
        "CPU cores used by the pod's container (rate of container_cpu_usage_seconds_total)",
        per_pod(cpu, {"container": "checkout-api"}),
        ["container_cpu_usage_seconds_total"],
        "cores",
    )
    add(
        "container_memory_working_set_bytes",
        "working-set memory of the pod's container",
        per_pod(
            lambda p, t: noise("mem", p, t).randint(288, 331) * 1048576,
            {"container": "checkout-api"},
        ),
        [],
        "bytes",
    )
    add("go_goroutines", "goroutines of the Go process", per_pod(goroutines), [], "")
    restarts = per_pod(lambda p, t: 0, {"container": "checkout-api"})
    restarts.append(
        (
            {
                "namespace": NS,
                "service": "email-notifier",
                "pod": NOTIFIER,
                "container": "email-notifier",
            },
            [[t, fmt(13 if t < NOTIFIER_OOM else 14)] for t in MINUTES],
        )
    )
    add(
        "kube_pod_container_status_restarts_total",
        "container restarts (kube-state-metrics)",
        restarts,
        [],
        "",
    )
    add(
        "kube_pod_status_ready",
        "1 if the pod's Ready condition is true (kube-state-metrics)",
        per_pod(ready, {"condition": "true"}),
        [],
        "",
    )
    nodes = [flat({"node": n}, 0.31, 0.44, ("node", n)) for n in NODES]
    add(
        "node:cpu_utilisation:ratio",
        "share of the node's CPU busy, over 1m",
        nodes,
        ["node_cpu_seconds_total", "node_cpu_utilisation"],
        "ratio",
    )
    cond = [
        ({"node": n, "condition": c, "status": "true"}, [[t, "0"] for t in MINUTES])
        for n in NODES
        for c in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    add("kube_node_status_condition", "node conditions (1: the condition holds)", cond, [], "")
    acts = {t: pg_activity(t) for t in MINUTES}
    keys = sorted({k for rows in acts.values() for k in rows})
    add(
        "pg_stat_activity_count",
        "connections to the orders database by client application and state (postgres_exporter)",
        [
            (
                {"datname": "orders", "application_name": a, "state": s, "server": "orders-db-0"},
                [[t, fmt(acts[t][(a, s)])] for t in MINUTES],
            )
            for a, s in keys
        ],
        ["pg_stat_activity"],
        "connections",
    )
    add(
        "pg_settings_max_connections",
        "max_connections of the server (postgres_exporter)",
        [({"server": "orders-db-0"}, [[t, "300"] for t in MINUTES])],
        [],
        "connections",
    )
    edge = []
    for t in MINUTES:
        pods = [p for p in CHECKOUT if mi.alive(p, t)]
        edge.append(
            [t, fmt(max(mi.p99(p, t) for p in pods) + noise("edge", t).uniform(0.002, 0.006))]
        )
    ing = [({"ingress": "checkout-api", "namespace": NS, "service": "checkout-api"}, edge)]
    ing += [
        flat({"ingress": s, "namespace": NS, "service": s}, lo, hi, ("edge", s))
        for s, lo, hi in [("search-api", 0.15, 0.2), ("web-frontend", 0.085, 0.12)]
    ]
    add(
        "nginx_ingress_controller_request_duration_seconds:p99",
        "p99 of request time at the edge (ingress-nginx), per ingress",
        ing,
        [
            "nginx_ingress_controller_request_duration_seconds_bucket",
            "nginx_ingress_controller_request_duration_seconds",
        ],
        "seconds",
    )
    edge_rates = []
    for code in [*CODES, "503"]:
        vals = []
        for t in MINUTES:
            pods = [p for p in CHECKOUT if mi.alive(p, t)]
            ok = sum(mi.rps(p, t) - mi.errors(p, t) for p in pods)
            v = (
                sum(mi.errors(p, t) for p in pods)
                if code == "503"
                else ok * CODES[code] / sum(CODES.values())
            )
            vals.append([t, fmt(v)])
        edge_rates.append(
            (
                {
                    "ingress": "checkout-api",
                    "namespace": NS,
                    "service": "checkout-api",
                    "status": code,
                },
                vals,
            )
        )
    add(
        "nginx_ingress_controller_requests:rate1m",
        "requests per second at the edge by status (rate of nginx_ingress_controller_requests)",
        edge_rates,
        ["nginx_ingress_controller_requests"],
        "requests/s",
    )
    return out


def metrics_json():
    """One series per line: readable diffs, and a third of the size of indent=1."""
    head = {
        "source": "synthetic fixture (examples/make_sre_fixtures.py)",
        "start": iso(MET_START, False),
        "end": iso(NOW, False),
        "step_s": 60,
    }
    lines = ["{", f' "range": {json.dumps(head)},', ' "metrics": [']
    for k, m in enumerate(out := metrics()):
        meta = {key: m[key] for key in ("name", "help", "unit", "aliases")}
        lines.append("  " + json.dumps(meta)[:-1] + ', "result": [')
        for j, (labels, vals) in enumerate(m["result"]):
            sep = "," if j < len(m["result"]) - 1 else ""
            lines.append(
                "   " + json.dumps({"metric": labels, "values": vals}, separators=(",", ":")) + sep
            )
        lines.append("  ]}" + ("," if k < len(out) - 1 else ""))
    lines += [" ]", "}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- pods (kubectl get pods -o json, trimmed)
def pod_item(
    name,
    ns,
    app,
    version,
    node,
    ip,
    created,
    *,
    ready_=True,
    restarts=0,
    last=None,
    phase="Running",
    image=None,
    started=None,
    ready_since=None,
    owner=None,
    container=None,
):
    started = started or created + 7.2
    container = container or app
    cstate = {"running": {"startedAt": iso(started, False)}}
    if phase == "Succeeded":
        cstate = {
            "terminated": {
                "reason": "Completed",
                "exitCode": 0,
                "startedAt": iso(started, False),
                "finishedAt": iso(started + 52, False),
            }
        }
    conds = [("PodScheduled", True, created), ("Initialized", True, created + 1)]
    conds += [
        ("ContainersReady", ready_, ready_since or started + 20),
        ("Ready", ready_, ready_since or started + 20),
    ]
    status = {
        "phase": phase,
        "podIP": ip,
        "hostIP": node and "10.0." + ".".join(node.split("-")[3:5]),
        "startTime": iso(created, False),
        "conditions": [
            {"type": c, "status": "True" if ok else "False", "lastTransitionTime": iso(tt, False)}
            | (
                {}
                if ok
                else {
                    "reason": "ContainersNotReady",
                    "message": f"containers with unready status: [{container}]",
                }
            )
            for c, ok, tt in conds
        ],
        "containerStatuses": [
            {
                "name": container,
                "image": image or f"registry.offpath.internal/shop/{app}:{version}",
                "ready": ready_ and phase == "Running",
                "started": phase == "Running",
                "restartCount": restarts,
                "state": cstate,
                "lastState": last or {},
            }
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "creationTimestamp": iso(created, False),
            "labels": {
                "app": app,
                "app.kubernetes.io/name": app,
                "app.kubernetes.io/version": version,
            }
            | ({"pod-template-hash": name.rsplit("-", 2)[1]} if owner == "ReplicaSet" else {}),
            "ownerReferences": [{"kind": owner or "ReplicaSet", "name": name.rsplit("-", 1)[0]}],
        },
        "spec": {
            "nodeName": node and f"{node}.eu-west-1.compute.internal",
            "containers": [{"name": container}],
        },
        "status": status,
    }


def pods_json():
    items = []
    for p in NEW.values():
        not_ready = p.name == P2
        items.append(
            pod_item(
                p.name,
                NS,
                "checkout-api",
                "2.14.0",
                p.node,
                p.ip,
                p.created,
                ready_=not not_ready,
                ready_since=T("14:29:41") if not_ready else p.ready,
                owner="ReplicaSet",
                image=mi.IMAGE,
            )
        )
    r = noise("pods")
    for pods, app, version, day, base in [
        (FULFILLMENT, "fulfillment-api", "3.4.1", mi.DAY - 2 * 86400, "11:20:40"),
        (WORKERS, "orders-worker", "1.22.0", mi.DAY - 4 * 86400, "09:05:12"),
        (SEARCH[:3], "search-api", "5.2.0", mi.DAY, "10:02:55"),
        (FRONTEND, "web-frontend", "5.31.0", mi.DAY, "13:20:31"),
    ]:
        for k, name in enumerate(pods):
            created = at(day, base) + 63 * k
            items.append(
                pod_item(
                    name,
                    NS,
                    app,
                    version,
                    r.choice(NODES),
                    f"10.42.{r.randint(0, 5)}.{r.randint(20, 250)}",
                    created,
                    owner="ReplicaSet",
                )
            )
    items.append(
        pod_item(
            SEARCH[3],
            NS,
            "search-api",
            "5.2.0",
            r.choice(NODES),
            "10.42.5.71",
            T("13:52:19"),
            owner="ReplicaSet",
        )
    )
    oom = {
        "terminated": {
            "reason": "OOMKilled",
            "exitCode": 137,
            "startedAt": iso(T("12:51:40"), False),
            "finishedAt": iso(NOTIFIER_OOM, False),
        }
    }
    items.append(
        pod_item(
            NOTIFIER,
            NS,
            "email-notifier",
            "1.8.0",
            NODES[4],
            "10.42.5.33",
            at(DAY0, "18:12:50"),
            restarts=14,
            last=oom,
            started=NOTIFIER_STARTED,
            ready_since=NOTIFIER_STARTED + 9,
            owner="ReplicaSet",
        )
    )
    for job, start in [
        ("cart-expiry-report-29031221-8mz4w", T("13:41:03")),
        ("cart-expiry-report-29031250-xk2pq", T("14:10:30")),
    ]:
        items.append(
            pod_item(
                job,
                NS,
                "cart-expiry-report",
                "1.0.3",
                NODES[1],
                None,
                start,
                ready_=False,
                phase="Succeeded",
                owner="Job",
                container="report",
            )
        )
    for name, app, version, ip, node, created, container in [
        (
            "orders-db-0",
            "orders-db",
            "16.4",
            "10.42.6.10",
            "ip-10-0-40-17",
            at(mi.DAY - 27 * 86400, "02:14:09"),
            "postgresql",
        ),
        (
            "orders-db-1",
            "orders-db",
            "16.4",
            "10.42.7.10",
            "ip-10-0-41-23",
            at(mi.DAY - 27 * 86400, "02:16:44"),
            "postgresql",
        ),
        (
            "cart-cache-0",
            "cart-cache",
            "7.2.5",
            "10.42.6.22",
            "ip-10-0-40-17",
            at(mi.DAY - 40 * 86400, "07:30:02"),
            "redis",
        ),
    ]:
        items.append(
            pod_item(
                name,
                "data",
                app,
                version,
                node,
                ip,
                created,
                owner="StatefulSet",
                container=container,
                image=f"registry.offpath.internal/data/{container}:{version}",
            )
        )
    for k, name in enumerate(INGRESS):
        items.append(
            pod_item(
                name,
                "ingress-nginx",
                "ingress-nginx",
                "1.11.3",
                NODES[2 * k],
                f"10.42.{2 * k}.5",
                at(mi.DAY - 12 * 86400, "10:40:18") + 70 * k,
                owner="ReplicaSet",
                container="controller",
                image="registry.k8s.io/ingress-nginx/controller:v1.11.3",
            )
        )
    return {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"asOf": iso(NOW, False)},
        "items": items,
    }


# ---------------------------------------------------------------- deploys (helm history + CI records)
def deploys_json():
    helm = [line.split()[:9] for line in mi.HELM.splitlines()[1:6]]
    pipeline = [line.strip() for line in mi.HELM.splitlines()[8:-1]]
    log = mi.DIFF.partition("\n\n$ git diff --stat")[0]
    commits = [line for line in log.splitlines()[1:]]
    values_diff = mi.DIFF[mi.DIFF.index("diff --git") :]
    older = {
        38: ["c0a1f53 fix(cart): keep cart currency on merge", "71be0d2 chore: go 1.22.1"],
        39: [
            "3f9e2aa feat(checkout): idempotency keys on confirm",
            "d8e4c11 feat(metrics): db pool gauges",
        ],
        40: ["b51c7e9 fix(promo): case-insensitive promo codes"],
        41: [
            "5e0b7a3 release: v2.13.2",
            "9a2f6d8 fix(payments): retry intent creation once on 502",
        ],
    }
    hist = []
    for rev, _day, mon, dd, hms_, year, status, chart, app in helm:
        rev = int(rev)
        dt = datetime.strptime(f"{dd} {mon} {year} {hms_}", "%d %b %Y %H:%M:%S").replace(tzinfo=UTC)
        entry = {
            "revision": rev,
            "updated": dt.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "status": status,
            "chart": chart,
            "app_version": app,
            "description": "Upgrade complete",
        }
        if rev == 42:
            entry |= {
                "pipeline": "deploy-prod #8812",
                "trigger": "merge of release/2.14.0 (tag v2.14.0, commit 9c41e7b)",
                "pipeline_log": pipeline,
                "canary": "skipped (release PR labelled skip-canary)",
                "changes": commits,
                "values_diff": values_diff,
            }
        else:
            entry |= {
                "pipeline": f"deploy-prod #{8812 - 4 * (42 - rev) - 3}",
                "canary": "passed",
                "changes": older[rev],
                "values_diff": None,
            }
        hist.append(entry)
    releases = [{"release": "checkout-api", "namespace": NS, "history": hist}]

    def rel(name, ns, entries):
        out = []
        for k, (rev, when, chart, app, changes, canary) in enumerate(entries):
            out.append(
                {
                    "revision": rev,
                    "updated": when,
                    "status": "deployed" if k == len(entries) - 1 else "superseded",
                    "chart": chart,
                    "app_version": app,
                    "description": "Upgrade complete" if k else "Install complete",
                    "pipeline": f"deploy-prod #{8700 + 13 * rev % 100}",
                    "canary": canary,
                    "changes": changes,
                    "values_diff": None,
                }
            )
        releases.append({"release": name, "namespace": ns, "history": out})

    rel(
        "fulfillment-api",
        NS,
        [
            (
                25,
                "2025-03-03T14:10:02Z",
                "fulfillment-api-2.3.0",
                "3.3.2",
                ["2b7e410 feat: split shipments by warehouse"],
                "passed",
            ),
            (
                26,
                "2025-03-06T09:44:51Z",
                "fulfillment-api-2.3.1",
                "3.4.0",
                ["e11c0d2 feat: carrier cut-off times"],
                "passed",
            ),
            (
                27,
                "2025-03-09T11:20:33Z",
                "fulfillment-api-2.3.1",
                "3.4.1",
                ["4aa90c7 fix: DST in cut-off times"],
                "passed",
            ),
        ],
    )
    rel(
        "orders-worker",
        NS,
        [
            (
                18,
                "2025-02-26T16:31:08Z",
                "orders-worker-1.6.0",
                "1.21.3",
                ["0c3f1e2 chore: kafka client 2.4"],
                "passed",
            ),
            (
                19,
                "2025-03-07T09:05:04Z",
                "orders-worker-1.6.1",
                "1.22.0",
                ["77d0e95 feat: order-events v3 schema"],
                "passed",
            ),
        ],
    )
    rel(
        "search-api",
        NS,
        [
            (
                87,
                "2025-03-10T11:15:40Z",
                "search-api-4.8.2",
                "5.1.4",
                ["a3c2d11 fix: empty facets"],
                "passed",
            ),
            (
                88,
                "2025-03-11T10:02:47Z",
                "search-api-4.9.0",
                "5.2.0",
                ["f0e9b27 feat: synonym boosts for brand names"],
                "passed",
            ),
        ],
    )
    rel(
        "web-frontend",
        NS,
        [
            (
                310,
                "2025-03-11T09:41:12Z",
                "web-frontend-3.1.0",
                "5.30.2",
                ["e4a1c02 fix(ui): basket badge count"],
                "passed",
            ),
            (
                311,
                "2025-03-11T13:20:24Z",
                "web-frontend-3.1.0",
                "5.31.0",
                [
                    "91c5b3e feat(ui): SPRING25 promo banner on cart page",
                    "0d27e6f chore: bump next to 14.2.24",
                ],
                "passed",
            ),
        ],
    )
    rel(
        "email-notifier",
        NS,
        [
            (
                14,
                "2025-03-04T13:02:19Z",
                "email-notifier-0.9.2",
                "1.7.3",
                ["5be1a90 fix: reply-to header"],
                "passed",
            ),
            (
                15,
                "2025-03-10T18:12:41Z",
                "email-notifier-0.9.3",
                "1.8.0",
                ["d41be09 feat: preload all templates at start (known: heap +180 MB, NOTIF-77)"],
                "passed",
            ),
        ],
    )
    rel(
        "orders-db",
        "data",
        [
            (
                6,
                "2025-02-12T02:13:55Z",
                "postgresql-15.5.20",
                "16.4",
                ["bump to 16.4; log_connections=on, log_min_duration_statement=200ms"],
                "n/a",
            ),
        ],
    )
    rel(
        "cart-cache",
        "data",
        [
            (
                3,
                "2025-01-30T07:29:48Z",
                "redis-19.6.4",
                "7.2.5",
                ["maxmemory 6gb, allkeys-lru"],
                "n/a",
            ),
        ],
    )
    rel(
        "ingress-nginx",
        "ingress-nginx",
        [
            (8, "2025-01-14T10:12:06Z", "ingress-nginx-4.11.2", "1.11.2", ["chart 4.11.2"], "n/a"),
            (
                9,
                "2025-02-27T10:40:05Z",
                "ingress-nginx-4.11.3",
                "1.11.3",
                ["chart 4.11.3 (CVE fixes)"],
                "n/a",
            ),
        ],
    )
    return {"asOf": iso(NOW, False), "releases": releases}


# ---------------------------------------------------------------- writing
README = """\
# SRE demo fixtures

Generated by `examples/make_sre_fixtures.py` (do not edit by hand; rerun it). Served by the
read-only demo tools in `offpath/agent/sre_tools/` (`get_logs`, `query_metrics`,
`recent_deploys`, `pod_status`); `DEMO_FIXTURES_DIR` points them at another copy.

The cluster prod-eu-1 at 2025-03-11 14:30 UTC, 25 minutes into the incident of
`examples/make_incident.py`: checkout-api p99 at 2.4 s since 14:05 after release v2.14.0
(helm revision 42, 13:58) lowered `DB_POOL_MAX` from 50 to 10. Synthetic data.

- `manifest.json`: "now", the covered time ranges, services with namespace and pods.
- `logs/<service>/<pod>.log`: container logs 13:00-14:30 (plus each container's start-up
  lines), one line each, RFC 3339 time first. checkout-api logs 1 in 500 requests; the
  ingress log keeps 1 in 3000 requests and 1 in 100 answered 5xx.
- `metrics.json`: per-minute series 13:30-14:30 as Prometheus range results, with help text and
  the raw metric names each recording rule answers for (`aliases`).
- `deploys.json`: helm history per release, with the CI pipeline and the changes of each revision.
- `pods.json`: `kubectl get pods -o json` for shop-prod, data and ingress-nginx at 14:30.
"""


def files():
    """{relative path: text} of every fixture file."""
    out = {"README.md": README}
    logs = {"checkout-api": checkout_logs()}
    logs["fulfillment-api"] = {p: fulfillment_logs(p) for p in FULFILLMENT}
    logs["orders-worker"] = {p: worker_logs(p) for p in WORKERS}
    logs["email-notifier"] = {NOTIFIER: notifier_logs()}
    logs["ingress-nginx"] = ingress_logs()
    logs["orders-db"] = orders_db_logs()
    logs["cart-cache"] = redis_logs()
    namespaces = {"ingress-nginx": "ingress-nginx", "orders-db": "data", "cart-cache": "data"}
    services = {}
    for svc, pods in logs.items():
        services[svc] = {"namespace": namespaces.get(svc, NS), "pods": sorted(pods)}
        for pod, lines in pods.items():
            out[f"logs/{svc}/{pod}.log"] = "".join(line + "\n" for _, line in lines)
    manifest = {
        "cluster": "prod-eu-1",
        "region": "eu-west-1",
        "now": iso(NOW, False),
        "logs": {"from": iso(LOG_START, False), "to": iso(NOW, False)},
        "metrics": {"from": iso(MET_START, False), "to": iso(NOW, False), "step_s": 60},
        "services": services,
    }
    out["manifest.json"] = json.dumps(manifest, indent=1) + "\n"
    out["metrics.json"] = metrics_json()
    out["deploys.json"] = json.dumps(deploys_json(), indent=1, ensure_ascii=False) + "\n"
    out["pods.json"] = json.dumps(pods_json(), indent=1) + "\n"
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=OUT, help=f"folder to write (default {OUT}); replaced"
    )
    args = ap.parse_args(argv)
    written = files()
    for text in (written["metrics.json"], written["deploys.json"], written["pods.json"]):
        json.loads(text)
    if args.out.exists():
        shutil.rmtree(args.out)
    for rel, text in written.items():
        path = args.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    size = sum(len(t.encode()) for t in written.values())
    lines = sum(t.count("\n") for k, t in written.items() if k.startswith("logs/"))
    print(f"wrote {args.out} ({len(written)} files, {size:,} bytes, {lines:,} log lines)")


if __name__ == "__main__":
    main()
