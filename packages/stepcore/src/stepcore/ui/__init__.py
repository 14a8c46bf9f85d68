"""`stepcore ui`: a local, read-only web inspector for stored runs (needs the `ui` extra).

`create_app(store, store_url=...)` is the ASGI app over any `StepStore`; `serve(url)` opens the
store a URL names and serves it with uvicorn, as the `stepcore ui` command does.
"""

from __future__ import annotations

from stepcore.ui.routes import create_app
from stepcore.ui.server import DEFAULT_HOST, DEFAULT_PORT, UiError, serve

__all__ = ('DEFAULT_HOST', 'DEFAULT_PORT', 'UiError', 'create_app', 'serve')
