"""What a scripted investigation is made of: :class:`Step` (one model call's answer) and
:class:`Plan` (a run's steps), and the PromQL queries and tool-call helpers the plans share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Step:
    """One model call's answer: a text and the tool calls (name, args) it makes; a step
    without calls is the final answer of the run."""

    text: str
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()


@dataclass(frozen=True)
class Plan:
    """A scripted run: the request it answers, the keywords that select it, its steps
    (the last one is the final answer)."""

    key: str
    request: str
    keywords: tuple[str, ...]
    steps: tuple[Step, ...]


# ---------------------------------------------------------------- the investigation
P99 = (
    "histogram_quantile(0.99, sum by (le, pod) (rate(http_server_request_duration_seconds_bucket"
    '{namespace="shop-prod",service="checkout-api"}[1m])))'
)
CODES = 'sum by (code) (rate(http_server_requests_total{namespace="shop-prod",service="checkout-api"}[1m]))'
RPS = 'sum by (pod) (rate(http_server_requests_total{namespace="shop-prod",service="checkout-api"}[1m]))'
POOL = '{__name__=~"db_pool_(max|in_use|idle|waiting)",namespace="shop-prod",service="checkout-api",pool="orders"}'
SQL = (
    "histogram_quantile(0.99, sum by (le, pod) (rate(db_query_duration_seconds_bucket"
    '{namespace="shop-prod",service="checkout-api"}[1m])))'
)
REDIS = (
    "histogram_quantile(0.99, sum by (le, cmd) (rate(redis_client_command_duration_seconds_bucket"
    '{namespace="shop-prod",service="checkout-api"}[1m])))'
)
EDGE = (
    "histogram_quantile(0.99, sum by (le, ingress) (rate("
    'nginx_ingress_controller_request_duration_seconds_bucket{namespace="shop-prod"}[1m])))'
)
PG = 'sum by (application_name, state) (pg_stat_activity_count{datname="orders"})'
WAITING = (
    'max by (pod) (db_pool_waiting{namespace="shop-prod",service="checkout-api",pool="orders"})'
)
IN_USE = 'max by (pod) (db_pool_in_use{namespace="shop-prod",service="checkout-api",pool="orders"})'
RATIO = "service:http_server_requests_5xx:ratio_rate1m"
SELECTOR = "app.kubernetes.io/name=checkout-api"


def logs_call(**args: Any) -> tuple[str, dict[str, Any]]:
    """A plan step's ``get_logs`` call with these arguments."""
    return ("get_logs", args)


def metrics_call(**args: Any) -> tuple[str, dict[str, Any]]:
    """A plan step's ``query_metrics`` call with these arguments."""
    return ("query_metrics", args)
