"""A read-only SRE toolset for the demo agent: logs, metrics, recent deploys, pod status.

``SRE_TOOLS`` (the default of ``AGENT_TOOLS``) is four LangChain tools that answer
from the fixture files of ``examples/sre/`` (written by
``examples/make_sre_fixtures.py``): the cluster prod-eu-1 at 2025-03-11 14:30 UTC,
25 minutes into the checkout-api latency incident of the example investigation.

* :func:`get_logs` -- container log lines of a service (or some of its pods), by time
  window and regex, newest last.
* :func:`query_metrics` -- a small PromQL matcher over the per-minute fixture series:
  metric name (or one of the raw names a recording rule answers for), label matchers,
  one ``sum|avg|max|min|count [by|without (...)]`` aggregation; a text table.
* :func:`recent_deploys` -- helm history of a release with each revision's pipeline and
  changes (the config diff included).
* :func:`pod_status` -- ``kubectl get pods -o wide`` with a label selector, and why pods
  are not ready or restarted.

Every answer is text an SRE would read, at most :data:`MAX_CHARS` characters (what was cut
is said in the answer). Bad arguments, unknown services or pods and missing fixtures give
an answer starting with ``error:``; the tools never raise. (An argument of the wrong type,
``limit="lots"``, fails the tool's schema before it runs; the agent's tool node turns that
into an error ``ToolMessage`` too.)

The fixture folder is looked up at each call: ``DEMO_FIXTURES_DIR`` if set, else the copy
installed with the package (``offpath/demo/sre``: the wheel ships ``examples/sre`` there, so a
non-editable install such as the Docker image's has them; issue 21, item 7), else
``examples/sre`` of the repository checkout this package lives in (an editable install).

This package holds the four tools and ``SRE_TOOLS``; what they do is in :mod:`.fixtures`
(finding and reading the fixtures, errors, times, the answer cap), :mod:`.logs`,
:mod:`.metrics` and :mod:`.cluster` (deploys and pods).
"""

from __future__ import annotations

from langchain_core.tools import BaseTool, tool

from offpath.agent.sre_tools.cluster import _pod_status, _recent_deploys
from offpath.agent.sre_tools.fixtures import (
    DEFAULT_FIXTURES,
    MAX_CHARS,
    PACKAGED_FIXTURES,
    ToolError,
    fixtures_dir,
)
from offpath.agent.sre_tools.logs import MAX_LOG_LIMIT, _get_logs
from offpath.agent.sre_tools.metrics import LOOKBACK_S, MAX_POINTS, _query_metrics

__all__ = [
    "DEFAULT_FIXTURES",
    "LOOKBACK_S",
    "MAX_CHARS",
    "MAX_LOG_LIMIT",
    "MAX_POINTS",
    "PACKAGED_FIXTURES",
    "SRE_TOOLS",
    "ToolError",
    "fixtures_dir",
    "get_logs",
    "pod_status",
    "query_metrics",
    "recent_deploys",
]


# ---------------------------------------------------------------- the tools
@tool(parse_docstring=True)
def get_logs(
    service: str, pod: str = "", since: str = "", until: str = "", grep: str = "", limit: int = 200
) -> str:
    """Read container logs of a service (all its pods, merged by time, or some of them).

    Times are UTC. Lines start with their timestamp; with several pods each line is prefixed
    with [pod]. The answer holds the most recent matching lines (at most `limit`, and at most
    8,000 characters) and says how many matched.

    Args:
        service: Service name, e.g. checkout-api, fulfillment-api, orders-worker, orders-db, cart-cache, ingress-nginx.
        pod: A pod name or part of one (e.g. 6f7d9-2); empty for all pods of the service.
        since: Start of the window: HH:MM[:SS], ISO 8601, or a duration back from now such as 30m; empty for no start.
        until: End of the window (exclusive), same forms; empty for now.
        grep: Case-insensitive regular expression the lines must contain, e.g. "ERROR|WARN" or "status=503".
        limit: Most lines to return (the latest ones), 1-2000.
    """
    return _get_logs(service, pod, since, until, grep, limit)


@tool(parse_docstring=True)
def query_metrics(query: str, start: str = "", end: str = "", step: str = "1m") -> str:
    """Query Prometheus metrics (per-minute series) and get a text table.

    The query is matched against the recorded series by metric name (or the raw name a
    recording rule answers for, e.g. http_server_request_duration_seconds_bucket) and label
    matchers ({service="checkout-api", pod=~"checkout-api-6f7d9-.*"}); one outer
    sum/avg/max/min/count with by/without is evaluated. Functions such as rate or
    histogram_quantile are already applied by the recording rules. An empty or unknown
    query lists the available metrics.

    Args:
        query: PromQL expression, e.g. histogram_quantile(0.99, sum by (le, pod) (rate(http_server_request_duration_seconds_bucket{service="checkout-api"}[1m]))).
        start: Start of a range query (HH:MM, ISO 8601 or e.g. 30m for 30 minutes ago); empty for an instant query.
        end: End of the range, or the time of an instant query; empty for now.
        step: Resolution of a range query, e.g. 1m or 5m.
    """
    return _query_metrics(query, start, end, step)


@tool(parse_docstring=True)
def recent_deploys(service: str, limit: int = 10) -> str:
    """Show the recent deploys (helm history) of a service, with each revision's CI pipeline, canary result, changes and config diff.

    Args:
        service: Release name (e.g. checkout-api), or "all" for the latest deploys across the cluster.
        limit: How many revisions (or, with "all", deploys) to show, most recent first, 1-50.
    """
    return _recent_deploys(service, limit)


@tool(parse_docstring=True)
def pod_status(namespace: str = "shop-prod", selector: str = "") -> str:
    """List pods (kubectl get pods -o wide): readiness, status, restarts, age, IP, node; and why pods are not ready or restarted.

    Args:
        namespace: Namespace (shop-prod, data, ingress-nginx), or "all".
        selector: Label selector, e.g. app=checkout-api or app.kubernetes.io/name in (orders-db,cart-cache); empty for all pods.
    """
    return _pod_status(namespace, selector)


#: The demo agent's tools (``AGENT_TOOLS=offpath.agent.sre_tools:SRE_TOOLS``): all read-only.
SRE_TOOLS: list[BaseTool] = [get_logs, query_metrics, recent_deploys, pod_status]
