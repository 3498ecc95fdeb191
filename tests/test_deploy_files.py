"""docker-compose.yml, the Dockerfile and .env.example stay in step with the code (issue 4).
Docker does not run here: the files are parsed and checked against the project."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from cli.main import app
from compaction.settings import Settings

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
        assert svc["build"] == "." and svc["env_file"] == ".env"
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


def test_dockerfile_copies_every_package_and_installs_the_console_script():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("compaction", "service", "api", "worker", "cli"):
        assert f"COPY {package}" in dockerfile, package
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'offpath = "cli.main:app"' in pyproject
    assert '"migrations/versions/*.py"' in pyproject, "the migrations must ship in the wheel"
