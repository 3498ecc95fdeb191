"""docker-compose.yml's stack started as the file writes it, without a Docker engine
(issue 21, item 8).

Each service's ``command`` and health check run as processes on this machine, in the order
its ``depends_on`` gives, each waiting for the condition it names (healthy, completed, or
started). The environment is the one Compose would give: the service's ``environment`` with
the values of a ``.env`` made as the README says (``cp .env.example .env`` and the lines it
asks to set), ``${VAR:-default}`` interpolated, and each secret the service mounts as the
setting its file stands for. What differs is only where things are: the Compose network's
names and ports become local ones (a private ``redis-server`` started with the redis service's
own command, a scratch database on the machine's PostgreSQL, free ports for the published
ones), and ``0.0.0.0`` becomes ``127.0.0.1`` (a shared machine). Prometheus and Grafana are not
installed here: deploy/prometheus.yml's scrape jobs are fetched as Prometheus would fetch them
(same paths, Host headers and key file), and their files are checked in test_deploy_files.py.
The README's two ``docker compose exec -T api offpath keys create`` steps run in the api
service's environment and their keys are used.
"""

from __future__ import annotations

import graphlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from stack import BIN, ROOT, create_pg_database, drop_pg_database, free_port

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = {n: s for n, s in COMPOSE["services"].items() if not s.get("profiles")}
#: Not installed here: their configuration is what the test checks of them.
NOT_RUN = {"prometheus", "grafana"}
#: The machine's PostgreSQL stands in for the postgres service (trust auth, user postgres).
PG_HOST_PORT = "127.0.0.1:5432"
#: What the README's Compose steps put in .env beyond .env.example (a quick reconciler: the
#: beat's health check passes after its first pass, 3 intervals at most).
DOTENV_EDITS = {"FLOWER_BASIC_AUTH": "ops:compose-test", "RECONCILE_INTERVAL_S": "2"}
#: Settings that are a port a service listens on inside its container.
PORT_SETTINGS = {"WORKER_METRICS_PORT": "worker"}
HEALTH_DEADLINE_S = 180  # a loaded 2-core machine: imports alone take seconds


def _dotenv() -> dict[str, str]:
    out = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out | DOTENV_EDITS


def _container_port(name: str) -> int | None:
    """The port service ``name`` listens on inside the Compose network."""
    svc = SERVICES[name]
    if svc.get("ports"):
        return int(svc["ports"][0].rsplit(":", 1)[1])
    return {"redis": 6379, "postgres": 5432, "worker": int(_dotenv()["WORKER_METRICS_PORT"])}.get(
        name
    )


class ComposeRun:
    """The stack's processes, their local addresses, and the files its secrets are."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.workdir = tmp / "app"  # the image's WORKDIR (DATA_DIR is relative to it)
        self.workdir.mkdir()
        self.dotenv = _dotenv()
        self.local = {n: free_port() for n in SERVICES if _container_port(n) and n != "postgres"}
        self.database = create_pg_database("offpath_test_compose")
        self.secrets = tmp / "secrets"  # the README's `mkdir -p secrets` and its files
        self.secrets.mkdir()
        (self.secrets / "database_password").write_text(uuid.uuid4().hex + "\n")
        (self.secrets / "metrics_api_key").touch()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.healthy: set[str] = set()

    # --- what Compose would hand a container, at local addresses ---------------------------

    def interpolate(self, value: str) -> str:
        """Compose's ``${VAR}`` and ``${VAR:-default}`` with the .env's values."""

        def sub(m: re.Match[str]) -> str:
            found = self.dotenv.get(m.group(1), "")
            return found if found or m.group(2) is None else m.group(2)

        return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", sub, value)

    def localize(self, text: str, service: str | None = None) -> str:
        """The Compose network's addresses in ``text`` as this machine's."""
        database = self.database.rsplit("/", 1)[1]
        text = text.replace(
            "postgresql://offpath@postgres:5432/offpath",
            f"postgresql://postgres@{PG_HOST_PORT}/{database}",
        )
        for name, port in self.local.items():
            text = text.replace(f"{name}:{_container_port(name)}", f"127.0.0.1:{port}")
        if service in self.local:  # its own health check reaches it on its loopback
            text = text.replace(
                f"127.0.0.1:{_container_port(service)}", f"127.0.0.1:{self.local[service]}"
            )
        return text.replace("0.0.0.0", "127.0.0.1")

    def environment(self, name: str) -> dict[str, str]:
        svc = SERVICES[name]
        env = {k: v for k, v in os.environ.items() if k not in self.dotenv}
        for key, value in (svc.get("environment") or {}).items():
            if value is None:  # passed through from .env (or left unset)
                if key not in self.dotenv:
                    continue
                value = self.dotenv[key]
            value = self.localize(self.interpolate(str(value)), name)
            if key in PORT_SETTINGS and int(value) == _container_port(PORT_SETTINGS[key]):
                value = str(self.local[PORT_SETTINGS[key]])
            env[key] = value
        for secret in svc.get("secrets", []):
            # offpath reads /run/secrets/NAME as the setting NAME (Settings' secrets_dir)
            env[secret.upper()] = (self.secrets / secret).read_text().strip()
        return env

    def argv(self, command: list[str], service: str) -> list[str]:
        """``command`` with this machine's executables and the service's local port."""
        exe = {"python": sys.executable, "offpath": str(BIN / "offpath")}
        exe["celery"] = str(BIN / "celery")
        args = [self.localize(str(a), service) for a in command]
        args[0] = exe.get(args[0]) or shutil.which(args[0]) or args[0]
        for i, arg in enumerate(args[1:], 1):
            if args[i - 1] == "--port" and int(arg) == _container_port(service):
                args[i] = str(self.local[service])
        if Path(args[0]).name == "redis-server":  # the machine's has its own port and folder
            redis_dir = self.tmp / "redis"
            redis_dir.mkdir(exist_ok=True)
            args += ["--port", str(self.local["redis"]), "--bind", "127.0.0.1"]
            args += ["--dir", str(redis_dir)]
        if Path(args[0]).name == "redis-cli":
            args[1:1] = ["-p", str(self.local["redis"])]
        if Path(args[0]).name == "pg_isready":
            host, port = PG_HOST_PORT.split(":")
            args = [a if a != "offpath" else "postgres" for a in args] + ["-h", host, "-p", port]
        return args

    # --- running -------------------------------------------------------------------------

    def start(self, name: str) -> None:
        """Start ``name`` once what it depends on meets the condition it names."""
        for dep, how in (SERVICES[name].get("depends_on") or {}).items():
            condition = how["condition"]
            if condition == "service_healthy":
                self.wait_healthy(dep)
            elif condition == "service_completed_successfully":
                code = self.procs[dep].wait(timeout=HEALTH_DEADLINE_S)
                assert code == 0, f"{dep} exited {code}:\n{self.log(dep)}"
            else:
                assert condition == "service_started", condition
                assert dep in self.procs or dep in NOT_RUN or dep == "postgres", dep
        if name in NOT_RUN or name == "postgres":  # the machine's PostgreSQL is up
            return
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(
            self.argv(SERVICES[name]["command"], name),
            cwd=self.workdir,
            env=self.environment(name),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def health_check(self, name: str) -> subprocess.CompletedProcess[str]:
        test = SERVICES[name]["healthcheck"]["test"]
        assert test[0] == "CMD", test
        return subprocess.run(
            self.argv(test[1:], name),
            cwd=self.workdir,
            env=self.environment(name),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def wait_healthy(self, name: str) -> None:
        """Run ``name``'s health check until it passes (Docker's interval, at most 2 s)."""
        if name in self.healthy:
            return
        interval = min(2.0, float(SERVICES[name]["healthcheck"]["interval"].rstrip("s")))
        deadline = time.monotonic() + HEALTH_DEADLINE_S
        while True:
            proc = self.procs.get(name)
            assert proc is None or proc.poll() is None, f"{name} exited:\n{self.log(name)}"
            result = self.health_check(name)
            if result.returncode == 0:
                self.healthy.add(name)
                return
            assert time.monotonic() < deadline, (
                f"{name}'s health check still fails: {result.stdout}{result.stderr}\n"
                + self.log(name)
            )
            time.sleep(interval)

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def exec(self, service: str, command: str) -> subprocess.CompletedProcess[str]:
        """``docker compose exec -T SERVICE COMMAND``: in the service's environment."""
        return subprocess.run(
            self.argv(command.split(), service),
            cwd=self.workdir,
            env=self.environment(service),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        drop_pg_database(self.database)


def _order() -> list[str]:
    graph = {n: set(s.get("depends_on") or {}) for n, s in SERVICES.items()}
    return list(graphlib.TopologicalSorter(graph).static_order())


def _readme_compose_steps() -> list[str]:
    """The shell lines of the README's "With Docker Compose" code block."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### With Docker Compose") :]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory):
    run = ComposeRun(tmp_path_factory.mktemp("compose"))
    try:
        for name in _order():
            run.start(name)
        for name in _order():
            if name not in NOT_RUN and "healthcheck" in SERVICES[name]:
                run.wait_healthy(name)
        yield run
    finally:
        run.stop()


def test_every_service_starts_in_order_and_passes_its_health_check(compose):
    """Every service but Prometheus and Grafana ran its command; the one-shot migration
    exited 0 and the others are up and passed their own health checks."""
    ran = set(compose.procs) | {"postgres"}
    assert ran == set(SERVICES) - NOT_RUN
    assert compose.procs["migrate"].returncode == 0
    for name, proc in compose.procs.items():
        if name != "migrate":
            assert proc.poll() is None, f"{name} exited:\n{compose.log(name)}"
    assert compose.healthy == {n for n in SERVICES if "healthcheck" in SERVICES[n]} - NOT_RUN
    assert "beat" in compose.healthy  # `offpath beat --check`: the reconciler ran


@pytest.fixture(scope="module")
def readme_keys(compose: ComposeRun) -> dict[str, str]:
    """The README's `docker compose exec -T api offpath keys create ...` lines, run in the
    api service's environment, their redirections done: {target file or "operator": key}."""
    steps = [s for s in _readme_compose_steps() if s.startswith("docker compose exec -T api ")]
    assert len(steps) == 2, steps
    keys = {}
    for step in steps:
        command, _, target = step.removeprefix("docker compose exec -T api ").partition(">")
        result = compose.exec("api", command.strip())
        assert result.returncode == 0, result.stderr
        if target:
            (compose.secrets / Path(target.strip()).name).write_text(result.stdout)
        keys[target.strip() or "operator"] = result.stdout
    return keys


def test_the_readme_steps_make_the_keys_prometheus_and_the_operator_use(compose, readme_keys):
    """One key step fills secrets/metrics_api_key (the file Prometheus reads), the other
    prints the operator's key alone on stdout (the note goes to stderr), and the API takes
    it."""
    assert set(readme_keys) == {"secrets/metrics_api_key", "operator"}
    (key,) = readme_keys["operator"].split()
    assert readme_keys["secrets/metrics_api_key"].split() != [key]
    api = f"http://127.0.0.1:{compose.local['api']}"
    r = httpx.get(f"{api}/stats", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    assert httpx.get(f"{api}/stats").status_code == 401
    # the README's `docker compose exec -T -e OFFPATH_API_KEY=<your key> api offpath stats`:
    # in the api container, with every server setting there (API_URL's default is the api's
    # own address, here its local port)
    stats = subprocess.run(
        [str(BIN / "offpath"), "stats"],
        cwd=compose.workdir,
        env={**compose.environment("api"), "OFFPATH_API_KEY": key, "API_URL": api},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stats.returncode == 0 and "total_summarizations" in stats.stdout, stats.stderr


def _scrape_targets(job: dict[str, Any]) -> list[str]:
    targets = [t for c in job.get("static_configs", []) for t in c["targets"]]
    for sd in job.get("dns_sd_configs", []):
        targets += [f"{name}:{sd['port']}" for name in sd["names"]]
    return targets


def test_prometheus_scrapes_every_target_it_names(compose, readme_keys):
    """deploy/prometheus.yml's jobs fetched as Prometheus fetches them: each target (a
    Compose service and port) at its local address, with the target as Host header and the
    job's key file (the Compose secret) as bearer token. Each answers 200 with the metrics
    of what it is: offpath's for the API and the worker, Flower's for Flower."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    prometheus = SERVICES["prometheus"]
    expected = {
        "offpath-api": "offpath_jobs_open",
        "offpath-worker": "offpath_",
        "flower": "flower_",
    }
    assert {job["job_name"] for job in config["scrape_configs"]} == set(expected)
    for job in config["scrape_configs"]:
        headers = {}
        auth = job.get("authorization")
        if auth:
            secret = auth["credentials_file"].removeprefix("/run/secrets/")
            assert secret in prometheus["secrets"], secret
            token = (compose.secrets / secret).read_text().strip()
            assert token, f"{secret} is empty: the README's key step did not fill it"
            headers["Authorization"] = f"{auth.get('type', 'Bearer')} {token}"
        for target in _scrape_targets(job):
            service, _, port = target.partition(":")
            assert service in SERVICES and int(port) == _container_port(service), target
            url = f"http://{compose.localize(target)}{job.get('metrics_path', '/metrics')}"
            r = httpx.get(url, headers={**headers, "Host": target}, timeout=30)
            assert r.status_code == 200, (job["job_name"], r.status_code, r.text[:300])
            assert expected[job["job_name"]] in r.text, job["job_name"]
    api = f"http://127.0.0.1:{compose.local['api']}/metrics"
    assert httpx.get(api, headers={"Host": "api:8000"}).status_code == 401  # the key matters


def test_flower_takes_the_dotenv_password_and_refuses_to_start_without_one(compose):
    """Flower answers with FLOWER_BASIC_AUTH's user and password and not without; and its
    command as written (`--address 0.0.0.0`) with no FLOWER_BASIC_AUTH (the README: set it
    before `up`) exits at once with one line naming the setting, listening nowhere."""
    flower = f"http://127.0.0.1:{compose.local['flower']}"
    user, _, password = DOTENV_EDITS["FLOWER_BASIC_AUTH"].partition(":")
    assert httpx.get(f"{flower}/api/workers", auth=(user, password)).status_code == 200
    assert httpx.get(f"{flower}/api/workers").status_code == 401
    env = compose.environment("flower")
    env["FLOWER_BASIC_AUTH"] = ""
    written = [str(BIN / "offpath"), *SERVICES["flower"]["command"][1:]]
    assert "0.0.0.0" in written
    written[written.index("--port") + 1] = str(free_port())
    result = subprocess.run(
        written, cwd=compose.workdir, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "FLOWER_BASIC_AUTH" in result.stderr, result.stderr


def test_the_worker_runs_one_process_per_container(compose):
    """Prometheus scrapes one port per worker container (WORKER_METRICS_PORT): with
    .env.example's WORKER_PROCESSES=0 (one per core) copied into .env, a container ran one
    process per core, and all but the first went unscraped. The compose file fixes it at 1
    (scale with `--scale worker=N`)."""
    env = compose.environment("worker")
    assert env["WORKER_PROCESSES"] == "1"
    user, _, password = DOTENV_EDITS["FLOWER_BASIC_AUTH"].partition(":")
    flower = f"http://127.0.0.1:{compose.local['flower']}"
    workers = httpx.get(
        f"{flower}/api/workers", params={"refresh": 1}, auth=(user, password), timeout=30
    ).json()
    assert len(workers) == 1, sorted(workers)
