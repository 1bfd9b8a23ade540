"""Building the ingest-api aiohttp application from its dependencies.

The root application serves what needs no key (the probes, ``/openapi.json``, the
panel) and mounts each surface as a sub-application at its prefix: the native API at
``/v1``, the OpenAI-compatible one at ``/openai/v1``, the Anthropic-compatible one at
``/anthropic/v1``. Each surface has its own middlewares: its error object, the schema
gate and key auth; the root's are what is truly global (the request id, timing, and the
native error object for its own routes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from relay_batches.health import add_health_routes
from relay_batches.services.ingest_api.deps import DEPS, ApiDeps
from relay_batches.services.ingest_api.edge.middleware import (
    ErrorShape,
    ResolveKey,
    auth_middleware,
    error_middleware,
    log_stream_aborts_once,
    schema_middleware,
    timing_middleware,
)
from relay_batches.services.ingest_api.edge.request_id import (
    request_id_middleware,
    send_request_id,
)
from relay_batches.services.ingest_api.openapi import add_openapi_route
from relay_batches.services.ingest_api.panel.routes import add_panel_routes
from relay_batches.services.ingest_api.surfaces import anthropic, native, openai
from relay_batches.services.ingest_api.surfaces.anthropic import models as anthropic_models
from relay_batches.services.ingest_api.surfaces.anthropic.batches import add_anthropic_routes
from relay_batches.services.ingest_api.surfaces.anthropic.errors import anthropic_error
from relay_batches.services.ingest_api.surfaces.native.activity import add_activity_routes
from relay_batches.services.ingest_api.surfaces.native.aliases import add_model_routes
from relay_batches.services.ingest_api.surfaces.native.batches import add_batch_routes
from relay_batches.services.ingest_api.surfaces.native.deliveries import add_delivery_routes
from relay_batches.services.ingest_api.surfaces.native.errors import native_error
from relay_batches.services.ingest_api.surfaces.native.estimate import add_estimate_routes
from relay_batches.services.ingest_api.surfaces.native.upload import add_upload_routes
from relay_batches.services.ingest_api.surfaces.openai import batches as openai_batches
from relay_batches.services.ingest_api.surfaces.openai import files as openai_files
from relay_batches.services.ingest_api.surfaces.openai import models as openai_models
from relay_batches.services.ingest_api.surfaces.openai.errors import openai_error
from relay_batches.services.ingest_api.webhook_endpoints import add_webhook_endpoint_routes

BODY_SLACK = 1024
AddRoutes = Callable[[web.Application], None]
# Every surface: where it is mounted, its error object, the routes it serves.
SURFACES: tuple[tuple[str, ErrorShape, tuple[AddRoutes, ...]], ...] = (
    (
        native.PREFIX,
        native_error,
        (
            add_estimate_routes,
            add_batch_routes,
            add_delivery_routes,
            add_activity_routes,
            add_upload_routes,
            add_model_routes,
            add_webhook_endpoint_routes,
        ),
    ),
    (
        openai.PREFIX,
        openai_error,
        (
            openai_files.add_file_routes,
            openai_batches.add_batch_routes,
            add_webhook_endpoint_routes,
            openai_models.add_model_routes,
        ),
    ),
    (anthropic.PREFIX, anthropic_error, (add_anthropic_routes, anthropic_models.add_model_routes)),
)
# The paths that need a key: everything under a surface's prefix.
AUTHENTICATED_PREFIXES = tuple(f"{prefix}/" for prefix, _, _ in SURFACES)


def build_app(
    deps: ApiDeps,
    resolve_key: ResolveKey,
    ready: Callable[[], Awaitable[bool]],
    schema_current: Callable[[], Awaitable[bool]] | None = None,
) -> web.Application:
    """The public API: every surface mounted with its error, schema and auth middleware,
    the panel (``GET /`` redirects to it), and the probes ``/healthz`` and ``/readyz``
    (without ``schema_current``, the schema is taken to be current); ``/metrics`` is
    served on the health port, not here."""
    log_stream_aborts_once()
    app = web.Application(
        middlewares=[request_id_middleware, timing_middleware, error_middleware(native_error)],
        client_max_size=deps.max_body_bytes + BODY_SLACK,  # the root's applies to all
    )
    app[DEPS] = deps
    app.on_response_prepare.append(send_request_id)
    for prefix, shape, routes in SURFACES:
        app.add_subapp(prefix, surface_app(deps, shape, resolve_key, schema_current, routes))
    add_panel_routes(app)
    app.router.add_get("/", to_panel)
    add_health_routes(app, ready)  # /metrics: the health port only
    add_openapi_route(app)
    return app


async def to_panel(request: web.Request) -> web.Response:
    """``GET /``: a browser opening the API's address lands on the panel."""
    raise web.HTTPFound("/panel")


def surface_app(
    deps: ApiDeps,
    shape: ErrorShape,
    resolve_key: ResolveKey,
    schema_current: Callable[[], Awaitable[bool]] | None,
    routes: Sequence[AddRoutes],
) -> web.Application:
    """One surface as a sub-application: failures answered in ``shape``, 503 while the
    schema is behind, a Relay API key required on every request, then ``routes``."""
    middlewares: list[Middleware] = [error_middleware(shape)]
    if schema_current is not None:
        middlewares.append(schema_middleware(schema_current, shape))
    middlewares.append(auth_middleware(resolve_key))
    surface = web.Application(middlewares=middlewares)
    surface[DEPS] = deps
    for add in routes:
        add(surface)
    return surface
