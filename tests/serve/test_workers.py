"""`ortformer serve --workers 2`: two processes on one port, each answering (x-ortformer-pid),
one /metrics view summed over them, and SIGTERM answering every open request before exit 0."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from ortformer.serve.options import ServeOptions
from ortformer.serve.workers import worker_threads

from support.serve import count, sigterm_with_requests_open, start_process as start

httpx = pytest.importorskip("httpx")


def test_two_workers_share_the_port_and_the_metrics_and_drain_on_sigterm(runtimes):
    runtime = runtimes["embedder"]
    path = runtimes.files["embedder"]
    # one input per model call: 16 requests of 128 inputs are still open when the signal comes
    before = set(Path(tempfile.gettempdir()).glob("ortformer-serve-metrics-*"))
    process, url = start(str(path), "--workers", "2", "--threads", "1", "--max-batch-tokens", "1",
                         "--max-wait-ms", "0", "--max-client-batch-size", "128")
    try:
        seen, sent = set(), 0
        with httpx.Client(timeout=30) as client:
            for _ in range(40):  # new connections, so the kernel hands them to either worker
                response = client.post(f"{url}/embed", json={"inputs": ["a worker test", "two"], "normalize": False},
                                       headers={"connection": "close"})
                sent += 1
                assert response.status_code == 200
                np.testing.assert_allclose(response.json(), runtime.embed_texts(["a worker test", "two"]),
                                           atol=1e-5, rtol=0)
                seen.add(response.headers["x-ortformer-pid"])
                if len(seen) == 2 and sent >= 10:
                    break
        assert len(seen) == 2, "one worker answered every request"
        # any worker's /metrics counts every worker's requests
        assert count(url, "te_request_count") == sent
        folders = set(Path(tempfile.gettempdir()).glob("ortformer-serve-metrics-*")) - before
        assert len(folders) == 1 and any(next(iter(folders)).glob("*.db"))  # the workers' metric files

        # new connections, so both workers hold some of the requests the signal finds open
        answers, answered_before = sigterm_with_requests_open(process, url, already=sent, timeout=120,
                                                              headers={"connection": "close"})
    finally:
        if process.poll() is None:
            process.kill()
    assert answered_before < sent + 16  # the signal came while requests were still open
    assert [a.status_code for a in answers] == [200] * 16
    assert {a.headers["x-ortformer-pid"] for a in answers} <= seen
    assert "Traceback" not in process.stderr.read()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)
    assert not set(Path(tempfile.gettempdir()).glob("ortformer-serve-metrics-*")) - before  # removed at exit


def test_threads_per_worker_divide_the_cpus(monkeypatch):
    import ortformer.serve.workers as workers

    monkeypatch.setattr(workers, "available_cpus", lambda: 8)
    assert worker_threads(ServeOptions(), 2) == 4
    assert worker_threads(ServeOptions(), 3) == 2
    assert worker_threads(ServeOptions(), 16) == 1
    assert worker_threads(ServeOptions(threads=3), 2) == 3
