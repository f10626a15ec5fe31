"""httpcore's network I/O on asyncio's own streams, for ``system=http``'s clients.

httpcore (under httpx) does its socket reads and writes through a *network backend*; its default
goes through anyio, which wraps every read and write in a cancel scope of its own (a task lookup,
a library check, a shielded checkpoint): about a quarter of the client's CPU per query at
``system.concurrency`` 64 (benchmarks/RESULTS.md, issue 28). :class:`AsyncioBackend` is the same
contract on ``asyncio.open_connection`` with ``asyncio.timeout``: the same timeouts, the same
httpcore exceptions (which httpx turns into its own: ``ConnectError``, ``ReadTimeout``, ...), TLS
through ``StreamWriter.start_tls`` with the client's TLS context. Everything above it (the
connection pool, HTTP/1.1 with h11, httpx's client) is httpx's, unchanged.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One TCP (or TLS) connection as httpcore reads and writes it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(f"no data within {timeout} s") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        transport = self._writer.transport
        try:
            if transport.is_closing():
                raise ConnectionResetError("the connection is closed")
            self._writer.write(buffer)
            if transport.get_write_buffer_size():  # not all sent at once: wait for the socket
                async with asyncio.timeout(timeout):
                    await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(f"could not send within {timeout} s") from exc
        except (OSError, RuntimeError) as exc:  # RuntimeError: written after the connection closed
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        """Closed at once, as anyio closes its streams: a TLS connection does not wait for the
        server's close_notify, and the socket is let go in the event loop's next rounds (not after
        a loop that ends first, which would leave it open)."""
        transport = self._writer.transport
        transport.close()
        await asyncio.sleep(0)
        transport.abort()
        await asyncio.sleep(0)

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as exc:
            await self.aclose()
            raise httpcore.ConnectTimeout(f"no TLS handshake within {timeout} s") from exc
        except OSError as exc:  # ssl.SSLError (an untrusted certificate) is an OSError
            await self.aclose()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        if info == "is_readable":  # the pool asks before reusing an idle connection: closed by the server?
            return self._readable()
        return None

    def _readable(self) -> bool:
        """Data or the end of the connection is waiting (an idle keep-alive connection that is
        readable was closed by the server, or sent something unasked: it is not reused)."""
        if self._reader.at_eof() or self._writer.is_closing():
            return True
        sock = self._writer.get_extra_info("socket")
        if sock is None or sock.fileno() < 0:
            return True
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Connections for httpcore's pool, on asyncio's streams (TCP_NODELAY, as asyncio sets it)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = None if local_address is None else (local_address, 0)
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, local_addr=local)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"no connection within {timeout} s") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"no connection within {timeout} s") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def asyncio_transport(verify: ssl.SSLContext, limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """httpx's transport (its connection pool, exceptions and TLS settings) doing its network I/O
    with :class:`AsyncioBackend`. httpcore takes a network backend as a documented option, which
    httpx 0.28 does not pass on: it is set on the transport's pool before its first connection
    (httpx is pinned; tests/test_http_system.py covers timeouts, refused connections and TLS)."""
    transport = httpx.AsyncHTTPTransport(verify=verify, limits=limits)
    transport._pool._network_backend = AsyncioBackend()
    return transport
