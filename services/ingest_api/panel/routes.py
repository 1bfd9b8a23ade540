"""The panel at ``/panel``: static HTML/CSS/JS that talks only to the public ``/v1`` API.

The files under ``static/`` are read once when the routes are added and served from
memory by name, so no request path ever reaches the file system. Pages carry a strict
Content-Security-Policy: scripts, styles and API calls from this origin only.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).parent / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def load_static(directory: Path = STATIC_DIR) -> dict[str, tuple[bytes, str]]:
    """Every servable file of ``directory`` by name: ``{name: (body, content type)}``."""
    return {
        path.name: (path.read_bytes(), CONTENT_TYPES[path.suffix])
        for path in sorted(directory.iterdir())
        if path.is_file() and path.suffix in CONTENT_TYPES
    }


def add_panel_routes(app: web.Application) -> None:
    """Serve ``/panel`` (the page) and ``/panel/static/{name}`` (its assets)."""
    files = load_static()
    page_body, page_type = files["index.html"]

    async def page(_: web.Request) -> web.Response:
        return _response(page_body, page_type)

    async def asset(request: web.Request) -> web.Response:
        found = files.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        return _response(*found)

    app.router.add_get("/panel", page)
    app.router.add_get("/panel/", page)
    app.router.add_get("/panel/static/{name}", asset)


def _response(body: bytes, content_type: str) -> web.Response:
    response = web.Response(body=body, headers=SECURITY_HEADERS)
    response.headers["Content-Type"] = content_type
    return response
