"""offpath: conversation compaction off the request path.

``from offpath import OffPathCompaction`` gives the LangChain agent middleware; the
rest lives under this one namespace, each layer importing only those before it:
``offpath.compaction`` (the pure core), ``offpath.stores`` (tables and their queries),
``offpath.coordination`` (locks, leases' use, the hook, applying a compaction),
``offpath.agent`` (the middleware, ``recall``, the API's agent graph), then
``offpath.worker``, ``offpath.api`` and ``offpath.cli``. Importing this package loads
nothing until a name is used, and the middleware pulls in no server (FastAPI,
uvicorn, Flower).
"""

from __future__ import annotations

from typing import Any

__all__ = ["OffPathCompaction"]


def __getattr__(name: str) -> Any:
    if name == "OffPathCompaction":
        from offpath.agent.middleware.hooks import OffPathCompaction

        return OffPathCompaction
    raise AttributeError(f"module 'offpath' has no attribute {name!r}")
