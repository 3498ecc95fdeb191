"""docker-compose.yml, the Dockerfile and .env.example stay in step with the code (issue 4).
Docker does not run here: the files are parsed and checked against the project."""

from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from offpath.cli.main import app
from offpath.compaction.settings import Settings
from offpath.config import EnvironmentSettings

ROOT = Path(__file__).resolve().parents[1]


def env_example() -> dict[str, str]:
    out = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_env_example_lists_every_setting_with_a_comment():
    lines = (ROOT / ".env.example").read_text().splitlines()
    keys = env_example()
    assert set(keys) == {name.upper() for name in Settings.model_fields}
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert lines[i - 1].startswith("# "), f"{line} has no comment line above it"


def test_the_derived_tool_result_limit_the_docs_give_is_the_settings_own():
    """``TOOL_RESULT_MAX_CHARS=0`` is derived from the threshold and the keep window: the
    figure README.md and .env.example give for it at the defaults is the one the code uses."""
    limit = Settings(_env_file=None).tool_result_limit_chars
    readme = next(
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("| `TOOL_RESULT_MAX_CHARS`")
    )
    example = (ROOT / ".env.example").read_text().split("TOOL_RESULT_MAX_CHARS=")[0]
    for where, text in (("README.md", readme), (".env.example", example)):
        said = re.findall(r"\(([\d,]+) at the defaults\)", text)
        assert said and int(said[-1].replace(",", "")) == limit, (where, said, limit)


def test_env_example_defaults_match_the_settings():
    defaults = Settings.model_construct()
    for key, value in env_example().items():
        default = getattr(defaults, key.lower())
        if default is None:
            assert value == "", key
        else:
            assert str(default).lower() == value.lower() or float(default) == float(value), key


def test_compose_services_commands_exist_and_variables_are_documented():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "postgres", "migrate", "api", "worker", "flower"} <= set(services)
    documented = set(env_example())
    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    for name in ("migrate", "api", "worker", "flower"):
        svc = services[name]
        assert svc["build"] == "."
        cmd = svc["command"]
        assert cmd[0] == "offpath" and cmd[1] in commands, cmd
        assert CliRunner().invoke(app, [*cmd[1:], "--help"]).exit_code == 0, cmd
        for var in svc.get("environment", {}):
            assert var in documented, f"{name} sets {var}, which .env.example does not list"
    for name, svc in services.items():
        if name != "migrate":
            assert "healthcheck" in svc, f"{name} has no health check"
    text = (ROOT / "docker-compose.yml").read_text()
    for var in re.findall(r"\$\{(\w+)", text):
        assert var in documented, var


# --- deploy defaults (issue 10, item 3) ------------------------------------------------------

#: Settings no container needs: the CLI's own, and those docker-compose.yml sets otherwise
#: (the database password is a secret file; Flower's port is on its command line).
#: OWN_AGENT_TENANT is read by the middleware in a team's own app, which is not a service here.
NOT_FOR_CONTAINERS = {
    "OFFPATH_API_KEY",
    "API_URL",
    "DATA_DIR",
    "DATABASE_PASSWORD",
    "FLOWER_PORT",
    "OWN_AGENT_TENANT",
    "SCRIPTED_JOB_WAIT_S",  # the embedded demo's scripted model only
}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _environment(svc: dict) -> dict:
    env = svc.get("environment") or {}
    assert isinstance(env, dict), "environment as a mapping (NAME: value, or NAME: to pass it on)"
    return env


def test_compose_publishes_ports_on_127_0_0_1_only():
    """The API, Flower, Prometheus and Grafana answer on the host's loopback only; nothing else is
    published (the workers' metrics ports neither)."""
    services = _compose()["services"]
    published = {name: svc["ports"] for name, svc in services.items() if svc.get("ports")}
    assert set(published) == {"api", "flower", "prometheus", "grafana"}, published
    for name, ports in published.items():
        for port in ports:
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)
    assert published["api"] == ["127.0.0.1:8000:8000"]
    assert published["flower"] == ["127.0.0.1:5555:5555"]
    assert published["prometheus"] == ["127.0.0.1:9090:9090"]
    assert published["grafana"] == ["127.0.0.1:3000:3000"]


def test_prometheus_scrapes_the_api_with_a_key_and_every_worker():
    """Issue 12: the compose file's Prometheus reads deploy/prometheus.yml, which scrapes the
    API's /metrics with an admin key from a Compose secret (the API refuses it without one
    unless METRICS_PUBLIC), and each worker on the port its setting names."""
    compose = _compose()
    prometheus = compose["services"]["prometheus"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert "metrics_api_key" in prometheus["secrets"]
    assert compose["secrets"]["metrics_api_key"] == {"file": "./secrets/metrics_api_key"}
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    api = jobs["offpath-api"]
    assert api["static_configs"][0]["targets"] == ["api:8000"]
    assert api["authorization"]["credentials_file"] == "/run/secrets/metrics_api_key"
    worker = jobs["offpath-worker"]["dns_sd_configs"][0]
    assert worker["names"] == ["worker"]
    assert worker["port"] == Settings.model_construct().worker_metrics_port
    env = _environment(compose["services"]["worker"])
    assert env["WORKER_METRICS_HOST"] == "0.0.0.0" and "WORKER_METRICS_PORT" in env
    assert "ports" not in compose["services"]["worker"]


def test_grafana_dashboard_uses_only_metrics_offpath_exports():
    """deploy/grafana/offpath-dashboard.json is valid JSON, its datasource an import input,
    and every offpath_* series its queries name is one offpath.metrics defines."""
    import json

    from prometheus_client import REGISTRY

    import offpath.coordination.exporter
    import offpath.metrics  # noqa: F401 - registers the metrics

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "offpath-dashboard.json").read_text())
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
    exported = {
        sample
        for metric in REGISTRY.collect()
        if metric.name.startswith("offpath_")
        for sample in (
            metric.name,
            f"{metric.name}_total",
            f"{metric.name}_bucket",
            f"{metric.name}_sum",
            f"{metric.name}_count",
        )
    } | set(offpath.coordination.exporter.READ_AT_SCRAPE)  # read at scrape time by the API
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"offpath_[a-z_]+", target["expr"]))
    assert used and used <= exported, used - exported


def test_grafana_is_provisioned_with_the_dashboard_and_the_compose_prometheus():
    """Issue 21, item 8: the compose file's Grafana loads deploy/grafana/provisioning: a
    Prometheus data source at the prometheus service's address, and a dashboard provider
    whose folder is where the compose file mounts offpath-dashboard.json. Provisioning does
    not fill the dashboard's import input (``${DS_PROMETHEUS}``), so the dashboard declares
    a data source variable of that name: every ``${...}`` it uses is one of its variables."""
    import json

    compose = _compose()
    grafana = compose["services"]["grafana"]
    mounts = dict(volume.rsplit(":", 2)[:2] for volume in grafana["volumes"] if ":/" in volume)
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    prometheus = compose["services"]["prometheus"]
    assert "--web.listen-address" not in " ".join(prometheus["command"])  # so its default:
    assert (
        source["url"] == "http://prometheus:9090" and "127.0.0.1:9090:9090" in prometheus["ports"]
    )
    assert grafana["depends_on"] == {"prometheus": {"condition": "service_started"}}
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "offpath.yml").read_text())[
        "providers"
    ]
    assert provider["type"] == "file"
    mounted = mounts["./deploy/grafana/offpath-dashboard.json"]
    assert str(Path(mounted).parent) == provider["options"]["path"], (mounted, provider)
    for path in provisioning.rglob("*"):
        if path.is_file():
            assert path.suffix == ".yml" and yaml.safe_load(path.read_text())["apiVersion"] == 1
    text = (ROOT / "deploy" / "grafana" / "offpath-dashboard.json").read_text()
    variables = {v["name"]: v for v in json.loads(text)["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert set(re.findall(r"\$\{(\w+)", text)) <= set(variables)
    password = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    assert password == "/run/secrets/grafana_admin_password"
    assert grafana["secrets"] == ["grafana_admin_password"]
    assert compose["secrets"]["grafana_admin_password"] == {
        "file": "./secrets/grafana_admin_password"
    }


def test_compose_gives_each_service_only_the_settings_it_needs():
    """No env_file hands the whole .env to every service: each service names its variables.
    The LLM key reaches the API and the worker only, Flower's password Flower only, the API's
    own switches the API only; and every setting reaches some service, or is known not to."""
    services = _compose()["services"]
    for name, svc in services.items():
        assert "env_file" not in svc, f"{name} gets the whole .env through env_file"
    offpath = {name for name, svc in services.items() if svc.get("build") == "."}
    assert offpath == {"migrate", "api", "worker", "beat", "flower"}
    given = {name: set(_environment(services[name])) for name in offpath}
    holders = lambda var: {name for name, env in given.items() if var in env}  # noqa: E731
    assert holders("OPENAI_API_KEY") == {"api", "worker"}
    assert holders("OPENAI_BASE_URL") == {"api", "worker"}
    assert holders("FLOWER_BASIC_AUTH") == {"flower"}
    assert holders("AUTH_DISABLED") == {"api"}
    assert holders("DATABASE_URL") == {"migrate", "api", "worker", "beat"}
    assert given["migrate"] <= {"DATABASE_URL", "LOG_LEVEL"}
    settings = {name.upper() for name in Settings.model_fields}
    for name, env in given.items():
        assert env <= settings, f"{name} sets {env - settings}, which are not settings"
    reached = set().union(*given.values())
    missing = settings - reached - NOT_FOR_CONTAINERS
    assert not missing, f"docker-compose.yml passes {sorted(missing)} to no service: add them"
    # a service given one side of a cross-checked pair gets the other side too
    pairs = [
        ("SUMMARIZATION_KEEP_CHARS", "SUMMARIZATION_THRESHOLD_CHARS"),
        ("SUMMARIZATION_THRESHOLD_TOKENS", "SUMMARIZATION_THRESHOLD_CHARS"),
        ("CHARS_PER_TOKEN", "SUMMARIZATION_THRESHOLD_TOKENS"),
        ("CONTEXT_HARD_LIMIT_CHARS", "SUMMARIZATION_THRESHOLD_CHARS"),
        ("JOB_SOFT_TIME_LIMIT_S", "JOB_TIME_LIMIT_S"),
        ("SUMMARIZATION_TIMEOUT_S", "JOB_SOFT_TIME_LIMIT_S"),
        ("SUMMARIZATION_MAX_RETRIES", "JOB_SOFT_TIME_LIMIT_S"),
        ("JOB_RETRY_BACKOFF_MAX_S", "CELERY_VISIBILITY_TIMEOUT_S"),
        ("JOB_TIME_LIMIT_S", "CELERY_VISIBILITY_TIMEOUT_S"),
        ("FAILURE_BACKOFF_S", "FAILURE_BACKOFF_MAX_S"),
    ]
    for name, env in given.items():
        for a, b in pairs:
            assert (a in env) == (b in env), f"{name} gets one of {a} and {b} without the other"


def test_compose_reads_the_database_password_from_a_secret():
    compose = _compose()
    services = compose["services"]
    secret = compose["secrets"]["database_password"]
    assert secret == {"file": "./secrets/database_password"}
    postgres = services["postgres"]
    env = _environment(postgres)
    assert "POSTGRES_PASSWORD" not in env
    assert env["POSTGRES_PASSWORD_FILE"] == "/run/secrets/database_password"
    assert "database_password" in postgres["secrets"]
    for name, svc in services.items():
        url = _environment(svc).get("DATABASE_URL")
        if url is None:
            continue
        assert "database_password" in svc.get("secrets", []), f"{name} has no database secret"
        assert url == "postgresql://offpath@postgres:5432/offpath", f"{name}: {url}"
    assert "offpath:offpath@" not in (ROOT / "docker-compose.yml").read_text()


def test_the_app_adds_the_secret_file_to_database_url(tmp_path):
    """What the containers do: the file /run/secrets/database_password is the setting
    DATABASE_PASSWORD, which completes a DATABASE_URL that has no password."""
    import sqlalchemy

    (tmp_path / "database_password").write_text("p@ss/w:rd\n")
    settings = EnvironmentSettings(
        _env_file=None,
        _secrets_dir=tmp_path,
        database_url="postgresql://offpath@postgres:5432/offpath",
    )
    url = sqlalchemy.engine.make_url(settings.database_url)
    assert (url.username, url.password, url.host, url.database) == (
        "offpath",
        "p@ss/w:rd",
        "postgres",
        "offpath",
    )
    own = Settings(database_url="postgresql://u:mine@h/db", database_password="x")
    assert own.database_url == "postgresql://u:mine@h/db"  # a URL's own password wins


def test_compose_api_answers_its_health_check_and_the_other_containers():
    services = _compose()["services"]
    hosts = _environment(services["api"])["ALLOWED_HOSTS"]
    fixed = hosts.split("${", 1)[0].split(",")
    assert {"127.0.0.1", "api"} <= set(fixed), hosts  # the health check's Host, the service name
    assert "127.0.0.1:8000/healthz" in " ".join(services["api"]["healthcheck"]["test"])


def test_dockerfile_copies_every_folder_of_the_package_and_installs_the_console_script():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for folder in ("offpath", "api", "worker", "examples"):
        assert f"COPY {folder} ./{folder}" in dockerfile, folder
    scripts = _pyproject()["project"]["scripts"]
    assert scripts == {"offpath": "offpath.cli.main:app"}


def test_the_wheel_installs_one_top_level_package_with_its_migrations(tmp_path):
    """Issue 9, item 3: installed, offpath adds one import name, `offpath`; api/ and worker/
    are mapped under it, and the Alembic migrations ship in the wheel."""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"  # a copy: setuptools writes build/ beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "offpath", "api", "worker", "examples"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, src / name)
    subprocess.run(  # uv's build frontend (the dev extra's uv), as `uv sync` in the Dockerfile
        [sys.executable, "-m", "uv", "build", "--wheel", "-q", "-o", str(tmp_path), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"offpath"}, tops
    # every module of the checkout is in the wheel (a package missing from pyproject's list
    # installs without its modules: issue 23 split modules into packages)
    mapped = {"api": "offpath/api", "worker": "offpath/worker", "offpath": "offpath"}
    for top, inside in mapped.items():
        for module in (ROOT / top).rglob("*.py"):
            path = f"{inside}/{module.relative_to(ROOT / top).as_posix()}"
            assert path in names, path
    for path in (
        "offpath/agent/middleware/__init__.py",
        "offpath/stores/migrations/env.py",
        "offpath/stores/migrations/script.py.mako",
        "offpath/stores/migrations/versions/0001_usage_tables.py",
        "offpath/demo/sre/manifest.json",  # the demo agent's fixtures (issue 21, item 7)
    ):
        assert path in names, path


def _dockerfile_copies() -> list[tuple[str, str]]:
    """(source, destination) of the Dockerfile's COPY lines, in order."""
    out = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            *sources, dest = line.split()[1:]
            out += [(source, dest) for source in sources]
    return out


def test_the_image_install_serves_the_default_agent_tools_without_a_checkout(tmp_path):
    """Issue 21, item 7: the Docker image's agent tools answered "no SRE fixtures at
    .../site-packages/examples/sre": nothing set DEMO_FIXTURES_DIR in a non-editable install.
    The wheel ships examples/sre as offpath/demo/sre. Here the Dockerfile's own steps run
    without Docker: its COPY lines into a scratch /src, its `uv sync --locked --no-editable`
    into a scratch environment; then the default AGENT_TOOLS answer from there, from another
    directory, with DEMO_FIXTURES_DIR unset."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    for source, dest in _dockerfile_copies():
        target = src / dest if dest != "./" else src / source
        copy = shutil.copytree if (ROOT / source).is_dir() else shutil.copy
        copy(ROOT / source, target)
    dockerfile = (ROOT / "Dockerfile").read_text()
    (sync,) = [line for line in dockerfile.splitlines() if "--no-editable" in line]
    args = sync.split("uv sync", 1)[1].split("&&", 1)[0].split()
    assert args[:2] == ["--locked", "--no-editable"], args
    env = {k: v for k, v in os.environ.items() if k not in ("DEMO_FIXTURES_DIR", "VIRTUAL_ENV")}
    env |= {"UV_PROJECT_ENVIRONMENT": str(tmp_path / "image"), "UV_PYTHON_DOWNLOADS": "never"}
    python = Path(sys.executable)  # this venv's interpreter (the image's is python3)
    out = subprocess.run(
        [sys.executable, "-m", "uv", "sync", *args[:-2], "--python", str(python), "-q"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    shutil.rmtree(src)  # the image needs nothing of /src at run time: prove it here
    image_python = tmp_path / "image" / "bin" / "python"
    code = """if True:
        import json, offpath
        from offpath.compaction.settings import Settings
        from offpath.agent.sre_tools.fixtures import fixtures_dir
        from offpath.agent.graph import load_tools
        tools = {t.name: t for t in load_tools(Settings().agent_tools)}
        calls = {
            "get_logs": {"service": "checkout-api", "pod": "checkout-api-6f7d9-1", "limit": 1},
            "query_metrics": {"query": "http_server_request_duration_seconds:p99"},
            "recent_deploys": {"service": "checkout-api", "limit": 1},
            "pod_status": {"selector": "app=checkout-api"},
        }
        print(json.dumps({
            "offpath": offpath.__file__,
            "fixtures": str(fixtures_dir()),
            "answers": {name: tools[name].invoke(args) for name, args in calls.items()},
        }))
    """
    run = subprocess.run(
        [str(image_python), "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout)
    site = str(tmp_path / "image" / "lib")
    assert found["offpath"].startswith(site), found["offpath"]  # the wheel, not the checkout
    assert found["fixtures"].startswith(site) and found["fixtures"].endswith("offpath/demo/sre")
    answers = found["answers"]
    for name, answer in answers.items():
        assert not answer.startswith("error:"), (name, answer)
    fixtures = ROOT / "examples" / "sre"
    last_line = (fixtures / "logs/checkout-api/checkout-api-6f7d9-1.log").read_text().split("\n")
    assert [line for line in last_line if line][-1] in answers["get_logs"]
    pods = json.loads((fixtures / "pods.json").read_text())["items"]
    names = [p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith("checkout-")]
    assert names and all(name in answers["pod_status"] for name in names)
    shipped = {str(p.relative_to(fixtures)) for p in fixtures.rglob("*") if p.is_file()}
    installed = Path(found["fixtures"])
    assert {str(p.relative_to(installed)) for p in installed.rglob("*") if p.is_file()} == shipped


# --- dependencies: declared with bounds, locked, installed from the lock (issue 8, item 19;
# uv and uv.lock: issue 21, item 9) -------------------------------------------------------

FIRST_PARTY = ("offpath", "api", "worker", "bench", "examples")
RUNTIME = ("offpath", "api", "worker")  # what the wheel ships; the rest runs from the checkout
#: bench/peers.py's imports from the bench extra (`make bench` installs it, `make install`
#: does not): {import name: distribution}
BENCH_ONLY = {"deepagents": "deepagents", "langmem": "langmem", "quicktok": "quicktok-v1"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(items: list[str]) -> dict[str, str]:
    """{canonical name: version specifier} of PEP 508 requirement strings."""
    out = {}
    for item in items:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*)", item)
        assert m, item
        out[_canonical(m.group(1))] = m.group(3).strip()
    return out


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins() -> dict[str, str]:
    """{canonical name: version} of every package uv.lock pins (the project itself aside)."""
    import tomllib

    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    pins = {}
    for package in lock["package"]:
        if package["source"].get("registry"):
            pins[_canonical(package["name"])] = package["version"]
    return pins


def _imports(folder: str) -> set[str]:
    """Dotted names of the modules imported (absolutely) by the .py files under ``folder``."""
    import ast

    names = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return names


#: importlib's top-level module -> distributions map, read once (each call reads every
#: installed distribution's file list: 40 s over the imports the test checks).
_packages_distributions = functools.cache(importlib.metadata.packages_distributions)


@functools.cache
def _distribution(module: str) -> str:
    """The installed distribution that provides ``module`` (a namespace package such as
    ``langgraph`` spans several: the one holding the module's file)."""
    import importlib.metadata
    import importlib.util

    top = module.split(".")[0]
    candidates = _packages_distributions().get(top)
    assert candidates, f"{module} is imported but no installed distribution provides it"
    if len(set(candidates)) > 1:
        origin = Path(importlib.util.find_spec(module).origin or "").resolve()
        for name in set(candidates):
            dist = importlib.metadata.distribution(name)
            if any(Path(dist.locate_file(f)).resolve() == origin for f in dist.files or ()):
                return _canonical(name)
    return _canonical(candidates[0])


def _local_modules() -> set[str]:
    tests = ROOT / "tests"
    return (
        set(FIRST_PARTY)
        | {p.stem for p in tests.glob("*.py")}
        | {p.name for p in tests.iterdir() if p.is_dir()}
    )


def test_every_third_party_import_is_declared_with_bounds_and_pinned():
    import importlib.metadata
    import sys

    project = _pyproject()["project"]
    runtime = _requirements(project["dependencies"])
    dev = _requirements(project["optional-dependencies"]["dev"])
    bench = _requirements(project["optional-dependencies"]["bench"])
    pins = _pins()
    local = _local_modules()
    problems = []
    for folder in (*FIRST_PARTY, "tests"):
        declared = runtime if folder in RUNTIME else {**runtime, **dev}
        for module in sorted(_imports(folder)):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in local or top == "__future__":
                continue
            if folder == "bench" and top in BENCH_ONLY:  # may be absent: `make install`
                if BENCH_ONLY[top] not in bench:
                    problems.append(f"bench imports {module}, {BENCH_ONLY[top]} not in bench")
                continue
            dist = _distribution(module)
            if dist not in declared:
                where = "dependencies" if folder in RUNTIME else "dependencies or the dev extras"
                problems.append(f"{folder} imports {module} ({dist}), not in {where}")
    for name, spec in {**runtime, **dev, **bench}.items():
        if not re.search(r"(>=|~=|==)", spec) or not re.search(r"(<|~=|==)", spec):
            problems.append(f"{name}{spec or ' (no version)'}: needs a lower and an upper bound")
        if name not in pins:
            problems.append(f"{name} is not locked in uv.lock (run `make lock`)")
        elif name in bench and name not in {**runtime, **dev}:
            continue  # installed by `make bench` only
        elif importlib.metadata.version(name) != pins[name]:
            problems.append(
                f"{name} {importlib.metadata.version(name)} is installed, uv.lock pins "
                f"{pins[name]} (run `make install`)"
            )
    assert not problems, "\n".join(problems)


def test_makefile_ci_and_dockerfile_install_from_the_lock_file():
    """Issue 21, item 9: `make install` (so `make demo`, `make test`, `make bench` and
    .ci/run) and the Dockerfile install with uv from uv.lock, refusing a stale lock; uv comes
    from PyPI when none is on PATH; no pip install and no constraints.txt are left."""
    assert not (ROOT / "constraints.txt").exists()
    lock = (ROOT / "uv.lock").read_text()
    assert lock.startswith("version = 1\n"), "uv.lock is uv's lock file"
    makefile = (ROOT / "Makefile").read_text()
    stamp = re.search(r"^\$\(BIN\)/\.installed:(.*)$", makefile, re.M)
    assert stamp and {"pyproject.toml", "uv.lock"} <= set(stamp.group(1).split())
    assert "$(UV) sync --locked --extra dev" in makefile
    for target in ("demo", "test", "bench", "lint"):
        assert re.search(rf"^{target}: install$", makefile, re.M), target
    assert re.search(r"^lock: .*\n\t\$\(UV\) lock\b", makefile, re.M)
    version = re.search(r"^UV_VERSION\s*:=\s*(\S+)$", makefile, re.M).group(1)
    assert "pip install $(UV_PIP_FLAGS) --target .uv uv==$(UV_VERSION)" in makefile
    assert version == _pins()["uv"], "the uv make installs is the one the dev extra locks"
    assert "UV_PYTHON_DOWNLOADS := never" in makefile  # offline: no interpreter downloads
    assert "constraints" not in makefile
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)  # via make
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^COPY pyproject\.toml uv\.lock ", dockerfile, re.M)
    assert f"pip install --no-cache-dir uv=={version}" in dockerfile
    assert re.findall(r"uv sync --locked [^\n]*--no-editable", dockerfile)
    assert "constraints" not in dockerfile and "pip install -c" not in dockerfile


def test_pytest_has_a_timeout_guard():
    options = _pyproject()["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 1800
    assert options["timeout_method"] == "signal"  # fixtures still stop their processes
    assert "pytest-timeout" in _requirements(
        _pyproject()["project"]["optional-dependencies"]["dev"]
    )


def test_the_middleware_imports_no_server():
    """Issue 9, item 3: `from offpath import OffPathCompaction` in a team's agent pulls in no
    server dependency (FastAPI, uvicorn, Flower, Celery until a job is published)."""
    import subprocess
    import sys

    code = (
        "import sys; from offpath import OffPathCompaction; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'fastapi', 'uvicorn', 'flower', 'starlette', 'celery', 'offpath.api'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_api_and_worker_import_from_any_directory():
    """An installed offpath is one import name: ``offpath api`` (``uvicorn offpath.api.app:app``)
    must start from any directory, not only from a checkout's root (where ``api/`` happened
    to be importable as a package of its own; a helper's run from /tmp found it failing)."""
    import subprocess
    import sys

    code = "import offpath.api.app, offpath.worker.tasks, offpath.cli.main; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


# --- deploy/nginx.conf: the proxy in front of the API (issue 34, item 4) --------------------------

#: nginx's size and time suffixes.
_SIZES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}
_TIMES = {"": 1, "s": 1, "m": 60, "h": 3600}


def nginx_blocks(text: str) -> list:
    """``text`` (an nginx config) as nested lists: a directive is ``[name, *args]``, a block
    ``[name, *args, [children]]``. Raises ``ValueError`` on what nginx would refuse to read
    (a directive without its ``;``, an unbalanced brace)."""
    tokens = re.findall(r'"[^"]*"|\'[^\']*\'|[{};]|[^\s{};]+', re.sub(r"#[^\n]*", "", text))
    stack: list[list] = [[]]
    words: list[str] = []
    for token in tokens:
        if token == ";":
            if not words:
                raise ValueError("an empty directive")
            stack[-1].append(words)
            words = []
        elif token == "{":
            block = [*words, []]
            stack[-1].append(block)
            stack.append(block[-1])
            words = []
        elif token == "}":
            if words or len(stack) == 1:
                raise ValueError(f"unbalanced '}}' after {words}")
            stack.pop()
        else:
            words.append(token.strip("\"'"))
    if words or len(stack) != 1:
        raise ValueError("the config ends inside a directive or a block")
    return stack[0]


def directives(block: list, name: str) -> list[list]:
    return [d for d in block if d[0] == name]


def one(block: list, name: str) -> list:
    (found,) = directives(block, name)
    return found


def size_of(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([kmg]?)", value.lower()).groups()
    return int(number) * _SIZES[unit]


def seconds_of(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([smh]?)", value.lower()).groups()
    return int(number) * _TIMES[unit]


def test_the_example_proxy_config_bounds_slow_clients_as_the_readme_says():
    """uvicorn never closes slow or silent connections: the README's production section
    names the proxy settings that do, and deploy/nginx.conf is that config. It parses, its
    body size is the API's MAX_REQUEST_BYTES, every client timeout is set and short, bodies
    are read whole before the API sees them, and the event streams pass unbuffered and
    outlive their keep-alive and their end."""
    from offpath.api.session_jobs import EVENTS_KEEPALIVE_S, EVENTS_MAX_S

    config = nginx_blocks((ROOT / "deploy" / "nginx.conf").read_text())
    http = one(config, "http")[-1]
    (server,) = [b[-1] for b in directives(http, "server")]
    defaults = Settings.model_fields
    assert size_of(one(server, "client_max_body_size")[1]) == defaults["max_request_bytes"].default
    for timeout in ("client_header_timeout", "client_body_timeout", "send_timeout"):
        assert 0 < seconds_of(one(server, timeout)[1]) <= 30, timeout
    assert 0 < seconds_of(one(server, "keepalive_timeout")[1]) <= 60
    assert one(server, "proxy_request_buffering")[1] == "on"
    zones = {
        a.removeprefix("zone=").split(":")[0]
        for z in directives(http, "limit_conn_zone")
        for a in z[1:]
        if a.startswith("zone=")
    }
    assert one(server, "limit_conn")[1] in zones
    assert ["proxy_set_header", "Host", "$host"] in server
    upstream = one(http, "upstream")
    locations = {tuple(b[1:-1]): b[-1] for b in directives(server, "location")}
    assert {one(b, "proxy_pass")[1] for b in locations.values()} == {f"http://{upstream[1]}"}
    ((pattern, events),) = [(w[1], b) for w, b in locations.items() if w[0] == "~"]
    assert re.search(pattern, "/sessions/s-1/events")
    assert not re.search(pattern, "/sessions/s-1/messages")
    assert one(events, "proxy_buffering")[1] == "off"
    assert seconds_of(one(events, "proxy_read_timeout")[1]) > max(EVENTS_KEEPALIVE_S, EVENTS_MAX_S)
    readme = (ROOT / "README.md").read_text()
    assert "deploy/nginx.conf" in readme
    for name in (
        "client_header_timeout",
        "client_body_timeout",
        "send_timeout",
        "client_max_body_size",
        "proxy_request_buffering",
    ):
        assert f"`{name}" in readme, name


def test_the_nginx_reader_refuses_what_nginx_would():
    assert nginx_blocks("a 1; b { c 2; }") == [["a", "1"], ["b", [["c", "2"]]]]
    for broken in ("a 1", "b { c 2;", "a 1; }", "b { c }"):
        try:
            nginx_blocks(broken)
        except ValueError:
            continue
        raise AssertionError(f"read {broken!r}")


def test_the_readmes_pins_export_is_quiet_and_writes_the_locked_versions(tmp_path):
    """Issue 35, item 6: the README's `uv export ... -o pins.txt` printed the whole 317-line
    file on the terminal as well. Run as the README writes it (in a copy of the lock), it
    prints nothing and the file pins the lock's versions."""
    import shutil
    import subprocess
    import sys

    (command,) = re.findall(r"`(uv export [^`]*-o pins\.txt)`", (ROOT / "README.md").read_text())
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(ROOT / name, tmp_path / name)
    uv = Path(sys.executable).parent / "uv"
    done = subprocess.run(
        [str(uv), *command.split()[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == "", (done.stdout[:300], done.stderr[:300])
    pins = (tmp_path / "pins.txt").read_text()
    assert f"langgraph=={importlib.metadata.version('langgraph')}" in pins
