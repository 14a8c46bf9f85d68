"""`stepcore ui`: open the store, bind the port, serve the app with uvicorn until Ctrl+C."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import webbrowser
from collections.abc import Callable
from typing import Any

import uvicorn

from stepcore.media.protocol import MediaStore
from stepcore.plugins.registry import get_registry, open_store
from stepcore.store.step_store import StepStore
from stepcore.ui.routes import create_app
from stepcore.ui.snippets import display_url

__all__ = ('DEFAULT_HOST', 'DEFAULT_PORT', 'UiError', 'bind', 'open_media', 'serve')

DEFAULT_HOST = '127.0.0.1'
DEFAULT_PORT = 8765


class UiError(Exception):
    """The inspector cannot start; the message says why and what to do."""


def open_media(url: str) -> tuple[MediaStore, str]:
    """The media store a `KEY://?option=value` URL names, and the Python expression that builds it.

    For example `disk://?directory=/srv/media` or `s3://?bucket=runs&endpoint_url=...`.
    """
    try:
        backend, options = get_registry().for_url('media', url)
        store: MediaStore = backend.create(**options)
    except (ValueError, TypeError) as exc:
        raise UiError(f'--media {url!r}: {exc}') from None
    args = ''.join(f', {name}={str(value)!r}' for name, value in options.items())
    return store, f'media_from_spec({backend.info.key!r}{args})'


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` (port 0: any free port); `UiError` saying what to do when it cannot."""
    if not 0 <= port <= 65535:
        raise UiError(f'--port {port} is not a TCP port: use 1-65535, or 0 for any free port')
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UiError(f'--host {host!r} does not resolve ({exc.strerror}): use an address such as 127.0.0.1') from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        hint = 'pass another --port, or --port 0 for any free one' if port else 'check --host'
        raise UiError(f'cannot listen on {host}:{port}: {exc.strerror or exc}; {hint}') from None
    sock.setblocking(False)
    return sock


def is_loopback(sock: socket.socket) -> bool:
    address: Any = sock.getsockname()[0]
    try:
        return ipaddress.ip_address(str(address).split('%')[0]).is_loopback
    except ValueError:
        return False


def _url_for(sock: socket.socket) -> str:
    address, port = sock.getsockname()[:2]
    host = f'[{address}]' if ':' in str(address) else str(address)
    if str(address) in ('0.0.0.0', '::'):
        host = socket.gethostname()
    return f'http://{host}:{port}/'


def serve(
    store_url: str,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    open_browser: bool = False,
    media_url: str | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """Serve the inspector for `store_url` until interrupted."""
    media: MediaStore | None = None
    media_hint: str | None = None
    if media_url:
        media, media_hint = open_media(media_url)
    sock = bind(host, port)
    loopback = is_loopback(sock)
    url = _url_for(sock)

    async def main() -> None:
        options: dict[str, Any] = {} if media is None else {'media_store': media}
        store: StepStore = open_store(store_url, must_exist=True, **options)
        app = create_app(store, store_url=store_url, media_hint=media_hint, loopback_only=loopback)
        config = uvicorn.Config(app, log_level='warning', access_log=False, lifespan='on')
        server = uvicorn.Server(config)
        say(f'stepcore ui: reading {display_url(store_url)} at {url} (read-only; Ctrl+C to stop)')
        if not loopback:
            say(
                f'warning: listening on {host}, not on loopback: anyone who can reach this address can read '
                'every run in the store'
            )
        if open_browser:
            threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
        try:
            await server.serve(sockets=[sock])
        finally:
            await store.aclose()

    try:
        asyncio.run(main())
    finally:
        sock.close()
