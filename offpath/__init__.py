"""offpath: conversation compaction off the request path.

``from offpath import OffPathCompaction`` gives the LangChain agent middleware; the
rest lives under this one namespace: ``offpath.compaction`` (the pure core),
``offpath.service`` (I/O shared by the API, the worker and the middleware),
``offpath.api``, ``offpath.worker`` and ``offpath.cli``. Importing this package loads
nothing until a name is used, and the middleware pulls in no server (FastAPI,
uvicorn, Flower).
"""

from __future__ import annotations

from typing import Any

__all__ = ["OffPathCompaction"]


def __getattr__(name: str) -> Any:
    if name == "OffPathCompaction":
        from offpath.middleware import OffPathCompaction

        return OffPathCompaction
    raise AttributeError(f"module 'offpath' has no attribute {name!r}")
