"""What every response of the inspector goes through: its security headers, and refusing other Host names.

The Content-Security-Policy keeps the browser from running or loading anything but this app's own
script, styles and media; with `loopback_only`, a request naming a host other than a loopback one is
refused, so a web page elsewhere cannot reach the server through a DNS name it points at 127.0.0.1.
"""

from __future__ import annotations

import ipaddress

from starlette.datastructures import MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ('LOOPBACK_HOSTS', 'SECURITY_HEADERS', 'Guard')

SECURITY_HEADERS = {
    'content-security-policy': (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; media-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    'x-content-type-options': 'nosniff',
    'x-frame-options': 'DENY',
    'referrer-policy': 'no-referrer',
    'cross-origin-resource-policy': 'same-origin',
}
"""Sent with every response."""

LOOPBACK_HOSTS = ('localhost', '127.0.0.1', '::1')


def _host_of(header: str) -> str:
    """The host name of a Host header, without its port (`[::1]:8765` -> `::1`)."""
    if header.startswith('['):
        return header[1 : header.find(']')] if ']' in header else header
    return header.rsplit(':', 1)[0] if header.count(':') == 1 else header


def _is_loopback_name(host: str) -> bool:
    if host.lower() == 'localhost' or host.lower().endswith('.localhost'):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Guard:
    """Adds the security headers to every response; with `loopback_only`, refuses other Host names.

    The Host check keeps a web page elsewhere from reaching this server through a DNS name that it
    points at 127.0.0.1 (DNS rebinding).
    """

    def __init__(self, app: ASGIApp, *, loopback_only: bool) -> None:
        self.app = app
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope['type'] != 'http':
            await self.app(scope, receive, send)
            return
        if self.loopback_only:
            host = ''
            for name, value in scope.get('headers', []):
                if name == b'host':
                    host = value.decode('latin-1')
            if not _is_loopback_name(_host_of(host)):
                response = Response(
                    f'Host {host!r} refused: this server only answers to {", ".join(LOOPBACK_HOSTS)}. '
                    'Start it with --host to serve other names.',
                    status_code=421,
                    media_type='text/plain',
                )
                await response(scope, receive, self._with_headers(send))
                return
        await self.app(scope, receive, self._with_headers(send))

    @staticmethod
    def _with_headers(send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if message['type'] == 'http.response.start':
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
                if 'cache-control' not in headers:
                    headers['cache-control'] = 'no-store'
            await send(message)

        return wrapped
