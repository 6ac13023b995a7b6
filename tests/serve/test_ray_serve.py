"""ortformer.serve.ray:build on a local Ray: examples/ray-serve.yaml deployed as `serve run`
deploys a config file, with two replicas and the HTTP proxy on 127.0.0.1. Answers equal
Runtime.embed_texts, both replicas answer, and a replica killed under load is replaced while
every client gets a right answer or a retryable error. One Ray instance for the module:
starting Ray and two replicas takes ~20 s on 2 cores."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
yaml = pytest.importorskip("yaml")
httpx = pytest.importorskip("httpx")

from ortformer.core.errors import InputError  # noqa: E402
from ortformer.serve.ray import build, ongoing_requests, parse_args, ServeOptions  # noqa: E402

pytestmark = pytest.mark.ray
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "ray-serve.yaml"
TEXTS = [f"replica test sentence number {i} about {'long ' * (i % 5)}things" for i in range(12)]
# what a client may retry: 502-504, and the 500 Serve's proxy answers for a request whose replica
# died under it (measured: the requests in flight on the killed replica); ortformer's own 500s
# carry x-ortformer-pid, the proxy's do not, and count as wrong here
RETRYABLE = {500, 502, 503, 504}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def replica_actors() -> list[tuple[str, str]]:
    return [(a["name"], a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)
            if "SERVE_REPLICA" in a["name"]]


@pytest.fixture(scope="module")
def url(runtimes):
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema

    from ortformer.scale.ray_guard import guard

    runtimes["embedder"]  # exported
    config = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    app = config["applications"][0]
    app["args"] = {**app["args"], "models": [str(runtimes.files["embedder"])], "max_batch_tokens": 256}
    deployment = app["deployments"][0]
    deployment.pop("autoscaling_config")
    deployment.update(num_replicas=2, ray_actor_options={"num_cpus": 1})
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024, log_to_driver=False)
    guard()
    try:
        # what `serve run CONFIG` does with a config file: start Serve with its http_options, deploy its apps
        client = serve_api.serve_start(http_options=config["http_options"])
        client.deploy_apps(ServeDeploySchema.model_validate(config), _blocking=True)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while len(pids(base, 8)) < 2:
            assert time.monotonic() < deadline, "two replicas did not come up"
            time.sleep(0.5)
        yield base
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()


def pids(base: str, n: int) -> set[str]:
    """The replica processes that answered n /health requests (x-ortformer-pid)."""
    seen = set()
    for _ in range(n):
        try:
            response = httpx.get(f"{base}/health", timeout=5)
        except httpx.HTTPError:
            continue
        if response.status_code == 200:
            seen.add(response.headers["x-ortformer-pid"])
    return seen


def test_answers_equal_embed_texts_and_both_replicas_serve(url, runtimes):
    expected = runtimes["embedder"].embed_texts(TEXTS)
    seen = set()
    for _ in range(16):
        response = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "normalize": False}, timeout=30)
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(np.array(response.json()), expected, atol=1e-5, rtol=0)
        seen.add(response.headers["x-ortformer-pid"])
    assert len(seen) == 2
    info = httpx.get(f"{url}/info", timeout=10).json()
    assert info["max_batch_tokens"] == 256 and info["threads"] == 1  # num_cpus 1: one onnxruntime thread


def test_a_killed_replica_is_replaced_and_no_client_gets_a_wrong_answer(url, runtimes):
    expected = runtimes["embedder"].embed_texts(TEXTS)
    before = pids(url, 8)
    statuses: list[int] = []
    wrong: list[str] = []
    answered = threading.Event()

    def client():
        for _ in range(12):
            try:
                response = httpx.post(f"{url}/embed", json={"inputs": TEXTS, "normalize": False}, timeout=30)
            except httpx.TransportError:  # the connection dropped: retryable as well
                statuses.append(503)
                continue
            statuses.append(response.status_code)
            if response.status_code != 200 and "x-ortformer-pid" in response.headers:
                wrong.append(response.text[:200])  # a replica's own error, not the proxy's
            if response.status_code == 200:
                answered.set()
                if not np.allclose(np.array(response.json()), expected, atol=1e-5, rtol=0):
                    wrong.append(response.text[:200])

    clients = [threading.Thread(target=client) for _ in range(4)]
    for c in clients:
        c.start()
    assert answered.wait(60)
    name, namespace = replica_actors()[0]
    ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
    for c in clients:
        c.join(120)
    assert not wrong
    assert len(statuses) == 48 and set(statuses) <= {200} | RETRYABLE, sorted(set(statuses))
    deadline = time.monotonic() + 120
    while True:  # Serve starts a new replica: a process that did not answer before the kill
        now = pids(url, 8)
        if len(now) == 2 and now - before:
            break
        assert time.monotonic() < deadline, f"no replacement replica: {now} (before {before})"
        time.sleep(0.5)


def test_args_are_checked_before_any_replica_starts(tmp_path):
    with pytest.raises(InputError, match="unknown argument.*max_batch_token\\b"):
        parse_args({"models": ["a.onnx"], "max_batch_token": 5})
    with pytest.raises(InputError, match="`models` must be"):
        parse_args({"models": []})
    with pytest.raises(InputError, match="is not a file"):
        build({"models": [str(tmp_path / "missing.onnx")]})
    with pytest.raises(InputError, match="otlp_endpoint must be"):
        parse_args({"models": "a.onnx", "otlp_endpoint": 4317})
    with pytest.raises(InputError, match="max_wait_ms"):
        parse_args({"models": "a.onnx", "max_wait_ms": -1})
    named, options = parse_args({"models": {"m": "hf://org/name/onnx/model.onnx@v1"}, "api_key": "k"})
    assert named == {"m": "hf://org/name/onnx/model.onnx@v1"} and options.api_key == "k"
    # two rounds of 16-token requests at 256 tokens a call; capped by the batcher's admission
    assert ongoing_requests(ServeOptions(max_batch_tokens=256)) == 128
    assert ongoing_requests(ServeOptions(max_batch_tokens=65536)) == 512
