"""The product type-checks clean: ``mypy`` (pinned in uv.lock, configured in pyproject.toml's
``[tool.mypy]``) on the ``offpath`` package as it is installed, ``offpath.api`` and
``offpath.worker`` included, reports no error. CI runs only the tests, so the check is one.

The repository keeps ``api/`` and ``worker/`` at its top level and setuptools maps them under
``offpath`` (pyproject.toml's ``package-dir``); the editable install does that with an import
hook, which a type checker does not run. So the check runs mypy on a tree of symbolic links
laid out as the installed package (:func:`installed_tree`), at a fixed place under
``.mypy_cache/`` so that mypy's cache (beside it) stays valid from one run to the next.

``make lint`` runs this test too."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".mypy_cache"


def installed_tree(root: Path, into: Path) -> Path:
    """A directory ``into`` holding ``offpath/`` as setuptools installs it (each package of
    pyproject.toml's ``packages`` at its ``package-dir`` place), made of symbolic links to
    ``root``'s files: the directory to run mypy in."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped: dict[str, str] = config.get("package-dir", {})
    for package in config["packages"]:
        source = root / package.replace(".", "/")
        for name, there in mapped.items():
            if package == name or package.startswith(name + "."):
                source = root / there / package[len(name) + 1 :].replace(".", "/")
        target = into / package.replace(".", "/")
        target.mkdir(parents=True, exist_ok=True)
        for module in source.glob("*.py"):
            link = target / module.name
            if not link.is_symlink() or link.resolve() != module.resolve():
                tmp = link.with_suffix(f".{os.getpid()}.tmp")
                tmp.unlink(missing_ok=True)
                tmp.symlink_to(module)
                tmp.replace(link)  # atomic: a concurrent run sees one or the other
    for link in into.rglob("*.py"):  # a module since removed or renamed
        if link.is_symlink() and not link.exists():
            link.unlink()
    return into


def run_mypy() -> subprocess.CompletedProcess[str]:
    """mypy on the installed ``offpath`` package, with pyproject.toml's configuration."""
    tree = installed_tree(ROOT, CACHE / "src")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(CACHE / "product"),
            "-p",
            "offpath",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_product_type_checks_clean() -> None:
    done = run_mypy()
    assert done.returncode == 0, done.stdout + done.stderr


if __name__ == "__main__":  # make lint
    done = run_mypy()
    print(done.stdout + done.stderr, end="")
    sys.exit(done.returncode)
