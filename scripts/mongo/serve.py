"""Run mongoeco's MongoDB wire-protocol server on loopback until SIGTERM/SIGINT.

Used by `scripts/mongo-server.sh`; runs inside the server's own Python >= 3.13 virtualenv.

    python serve.py --port-file PATH [--host 127.0.0.1] [--port 0] [--dialect 8.0]
    python serve.py --ping URL [--timeout 30]

`--port 0` lets the kernel pick a free port; the bound port is written to `--port-file` once the
server accepts connections. `--ping` waits until a server at URL answers `ping` (exit 0) or the
timeout passes (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path


async def serve(host: str, port: int, port_file: str, dialect: str) -> None:
    from mongoeco.wire import AsyncMongoEcoProxyServer

    server = AsyncMongoEcoProxyServer(host=host, port=port, mongodb_dialect=dialect)
    address = await server.start()
    tmp = Path(f'{port_file}.tmp')
    tmp.write_text(f'{address.port}\n', encoding='utf-8')
    tmp.replace(port_file)
    print(f'mongoeco wire server listening on {address.host}:{address.port} (dialect {dialect})', flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()
    print('mongoeco wire server stopped', flush=True)


def ping(url: str, timeout: float) -> int:
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        client: MongoClient[dict[str, object]] = MongoClient(url, serverSelectionTimeoutMS=1000)
        try:
            client.admin.command('ping')
            return 0
        except PyMongoError as error:
            last = error
        finally:
            client.close()
        time.sleep(0.2)
    print(f'no answer to ping from {url} within {timeout:g} s: {last}', file=sys.stderr)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, default=0)
    parser.add_argument('--port-file')
    parser.add_argument('--dialect', default='8.0', help='MongoDB version whose behaviour mongoeco follows')
    parser.add_argument('--ping', metavar='URL')
    parser.add_argument('--timeout', type=float, default=30.0)
    args = parser.parse_args()
    if args.ping:
        return ping(args.ping, args.timeout)
    if not args.port_file:
        parser.error('--port-file is required to serve')
    asyncio.run(serve(args.host, args.port, args.port_file, args.dialect))
    return 0


if __name__ == '__main__':
    sys.exit(main())
