"""workers/http.py against real sockets: a scripted HTTP server on loopback that answers each
request with the bytes a test gives it (keep-alive, chunked, end-of-connection bodies, servers
that hang up, stall or garble)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from hallulog.workers.http import HTTPConnectionError, HTTPPool

Reply = Callable[[int, bytes, asyncio.StreamWriter], Awaitable[bool]]
"""(request number, request body, writer) → keep the connection open?"""


def _reply(body: bytes, *, status: int = 200, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
        % (status, len(body), extra)
    ) + body


async def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` on the event loop until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


class Scripted:
    """A loopback HTTP server; counts connections and requests, records paths and bodies."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *headers = head.decode("latin-1").split("\r\n")
                length = next(
                    int(h.split(":")[1]) for h in headers if h.lower().startswith("content-length")
                )
                body = await reader.readexactly(length)
                self.requests.append((line.split()[1].encode(), body))
                keep = await self.reply(len(self.requests), body, writer)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _echo(extra: bytes = b"") -> Reply:
    async def reply(n: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(_reply(b'{"n":%d,"got":%s}' % (n, body), extra=extra))
        return True

    return reply


def test_keep_alive_reuses_one_connection_and_keeps_the_path_prefix():
    async def go():
        async with Scripted(_echo()) as server:
            pool = HTTPPool(server.url + "/prefix/")
            replies = [await pool.post("/v1/chat", b'{"i":%d}' % i) for i in range(3)]
            await pool.close()
            return server, replies

    server, replies = asyncio.run(go())
    assert replies == [(200, b'{"n":%d,"got":{"i":%d}}' % (i + 1, i)) for i in range(3)]
    assert server.connections == 1
    assert [path for path, _ in server.requests] == [b"/prefix/v1/chat"] * 3


def test_concurrent_requests_take_one_connection_each_then_share_them():
    arrived: list[int] = []

    async def all_four_in_flight(n: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        # no reply before the whole batch of 4 has arrived: all 4 are in flight at once
        arrived.append(n)
        await _until(lambda: len(arrived) >= 4 * ((n + 3) // 4))
        writer.write(_reply(body))
        return True

    async def go():
        async with Scripted(all_four_in_flight) as server:
            pool = HTTPPool(server.url)
            first = await asyncio.gather(*(pool.post("/x", b"%d" % i) for i in range(4)))
            second = await asyncio.gather(*(pool.post("/x", b"%d" % i) for i in range(4)))
            await pool.close()
            return server, first + second

    server, replies = asyncio.run(go())
    assert [body for _, body in replies] == [b"%d" % i for i in range(4)] * 2
    assert server.connections == 4


def test_connection_close_and_http_1_0_are_not_reused():
    async def go():
        async with Scripted(_echo(extra=b"Connection: close\r\n")) as server:
            pool = HTTPPool(server.url)
            for _ in range(2):
                assert (await pool.post("/x", b"1"))[0] == 200
            return server.connections

    assert asyncio.run(go()) == 2


def test_chunked_and_end_of_connection_bodies():
    async def chunked(n: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        if n == 1:
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n'
            )
            return True
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"b":2}')
        return False

    async def go():
        async with Scripted(chunked) as server:
            pool = HTTPPool(server.url)
            return [await pool.post("/x", b"{}") for _ in range(2)]

    assert asyncio.run(go()) == [(200, b'{"a":1}'), (200, b'{"b":2}')]


def test_error_statuses_come_back_as_replies():
    async def fail(n: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(_reply(b'{"error":{"message":"boom"}}', status=503))
        return True

    async def go():
        async with Scripted(fail) as server:
            return await HTTPPool(server.url).post("/x", b"{}")

    assert asyncio.run(go()) == (503, b'{"error":{"message":"boom"}}')


def test_a_pooled_connection_the_server_closed_is_replaced_without_an_error():
    """The server answers, then hangs up while the connection idles in the pool."""

    async def answer_then_hang_up(n: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(_reply(b"{}"))
        return False  # closes without saying Connection: close

    async def go():
        async with Scripted(answer_then_hang_up) as server:
            pool = HTTPPool(server.url)
            await pool.post("/x", b"1")
            await _until(lambda: pool._idle[-1].closed)  # the close reaches the pool
            await pool.post("/x", b"2")
            return server

    server = asyncio.run(go())
    assert server.connections == 2 and len(server.requests) == 2


def test_a_request_on_a_stale_connection_is_sent_again_once():
    """The pool has not seen the close yet when it reuses the connection (the keep-alive
    race): the request fails before any reply byte, so it goes again on a new connection."""

    async def go():
        async with Scripted(_echo()) as server:
            pool = HTTPPool(server.url)
            await pool.post("/x", b"1")
            stale = pool._idle[-1]
            stale.closed = False
            stale.transport.get_extra_info("socket").shutdown(2)  # the peer is gone
            status, body = await pool.post("/x", b"2")
            return server, status, body

    server, status, body = asyncio.run(go())
    assert status == 200 and body.endswith(b'"got":2}') and server.connections == 2


def test_a_reply_cut_short_raises_and_is_not_sent_again():
    async def cut(n: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(_reply(b'{"long":"reply"}')[:-5])
        return False

    async def go():
        async with Scripted(cut) as server:
            pool = HTTPPool(server.url)
            with pytest.raises(HTTPConnectionError, match="before the reply was complete"):
                await pool.post("/x", b"1")
            return server

    assert len(asyncio.run(go()).requests) == 1


def test_a_garbled_reply_raises():
    async def garble(n: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        return True

    async def go():
        async with Scripted(garble) as server:
            with pytest.raises(HTTPConnectionError, match="malformed HTTP reply"):
                await HTTPPool(server.url).post("/x", b"1")

    asyncio.run(go())


def test_the_timeout_bounds_the_request_and_drops_its_connection():
    async def stall(n: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        if n == 1:
            await asyncio.sleep(1.0)
        writer.write(_reply(b"{}"))
        return True

    async def go():
        async with Scripted(stall) as server:
            pool = HTTPPool(server.url, timeout=0.2)
            with pytest.raises(TimeoutError):
                await pool.post("/x", b"1")
            assert pool._idle == []
            return await pool.post("/x", b"2")

    assert asyncio.run(go()) == (200, b"{}")


def test_connections_idle_past_keepalive_are_not_reused():
    async def go():
        async with Scripted(_echo()) as server:
            pool = HTTPPool(server.url, keepalive_s=0.05)
            await pool.post("/x", b"1")
            await asyncio.sleep(0.1)
            await pool.post("/x", b"2")
            await pool.close()
            return server.connections

    assert asyncio.run(go()) == 2


def test_nobody_listening_raises_a_connection_error_naming_the_url():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        await HTTPPool(f"http://127.0.0.1:{port}").post("/x", b"1")

    with pytest.raises(HTTPConnectionError, match=f"cannot connect to http://127.0.0.1:{port}"):
        asyncio.run(go())


@pytest.mark.parametrize("url", ["ftp://h/x", "127.0.0.1:8000", "http:///x"])
def test_a_url_that_is_not_http_is_refused(url):
    with pytest.raises(ValueError, match="not an http"):
        HTTPPool(url)
