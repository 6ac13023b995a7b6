"""Connection limits and timeouts: uvicorn's httptools protocol with the bounds it lacks.

uvicorn 0.55 on httptools (llhttp) bounds none of what a client sends before the app sees a
request: llhttp has no header size or count limit, a new connection that never sends a byte
has no timer (uvicorn arms its keep-alive timer only after a response), and there is no time
limit on receiving a request's headers or body, nor on a client that stops reading its answer.
`limit_concurrency` answers 503 once a request's headers are in, so silent or slow
connections never reach it. `LimitedProtocol` subclasses `HttpToolsProtocol` and adds:

    max_connections     a connection past the cap is answered 503 and closed at once
    max_header_bytes    request line + headers, counted as they arrive: 431, then closed
    max_headers         header fields: 431, then closed
    keep_alive_timeout  no request begun this long after the connection opens or the
                        last answer: closed (CR/LF between requests does not reset it)
    header_timeout      a request's headers not all in this long after its first byte:
                        408, then closed (slowloris)
    body_timeout        its body not all in this long after its headers: 408, closed;
                        the app sees the client disconnect
    write_timeout       part of an answer still waits in the send buffer (the client does
                        not read) this long after it was buffered, or after the buffer
                        last fell below its low-water mark: connection aborted

Each timer is a deadline from the event that starts it, not an inactivity timer: a client
that sends one byte a second still meets it. The limits ride on uvicorn's Config (a
`LimitedConfig`) so a worker process started from a pickled Config gets them too.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, fields

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..core.checks import check_int
from ..core.errors import InputError


@dataclass(frozen=True)
class Limits:
    """What one client connection may spend; the flags of `ortformer serve` (docs/serve.md)."""
    max_connections: int = 1024
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    keep_alive_timeout: float = 5.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    write_timeout: float = 30.0
    graceful_shutdown_timeout: float = 20.0

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type == "int":
                check_int(field.name, value)
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86_400:
                raise InputError(f"{field.name}={value!r} must be a number of seconds in (0, 86400]")


class LimitedConfig(uvicorn.Config):
    """uvicorn's Config carrying the Limits its protocol enforces."""

    def __init__(self, app, limits: Limits, **kwargs):
        super().__init__(app, http=LimitedProtocol, timeout_keep_alive=limits.keep_alive_timeout, **kwargs)
        self.limits = limits


class _HeadTooLarge(Exception):
    """Raised from a parser callback; httptools turns it into HttpParserCallbackError."""


def error_response(status: int, reason: bytes, message: str, error_type: str) -> bytes:
    """A whole HTTP/1.1 answer in TEI's error shape that closes the connection."""
    body = json.dumps({"error": message, "error_type": error_type}).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, reason, len(body))) + body


class LimitedProtocol(HttpToolsProtocol):
    def __init__(self, config, server_state, app_state, _loop=None):
        super().__init__(config, server_state, app_state, _loop)
        self.limits: Limits = getattr(config, "limits", None) or Limits()
        self._refused = False
        self._running = None  # the request whose app task runs
        self._in_head = False  # from a request's first byte to its last header
        self._body_pending = False  # from its last header to the end of its body
        self._messages = 0
        self._head_bytes = 0  # exact: the URL and the headers handed over so far
        self._head_raw = 0  # raw: the chunks that arrived wholly inside the unfinished head
        self._header_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None

    # connections ---------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        if len(self.connections) >= self.limits.max_connections:
            self._refused, self.transport = True, transport
            self.logger.warning("refused a connection: --max-connections %d are open", self.limits.max_connections)
            transport.write(error_response(503, b"Service Unavailable", "too many open connections; retry later",
                                           "overloaded"))
            transport.close()
            return
        super().connection_made(transport)
        # uvicorn arms its keep-alive timer only after a first answer: a silent new connection
        # would be held forever
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc) -> None:
        for timer in (self._head_timer, self._body_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._write_timer = None
        if self._refused:
            return
        self._disconnect_request()  # uvicorn marks only self.cycle, not a pipelined request's predecessor
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's own data_received, but the keep-alive timer is cancelled when a request
        # begins (on_message_begin), not on any byte: a stream of CR/LF is no request
        if self._refused or self.parser is None:
            return
        begun, in_head = self._messages, self._in_head
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._reject(431, b"Request Header Fields Too Large", str(exc.__context__), "validation")
                return
            self._bad_request()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # no websocket routes here
            return
        if in_head and self._in_head and begun == self._messages:
            # the whole chunk belongs to one unfinished head: llhttp buffers it (a header
            # value is only handed over once it ends), so count it here; neither count
            # exceeds the head's true size, so either passing the limit proves it too large
            self._head_raw += len(data)
            if self._head_raw > self.limits.max_header_bytes:
                self._reject(431, b"Request Header Fields Too Large", self._too_large_bytes(), "validation")

    def _bad_request(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)

    # requests ------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._messages += 1
        self._in_head, self._head_bytes, self._head_raw, self._header_count = True, 0, 0, 0
        self._unset_keepalive_if_required()
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._timed_out, "header")

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise _HeadTooLarge(f"more than --max-headers {self.limits.max_headers} header fields")
        self._count_head(len(name) + len(value) + 4)  # "name: value\r\n"
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        # exact sizes as the parser hands them over; data_received bounds what it buffers
        self._head_bytes += size
        if self._head_bytes > self.limits.max_header_bytes:
            raise _HeadTooLarge(self._too_large_bytes())

    def _too_large_bytes(self) -> str:
        return f"the request line and headers are larger than --max-header-bytes {self.limits.max_header_bytes}"

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel("_head_timer")
        super().on_headers_complete()
        self._body_pending = True
        if not self.pipeline:  # a pipelined request's body waits for the one before it
            self._arm_body()

    def on_message_complete(self) -> None:
        self._body_pending = False
        self._cancel("_body_timer")
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_unsent()
        if self._in_head:  # the next request has begun: its header timer runs, not keep-alive
            self._unset_keepalive_if_required()
        if self._body_pending and self._body_timer is None:
            self._arm_body()

    def _arm_body(self) -> None:
        self._body_timer = self.loop.call_later(self.limits.body_timeout, self._timed_out, "body")

    def _cancel(self, name: str) -> None:
        timer = getattr(self, name)
        if timer is not None:
            timer.cancel()
            setattr(self, name, None)

    def _timed_out(self, part: str) -> None:
        setattr(self, f"_{part}_timer", None)
        if self.transport.is_closing():
            return
        self._reject(408, b"Request Timeout",
                     f"the request's {part} did not arrive within --{part}-timeout {getattr(self.limits, part + '_timeout'):g} s",
                     "timeout")

    def _reject(self, status: int, reason: bytes, message: str, error_type: str) -> None:
        """Answer `status` and close, unless an answer has begun (then only close). A request
        the app is reading sees the client disconnect and its answer goes nowhere."""
        cycle = self.cycle
        # answer only where no other answer is on the wire: a head behind a finished request,
        # or a body whose request has not begun its answer; otherwise only close
        if self._in_head:
            answer = cycle is None or cycle.response_complete
        else:
            answer = cycle is not None and not cycle.response_started
        self._disconnect_request()
        if answer:
            self.logger.info("%s %d: %s", "%s:%d" % self.client if self.client else "client", status, message)
            self.transport.write(error_response(status, reason, message, error_type))
        self.transport.close()

    def _start_asgi_task(self, cycle, app) -> None:
        self._running = cycle  # self.cycle is the last request parsed, maybe a pipelined one
        super()._start_asgi_task(cycle, app)

    def _disconnect_request(self) -> None:
        """The requests in progress see the client gone now, before the transport reports it
        (a call later): receive() answers http.disconnect and send() does nothing, where it
        would otherwise write to a closed transport."""
        for cycle in {id(c): c for c in (self.cycle, self._running) if c is not None}.values():
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def abort(self) -> None:
        """Drops the connection at once, unsent answer and all (graceful shutdown's deadline)."""
        self._disconnect_request()
        self.transport.abort()

    # answers the client does not read ------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_unsent()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel("_write_timer")
        self._watch_unsent()  # a new deadline for what is left

    def _watch_unsent(self) -> None:
        """Arms the write deadline while part of an answer waits in the transport's buffer:
        below the high-water mark nothing pauses, and closing (keep-alive, Connection: close)
        waits for that part to drain, which a client that stopped reading never lets happen."""
        if self._write_timer is None and self.transport.get_write_buffer_size() > 0:
            self._write_timer = self.loop.call_later(self.limits.write_timeout, self._write_timed_out)

    def _write_timed_out(self) -> None:
        self._write_timer = None
        if self.transport.get_write_buffer_size() == 0 and not self.flow.write_paused:
            return  # the client read it all in time
        self.logger.info("aborted a connection whose client did not read its answer for --write-timeout %g s",
                         self.limits.write_timeout)
        self.abort()  # close() would wait for the unread answer to drain
