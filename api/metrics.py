"""``GET /metrics``: the API process's Prometheus metrics (:mod:`offpath.metrics`),
with the queue depth and the open jobs read at scrape time.

It needs an admin key (``Authorization: Bearer``; Prometheus sends one with
``authorization: {credentials_file: ...}``, as ``deploy/prometheus.yml`` does), unless
``METRICS_PUBLIC=true`` (for a scraper that cannot send one, on a private network). Not in
the OpenAPI document: it answers Prometheus's text format, not JSON.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from offpath.coordination.exporter import register_queue_collector

from .deps import bearer, principal, rt_of

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
def metrics(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None,
) -> Response:
    """The metrics in Prometheus's text format; 401 without a key, 403 for a key that is not
    an admin's (unless ``METRICS_PUBLIC=true``)."""
    rt = rt_of(request)
    if not rt.settings.metrics_public and not principal(request, credentials).admin:
        raise HTTPException(
            status_code=403,
            detail="/metrics needs an admin key (`offpath keys create --tenant NAME --admin`), "
            "or METRICS_PUBLIC=true",
        )
    register_queue_collector(rt)  # once per process; it reads the stores at each scrape
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
