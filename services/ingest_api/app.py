"""Building the ingest-api aiohttp application from its dependencies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from relay_batches.health import add_health_routes
from relay_batches.services.ingest_api.deps import DEPS, ApiDeps
from relay_batches.services.ingest_api.edge.middleware import (
    ResolveKey,
    auth_middleware,
    error_middleware,
    log_stream_aborts_once,
    schema_middleware,
)
from relay_batches.services.ingest_api.openapi import add_openapi_route
from relay_batches.services.ingest_api.panel.routes import add_panel_routes
from relay_batches.services.ingest_api.surfaces.anthropic.batches import add_anthropic_routes
from relay_batches.services.ingest_api.surfaces.native.aliases import add_model_routes
from relay_batches.services.ingest_api.surfaces.native.batches import add_batch_routes
from relay_batches.services.ingest_api.surfaces.native.deliveries import add_delivery_routes
from relay_batches.services.ingest_api.surfaces.native.upload import add_upload_routes
from relay_batches.services.ingest_api.surfaces.openai.openapi import add_openai_routes

BODY_SLACK = 1024


def build_app(
    deps: ApiDeps,
    resolve_key: ResolveKey,
    ready: Callable[[], Awaitable[bool]],
    schema_current: Callable[[], Awaitable[bool]] | None = None,
) -> web.Application:
    """The public API with its error, schema and auth middleware and the probes
    ``/healthz`` and ``/readyz`` (without ``schema_current``, the schema is taken to be
    current); ``/metrics`` is served on the health port, not here."""
    log_stream_aborts_once()
    middlewares: list[Middleware] = [error_middleware]
    if schema_current is not None:
        middlewares.append(schema_middleware(schema_current))
    middlewares.append(auth_middleware(resolve_key))
    app = web.Application(
        middlewares=middlewares,
        client_max_size=deps.max_body_bytes + BODY_SLACK,
    )
    app[DEPS] = deps
    add_batch_routes(app)
    add_delivery_routes(app)
    add_upload_routes(app)
    add_openai_routes(app)
    add_anthropic_routes(app)
    add_model_routes(app)
    add_panel_routes(app)
    add_health_routes(app, ready, metrics=False)  # /metrics: the health port only
    add_openapi_route(app)
    return app
