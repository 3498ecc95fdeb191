"""The ``offpath`` command: demo, replay, stats, and starting the API, a worker or Flower.

Errors are one line on stderr and a non-zero exit: 1 for bad input or a failed
request, 2 for bad settings.

The entry point (``[project.scripts] offpath = "offpath.cli.main:app"``, and
``python -m offpath.cli.main``). The commands are registered on :mod:`offpath.cli.common`'s
``app`` by the modules imported here, in the order ``offpath --help`` lists them:
:mod:`~offpath.cli.conversations` (replay, stats, sessions, show), :mod:`~offpath.cli.jobs`
(compact, revert), :mod:`~offpath.cli.processes` (api, worker, flower, beat, migrate),
:mod:`~offpath.cli.keys` (the ``keys`` sub-app) and :mod:`~offpath.cli.demo_command` (demo).
"""

from __future__ import annotations

import subprocess

from offpath.cli.common import app, fail

# the command modules register their commands on `app` as they are imported: in this
# order, the order `offpath --help` lists them in
# isort: off
import offpath.cli.conversations  # noqa: F401
import offpath.cli.jobs  # noqa: F401
import offpath.cli.processes  # noqa: F401
import offpath.cli.keys  # noqa: F401
import offpath.cli.demo_command  # noqa: F401
# isort: on

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console script
    try:
        app()
    except subprocess.CalledProcessError as exc:
        fail(str(exc))


if __name__ == "__main__":  # pragma: no cover
    app()
