"""Several processes serving one app: the header that says which process answered.
"""
from __future__ import annotations

import os

PID_HEADER = b"x-ortformer-pid"


class _PidHeader:
    """ASGI middleware: every HTTP answer carries this process's id (x-ortformer-pid), so a
    client or a load balancer's log can tell the workers or replicas apart."""

    def __init__(self, app):
        self.app = app
        self.pid = str(os.getpid()).encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (PID_HEADER, self.pid)]}
            await send(message)

        await self.app(scope, receive, sending)


def with_pid_header(app):
    """The Starlette `app`, its answers carrying x-ortformer-pid (the app stays itself:
    its state and lifespan are unchanged)."""
    app.add_middleware(_PidHeader)
    return app
