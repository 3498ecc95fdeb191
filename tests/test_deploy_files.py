"""docker-compose.yml, the Dockerfile and .env.example stay in step with the code (issue 4).
Docker does not run here: the files are parsed and checked against the project."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from offpath.cli.main import app
from offpath.compaction.settings import Settings

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
    for name in ("pyproject.toml", "README.md", "offpath", "api", "worker"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"offpath"}, tops
    for path in (
        "offpath/api/app.py",
        "offpath/worker/tasks.py",
        "offpath/middleware.py",
        "offpath/service/migrations/env.py",
        "offpath/service/migrations/script.py.mako",
        "offpath/service/migrations/versions/0001_usage_tables.py",
    ):
        assert path in names, path


# --- dependencies: declared with bounds, pinned, installed from the pins (issue 8, item 19) --

FIRST_PARTY = ("offpath", "api", "worker", "bench", "examples")
RUNTIME = ("offpath", "api", "worker")  # what the wheel ships; the rest runs from the checkout


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
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not name==version"
            pins[_canonical(name)] = version
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


def _distribution(module: str) -> str:
    """The installed distribution that provides ``module`` (a namespace package such as
    ``langgraph`` spans several: the one holding the module's file)."""
    import importlib.metadata
    import importlib.util

    top = module.split(".")[0]
    candidates = importlib.metadata.packages_distributions().get(top)
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
    pins = _pins()
    local = _local_modules()
    problems = []
    for folder in (*FIRST_PARTY, "tests"):
        declared = runtime if folder in RUNTIME else {**runtime, **dev}
        for module in sorted(_imports(folder)):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in local or top == "__future__":
                continue
            dist = _distribution(module)
            if dist not in declared:
                where = "dependencies" if folder in RUNTIME else "dependencies or the dev extras"
                problems.append(f"{folder} imports {module} ({dist}), not in {where}")
    for name, spec in {**runtime, **dev}.items():
        if not re.search(r"(>=|~=|==)", spec) or not re.search(r"(<|~=|==)", spec):
            problems.append(f"{name}{spec or ' (no version)'}: needs a lower and an upper bound")
        if name not in pins:
            problems.append(f"{name} is not pinned in constraints.txt (run `make lock`)")
        elif importlib.metadata.version(name) != pins[name]:
            problems.append(
                f"{name} {importlib.metadata.version(name)} is installed, constraints.txt pins "
                f"{pins[name]} (run `make install`)"
            )
    assert not problems, "\n".join(problems)


def test_makefile_ci_and_dockerfile_install_from_the_constraints_file():
    header = (ROOT / "constraints.txt").read_text().splitlines()[0:5]
    assert any("make lock" in line for line in header), "constraints.txt must say how it was made"
    makefile = (ROOT / "Makefile").read_text()
    stamp = re.search(r"^\$\(BIN\)/\.installed:(.*)$", makefile, re.M)
    assert stamp and "constraints.txt" in stamp.group(1).split(), "reinstall when the pins change"
    assert "pip install --disable-pip-version-check -c constraints.txt -e '.[dev]'" in makefile
    lock = makefile[makefile.index("\nlock:") :]
    assert "venv" in lock and "pip freeze --disable-pip-version-check --exclude-editable" in lock
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # CI installs through the Makefile
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^COPY .*constraints\.txt", dockerfile, re.M)
    assert "pip install -c constraints.txt ." in dockerfile


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
