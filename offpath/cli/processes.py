"""The ``offpath`` commands that start the service's processes: ``api`` (uvicorn),
``worker`` (Celery workers, supervised: :func:`supervise`), ``flower``, ``beat``, and
``migrate`` (the usage tables they need)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from offpath.cli.common import (
    app,
    cannot_listen,
    console,
    err,
    fail,
    migrate_or_exit,
    settings_or_exit,
)

#: ``celery`` on the project's app, in this interpreter.
CELERY = [sys.executable, "-m", "celery", "-A", "offpath.worker.celery_app"]


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port", min=1, max=65_535)] = 8000,
) -> None:
    """Run the chat API (uvicorn)."""
    settings = settings_or_exit()
    from offpath.agent.graph import AgentToolsError, load_tools

    try:  # the agent's tools, imported before anything starts: one line, not a traceback
        load_tools(settings.agent_tools)
    except AgentToolsError as exc:
        fail(str(exc), code=2)
    taken = cannot_listen(host, port)
    if taken:
        fail(f"cannot listen on {host}:{port}: {taken}; choose another with --port")
    migrate_or_exit(settings)
    if settings.auth_disabled and host not in ("127.0.0.1", "localhost", "::1"):
        err.print(
            f"[red]warning:[/red] AUTH_DISABLED=true and the API listens on {host}: anyone who "
            "reaches it can read and write every session and spend the LLM budget",
            highlight=False,
        )
    import uvicorn

    uvicorn.run("offpath.api.app:app", host=host, port=port, log_level=settings.log_level.lower())


@app.command()
def worker(
    pool: Annotated[str | None, typer.Option(help="Celery pool (default: WORKER_POOL)")] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(help="Concurrent jobs per process (default: WORKER_CONCURRENCY)"),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(help="Worker processes (default: WORKER_PROCESSES; 0: one per core)"),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            help="Worker node name (default: <CELERY_QUEUE>@host, unique per queue: workers "
            "of two deployments sharing one broker answer /readyz apart)",
            callback=_node_name,
        ),
    ] = None,
    restart: Annotated[bool, typer.Option(help="Restart the worker if it dies", metavar="")] = True,
) -> None:
    """Run Celery workers for compaction jobs, one process per core, each restarted if it dies.

    One process per core: a process's jobs share one GIL, and with the threads pool one
    process is CPU-bound long before its LLM calls are (BENCHMARKS.md, throughput). The
    restart is there because kombu 5.7 ends a worker that loses Redis while a job is in
    flight ("Unrecoverable error: AttributeError ... 'hostname'"); the job itself is safe
    (redelivered after the visibility timeout). ``--no-restart``: a process that exits ends
    the others too (a supervisor such as Docker restarts the whole).
    """
    settings = settings_or_exit(
        worker_pool=("--pool", pool),
        worker_concurrency=("--concurrency", concurrency),
        worker_processes=("--processes", processes),
    )
    migrate_or_exit(settings)
    if settings.redis_eviction_check == "refuse":  # one line, not a restart loop
        from offpath.coordination.eviction import EvictingRedis, check_eviction

        try:
            check_eviction(settings, "the worker")
        except EvictingRedis as exc:
            fail(str(exc))
    n = settings.worker_processes or os.cpu_count() or 1
    cmds = []
    for i in range(n):
        cmd = [
            *CELERY,
            "worker",
            f"--loglevel={settings.log_level}",
            f"--pool={settings.worker_pool}",
            f"--concurrency={settings.worker_concurrency}",
            f"--queues={settings.celery_queue}",
            "--without-mingle",
            "--without-gossip",  # start-up sync and chatter offpath does not use
        ]
        # Celery's default, celery@host, is the same for every deployment on a host: two
        # sharing a broker then share one remote-control mailbox, and /readyz heard the
        # other's worker
        node = name or f"{settings.celery_queue}@%h"
        if n > 1:  # one node name per process
            left, at, right = node.partition("@")
            node = f"{left}{i + 1}{at}{right}"
        cmd.append(f"--hostname={node}")
        env = None
        if n > 1 and settings.worker_metrics_port:  # one metrics port per process
            env = {**os.environ, "WORKER_METRICS_PORT": str(settings.worker_metrics_port + i)}
        cmds.append((cmd, env))
    if n == 1 and not restart:
        os.execv(sys.executable, cmds[0][0])
    if n > 1:
        err.print(f"starting {n} worker processes", highlight=False)
    raise typer.Exit(supervise(cmds, restart=restart))


#: A Celery node name: ``name`` or ``name@host``, of letters, digits and ``. _ - %`` (Celery's
#: ``%h``, ``%n``, ``%d``, ``%i`` expand in it).
NODE_NAME = re.compile(r"[A-Za-z0-9._%-]{1,100}(@[A-Za-z0-9._%-]{1,200})?")


def _node_name(value: str | None) -> str | None:
    """``--name`` as given, once it is a node name (:data:`NODE_NAME`); raises
    ``typer.BadParameter`` (exit 2) otherwise."""
    if value is not None and not NODE_NAME.fullmatch(value):
        raise typer.BadParameter(
            f"{value!r}: a node name is name or name@host, of letters, digits and . _ - %"
        )
    return value


#: Signals that stop the supervised workers; blocked while a new child is being started.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def supervise(cmds: list[tuple[list[str], dict[str, str] | None]], restart: bool = True) -> int:
    """Run each ``(cmd, env)``, restarting one when it exits with an error (backoff 1 s,
    doubling to 30 s), until all exit cleanly or we are told to stop. ``restart=False``:
    the first to exit with an error stops the others; its code is returned.

    Each child runs in a process group of its own, so a Ctrl-C in the terminal reaches only
    us, and we pass it on once: the first SIGINT, SIGTERM or SIGHUP becomes a SIGTERM
    (Celery's warm shutdown: running jobs finish, exit 0), a second Ctrl-C a SIGQUIT
    (cold shutdown). On Linux the children are also told to stop (SIGTERM) if we die, even
    by SIGKILL, so no worker is left behind.
    """
    stops = 0
    children: list[subprocess.Popen[bytes] | None] = [None] * len(cmds)

    def forward(signum: int, _frame: object) -> None:
        nonlocal stops
        stops += 1
        cold = stops > 1 and signum == signal.SIGINT
        for child in children:
            if child is not None and child.poll() is None:
                child.send_signal(signal.SIGQUIT if cold else signal.SIGTERM)
        if stops == 1:
            err.print("stopping the worker when its running jobs end (Ctrl-C again: cancel them)")

    for signum in STOP_SIGNALS:
        signal.signal(signum, forward)
    in_child = _child_setup()
    delays = [1.0] * len(cmds)
    started = [0.0] * len(cmds)
    due = [0.0] * len(cmds)  # when a child is (re)started
    done = [False] * len(cmds)
    code = 0
    while True:
        now = time.monotonic()
        for i, (cmd, env) in enumerate(cmds):
            child = children[i]
            if done[i]:
                continue
            if child is None:
                if stops:
                    done[i] = True
                elif now >= due[i]:
                    # a stop signal that arrives while a child is starting is handled once it
                    # is in ``children``; the child unblocks them for itself (in_child)
                    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                    try:
                        if not stops:
                            children[i] = subprocess.Popen(
                                cmd, env=env, process_group=0, preexec_fn=in_child
                            )
                            started[i] = now
                    finally:
                        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                continue
            exit_code = child.poll()
            if exit_code is None:
                continue
            children[i] = None
            if stops and exit_code == -signal.SIGTERM:
                exit_code = 0  # stopped by our SIGTERM before Celery took its signals
            if stops or exit_code == 0 or not restart:
                done[i] = True
                code = code or exit_code
                if exit_code and not stops:  # --no-restart: the others stop too
                    forward(signal.SIGTERM, None)
            else:
                fast = now - started[i] <= 60
                delays[i] = min(delays[i] * 2, 30.0) if fast else 1.0
                due[i] = now + delays[i]
                err.print(
                    f"worker exited with code {exit_code}; restarting in {delays[i]:.0f}s",
                    highlight=False,
                )
        if all(done):
            return code
        time.sleep(0.1)


def _child_setup() -> Any:
    """What the supervised child runs before exec: ask for SIGTERM when the supervisor dies
    (Linux ``PR_SET_PDEATHSIG``; skipped elsewhere), then take the stop signals back."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            pass

    def in_child() -> None:
        if prctl is not None:
            prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if prctl is not None and os.getppid() != parent:  # it died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


@app.command()
def flower(
    port: Annotated[int | None, typer.Option(help="Port (default: FLOWER_PORT)")] = None,
    address: Annotated[
        str, typer.Option(help="Interface to bind; 0.0.0.0 needs FLOWER_BASIC_AUTH")
    ] = "127.0.0.1",
) -> None:
    """Run Flower on the broker, with basic auth from FLOWER_BASIC_AUTH (empty: no password,
    pages and HTTP API, on 127.0.0.1 only)."""
    settings = settings_or_exit(flower_port=("--port", port))
    taken = cannot_listen(address, settings.flower_port)
    if taken:
        fail(
            f"cannot listen on {address}:{settings.flower_port}: {taken}; choose another with --port"
        )
    if not settings.flower_basic_auth and address not in ("127.0.0.1", "localhost", "::1"):
        fail(f"FLOWER_BASIC_AUTH is empty: set user:password before binding Flower to {address}")
    if not settings.flower_basic_auth:
        err.print(
            "warning: FLOWER_BASIC_AUTH is empty; Flower has no password (only 127.0.0.1 can reach it)"
        )
    # Flower reads FLOWER_BASIC_AUTH itself: the password stays out of the process list.
    # Set but empty, Flower takes it for basic auth on and refuses every request: unset it,
    # and open its HTTP API too (loopback only, as the pages are)
    if settings.flower_basic_auth:
        os.environ["FLOWER_BASIC_AUTH"] = settings.flower_basic_auth
    else:
        os.environ.pop("FLOWER_BASIC_AUTH", None)
        os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"
    # Celery's flower command, with its no-worker-yet warnings said once (flower_run)
    cmd = [
        sys.executable,
        "-m",
        "offpath.cli.flower_run",
        *CELERY[3:],
        "flower",
        f"--port={settings.flower_port}",
        f"--address={address}",
    ]
    os.execv(sys.executable, cmd)


@app.command()
def beat(
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Exit 0 if the reconciler ran in the last 3 intervals", metavar=""
        ),
    ] = False,
) -> None:
    """Run Celery beat: the reconciler's schedule (every RECONCILE_INTERVAL_S). Run one."""
    settings = settings_or_exit()
    if check:
        ago = _last_pass_s(settings)
        if ago is None or ago > 3 * settings.reconcile_interval_s:
            fail(
                "the reconciler has not run lately"
                + (f" (last pass {ago:.0f}s ago)" if ago else "")
            )
        console.print(f"reconciler: last pass {ago:.0f}s ago")
        return
    migrate_or_exit(settings)
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    cmd = [
        *CELERY,
        "beat",
        f"--loglevel={settings.log_level}",
        f"--schedule={Path(settings.data_dir) / 'celerybeat-schedule'}",
    ]
    os.execv(sys.executable, cmd)


def _last_pass_s(settings: Any) -> float | None:
    """How long ago the reconciler finished a pass (None: never, or over a day ago), read
    from the one key it writes, with nothing else opened: ``--check`` is the Compose health
    check of ``beat``, which has 5 s."""
    from offpath.stores.leases.key_stores import RedisKeyStore, SqlKeyStore, reconciler_key

    key = reconciler_key(settings.redis_key_prefix)
    if settings.lock_backend == "redis":
        import redis

        timeout = settings.publish_timeout_s
        client = redis.Redis.from_url(
            settings.redis_url, socket_connect_timeout=timeout, socket_timeout=timeout
        )
        try:
            value = RedisKeyStore(client).get(key)
        except redis.RedisError as exc:
            fail(f"cannot read the reconciler's last pass from Redis: {exc}")
        finally:
            client.close()
    else:
        from offpath.stores.db.engine import make_engine

        engine = make_engine(settings)
        try:
            value = SqlKeyStore(engine).get(key)
        finally:
            engine.dispose()
    return time.time() - float(value) if value else None


@app.command()
def migrate() -> None:
    """Create or upgrade the usage tables (Alembic)."""
    settings = settings_or_exit()
    console.print(migrate_or_exit(settings))
