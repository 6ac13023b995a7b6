"""A stand-in embedding server for the load generator's and the serve scenario's tests.

POST /v1/embeddings (OpenAI's shape) and /embed (TEI's) answer each text with a vector of
``dim`` floats, all equal to the text's length. The first text of a request steers it:
"boom" answers 500, "short" one vector too few, "dim" vectors one float too long, and
"sleep S" waits S seconds first; ``delay`` seconds are waited on every request.
Every request's texts are kept in ``seen``. Run as a script: ``standin_server.py PORT DIM``.
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers and httpx's pool use it

    def log_message(self, *args):
        pass

    def _send(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"status": "ok"}) if self.path == "/health" else self._send(404, {"error": "no route"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        texts = body["input"] if self.path == "/v1/embeddings" else body["inputs"]
        self.server.seen.append(list(texts))
        first = texts[0]
        time.sleep(self.server.delay + (float(first.split()[1]) if first.startswith("sleep ") else 0.0))
        if first == "boom":
            return self._send(500, {"error": "boom"})
        vectors = [[float(len(t))] * (self.server.dim + (first == "dim")) for t in texts[:len(texts) - (first == "short")]]
        if self.path == "/embed":
            return self._send(200, vectors)
        self._send(200, {"object": "list", "data": [{"embedding": v, "index": i} for i, v in enumerate(vectors)]})


def start(port: int = 0, dim: int = 4, delay: float = 0.0) -> ThreadingHTTPServer:
    """A running server on 127.0.0.1 (its port: ``server.server_address[1]``); ``shutdown()`` stops it."""
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.seen, server.dim, server.delay = [], dim, delay
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    start(int(sys.argv[1]), int(sys.argv[2]))
    threading.Event().wait()
