"""The wheel as a user gets it: build the sdist and the wheel, install the wheel (not editable)
into fresh venvs, and run what a new user runs first.

    python .ci/wheel_smoke.py        # ./dev wheel-smoke; .ci/run runs it after the suite

Nothing is downloaded. The sdist is built from a copy of the tracked files and the wheel from
the unpacked sdist, with setuptools' PEP 517 hooks in this interpreter (as `python -m build
--no-isolation` would). Each fresh venv gets the wheel alone (pip --no-deps --no-index) and a
folder of links to exactly the distributions its requirements resolve to in this venv: the
closure of the wheel's own Requires-Dist, read from its METADATA, for the extras named.

- "full" (export, text, serve): `export --preset tiny`, `infer`, `serve` answering /health on
  127.0.0.1; the package imported is the installed one, not this checkout.
- "base" (no extra): `infer` runs on onnxruntime alone, and each extra's feature fails with
  its one-line missing-extra message and install line.
"""
from __future__ import annotations

import email.parser
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "ortformer"
_HOOK = "import sys; from setuptools import build_meta as b; name = getattr(b, sys.argv[1])(sys.argv[2]); print('\\n' + name)"
# each extra's feature, as a user meets it in a venv without the extra: (extra, argv or python code)
MISSING = [
    ("export", ["ortformer", "export", "--preset", "tiny", "-o", "x.onnx"]),
    ("bench", ["ortformer", "bench", "--quick", "--out", "bench-out"]),
    ("serve", ["ortformer", "serve", "tiny.onnx", "--port", "0"]),
    ("ray", ["ortformer", "batch", "tiny.onnx", "--input", "texts.jsonl", "--output", "out.parquet"]),
    ("openvino", ["ortformer", "infer", "tiny.onnx", "--ids", "[[1, 2, 3]]", "--provider", "openvino"]),
    ("text", ["python", "-c", "from ortformer.config.text import TextEncoder\n"
              "try:\n    TextEncoder('tokenizer.json')\nexcept ImportError as exc:\n"
              "    raise SystemExit('error: ' + str(exc))"]),
]


def log(line: str) -> None:
    print(f"wheel-smoke: {line}", file=sys.stderr, flush=True)


def _hook(name: str, out: Path, cwd: Path) -> Path:
    done = subprocess.run([sys.executable, "-c", _HOOK, name, str(out)], cwd=cwd, capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise SystemExit(f"wheel-smoke: {name} failed:\n{done.stdout}{done.stderr}")
    return out / done.stdout.strip().splitlines()[-1]


def tracked_files(root: Path = ROOT, under: str = "") -> list[str]:
    """The repository's tracked files (under ``under``), as git lists them."""
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", under or "."], capture_output=True,
                          check=True)
    return [name for name in done.stdout.decode().split("\0") if name and (root / name).is_file()]


def build(out: Path, root: Path = ROOT) -> tuple[Path, Path]:
    """(sdist, wheel) built into ``out``: the sdist from a copy of the tracked files, the wheel
    from the unpacked sdist, so a file the sdist forgets is missing from the wheel too."""
    tree = out / "tree"
    for name in tracked_files(root):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, tree / name)
    sdist = _hook("build_sdist", out, tree)
    with tarfile.open(sdist) as archive:
        archive.extractall(out / "unpacked", filter="data")
    (unpacked,) = (out / "unpacked").iterdir()
    return sdist, _hook("build_wheel", out, unpacked)


def missing_from_wheel(wheel: Path, root: Path = ROOT) -> list[str]:
    """The tracked files under ortformer/ (modules and every data file the code reads) that
    the wheel does not hold."""
    names = set(zipfile.ZipFile(wheel).namelist())
    return sorted(name for name in tracked_files(root, PACKAGE) if name not in names)


def wheel_requirements(wheel: Path, extras: tuple[str, ...]) -> list[Requirement]:
    """The wheel's Requires-Dist that apply with ``extras``, its own extras (ortformer[text]) expanded."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = email.parser.Parser().parsestr(archive.read(meta).decode()).get_all("Requires-Dist") or []
    wanted, seen, out = list(extras), set(), []
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in lines:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            if req.marker is None and extra:
                continue  # a base requirement, taken with extra ""
            if canonicalize_name(req.name) == PACKAGE:
                wanted.extend(req.extras)
            else:
                out.append(req)
    return out


def closure(requirements: list[Requirement]) -> dict[str, metadata.Distribution]:
    """Every distribution of this venv that ``requirements`` resolve to, by canonical name; a
    requirement this venv does not satisfy is an error (the smoke would not be honest)."""
    found: dict[str, metadata.Distribution] = {}
    expanded: set[tuple[str, frozenset]] = set()
    todo = [(req, None) for req in requirements]
    while todo:
        req, extra = todo.pop()  # extra None: a requirement of the wheel, whose marker was evaluated already
        if extra is not None and req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"wheel-smoke: {req} is not installed in {sys.prefix}") from None
        if not req.specifier.contains(dist.version, prereleases=True):
            raise SystemExit(f"wheel-smoke: {req} wanted, {name} {dist.version} installed")
        found[name] = dist
        if (name, frozenset(req.extras)) in expanded:
            continue
        expanded.add((name, frozenset(req.extras)))
        for sub in dist.requires or []:
            sub_req = Requirement(sub)
            for e in ("", *req.extras):
                if sub_req.marker is None or sub_req.marker.evaluate({"extra": e}):
                    todo.append((sub_req, e))
                    break
    return found


def link_view(dists: dict[str, metadata.Distribution], view: Path) -> Path:
    """A folder of links to the top-level entries (packages, modules, .libs, .dist-info) of ``dists``."""
    view.mkdir(parents=True)
    for dist in dists.values():
        for file in dist.files or []:
            top = file.parts[0]
            if top in ("..", "__pycache__") or top.endswith(".pth") or (view / top).exists():
                continue
            source = Path(dist.locate_file(top))
            if source.exists():
                (view / top).symlink_to(source)
    return view


def make_venv(path: Path, wheel: Path, extras: tuple[str, ...]) -> Path:
    """A fresh venv at ``path`` with the wheel installed and its requirements for ``extras`` linked in."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", "--no-compile", "--disable-pip-version-check", str(wheel)], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    view = link_view(closure(wheel_requirements(wheel, ("", *extras))), path / "deps")
    (Path(purelib) / "_smoke_deps.pth").write_text(f"{view}\n")
    return path


def run(venv: Path, argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    argv = [str(venv / "bin" / argv[0]), *argv[1:]]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def expect_ok(venv: Path, argv: list[str], cwd: Path, timeout: float = 300) -> str:
    done = run(venv, argv, cwd, timeout)
    if done.returncode:
        raise SystemExit(f"wheel-smoke: {' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_health(venv: Path, cwd: Path, model: str, ready_s: float = 120) -> dict:
    """Start `ortformer serve` on a free loopback port, GET /health until it answers (bounded),
    stop it with SIGTERM; returns {"status": ..., "exit": ...}."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    server = subprocess.Popen([str(venv / "bin" / "ortformer"), "serve", model, "--host", "127.0.0.1",
                               "--port", str(port)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    status, deadline = None, time.monotonic() + ready_s
    try:
        while status is None and time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                    status = answer.status
            except OSError:
                time.sleep(0.2)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            output = server.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            server.kill()
            output = server.communicate()[0]
    if status != 200:
        raise SystemExit(f"wheel-smoke: serve never answered /health with 200 (got {status}):\n{output}")
    return {"status": status, "exit": server.returncode}


def smoke(work: Path) -> dict:
    timings, started = {}, time.monotonic()
    sdist, wheel = build(work / "dist")
    missing = missing_from_wheel(wheel)
    if missing:
        raise SystemExit(f"wheel-smoke: {wheel.name} lacks {missing}")
    timings["build_s"] = round(time.monotonic() - started, 1)
    log(f"built {sdist.name} and {wheel.name}")
    full = make_venv(work / "full", wheel, ("export", "text", "serve"))
    base = make_venv(work / "base", wheel, ())
    here = work / "cwd"
    here.mkdir()
    located = expect_ok(full, ["python", "-c", "import ortformer; print(ortformer.__file__)"], here).strip()
    if not located.startswith(str(full)):
        raise SystemExit(f"wheel-smoke: ortformer imported from {located}, not from the installed wheel")
    expect_ok(full, ["ortformer", "--version"], here)
    step = time.monotonic()
    expect_ok(full, ["ortformer", "export", "--preset", "tiny", "-o", "tiny.onnx"], here, timeout=600)
    timings["export_s"] = round(time.monotonic() - step, 1)
    rows = json.loads(expect_ok(full, ["ortformer", "infer", "tiny.onnx", "--ids", "[[1, 2, 3], [4, 5]]"], here))
    log(f"infer: {type(rows).__name__} from the full venv")
    step = time.monotonic()
    served = serve_health(full, here, "tiny.onnx")
    timings["serve_s"] = round(time.monotonic() - step, 1)
    if served["exit"] != 0:
        raise SystemExit(f"wheel-smoke: serve exited {served['exit']} on SIGTERM")
    expect_ok(base, ["ortformer", "infer", "tiny.onnx", "--ids", "[[1, 2, 3]]"], here)
    (here / "texts.jsonl").write_text('{"id": 1, "text": "a"}\n')
    (here / "tokenizer.json").write_text("{}")
    for extra, argv in MISSING:
        done = run(base, argv, here)
        lines = done.stderr.strip().splitlines()
        if done.returncode != 1 or not lines or f"needs the '{extra}' extra" not in lines[-1] \
                or "pip install" not in lines[-1]:
            raise SystemExit(f"wheel-smoke: without the '{extra}' extra, {' '.join(argv)} exited {done.returncode}:"
                             f"\n{done.stdout}{done.stderr}")
        log(f"without '{extra}': {lines[-1]}")
    timings["total_s"] = round(time.monotonic() - started, 1)
    return timings


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ortformer-wheel-") as work:
        timings = smoke(Path(work))
    log(f"passed {json.dumps(timings)}")


if __name__ == "__main__":
    main()
