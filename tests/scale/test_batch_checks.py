"""`batch` checks its whole input before Ray starts, leaves nothing after a failed fresh
run, and keeps Ray's own warnings out of a successful run's output."""
from __future__ import annotations

import json
import sys
import warnings

import pytest
from click.testing import CliRunner

pytest.importorskip("ray")
pytest.importorskip("pyarrow")

from ortformer.core.errors import InputError  # noqa: E402
from ortformer.scale import ray_batch  # noqa: E402


def _no_ray(*args, **kwargs):
    raise AssertionError("Ray was started before the input was checked")


def test_a_bad_row_is_reported_before_ray_starts(text_model, tmp_path, monkeypatch):
    corpus = tmp_path / "texts.jsonl"
    corpus.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": 5}) + "\n")
    monkeypatch.setattr(ray_batch, "_connect", _no_ray)
    out = tmp_path / "emb.parquet"
    with pytest.raises(InputError, match=":2: field 'text'"):
        ray_batch.embed_corpus(text_model, corpus, out, shard_rows=1)
    assert not out.exists()


def test_a_failed_fresh_run_leaves_nothing_behind(text_model, tmp_path, monkeypatch):
    corpus = tmp_path / "texts.jsonl"
    corpus.write_text(json.dumps({"text": "fine"}) + "\n")

    def broken(*args, **kwargs):
        raise InputError("no cluster here")

    monkeypatch.setattr(ray_batch, "_connect", broken)
    out = tmp_path / "emb.parquet"
    with pytest.raises(InputError):
        ray_batch.embed_corpus(text_model, corpus, out)
    assert not out.exists()


def test_ray_warnings_stay_out_of_a_successful_run(text_model, tmp_path, monkeypatch, cli_group):
    corpus = tmp_path / "texts.jsonl"
    corpus.write_text(json.dumps({"text": "fine"}) + "\n")
    stats = {"rows": 1, "rows_embedded": 1, "shards_skipped": 0, "seconds": 1.0, "rows_per_s": 1.0,
             "num_actors": 1, "output": str(tmp_path / "o"), "shards": 1, "dim": 32}

    def fake(*args, **kwargs):
        warnings.warn("ray.data: this setting is deprecated", FutureWarning)
        return stats

    monkeypatch.setattr(ray_batch, "embed_corpus", fake)
    # as outside pytest (which records warnings itself): a shown warning reaches stderr
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: print(message, file=sys.stderr))
    result = CliRunner().invoke(cli_group, ["batch", str(text_model), "--input", str(corpus),
                                            "--output", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "deprecated" not in result.output and result.output.startswith("embedded 1 rows")


DRIVER = r'''
import subprocess, sys, time
agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "ray::FakeAgent"])
from ortformer.scale.ray_guard import guard
guard()
print(agent.pid, flush=True)
time.sleep(120)
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watchdog reads /proc")
def test_ray_processes_do_not_outlive_a_killed_driver():
    import os
    import signal
    import subprocess
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(repo)})
    agent = int(driver.stdout.readline())  # printed after guard(), which returns once the agent is recorded
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 15
    while _alive(agent) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _alive(agent)
    if alive:
        os.kill(agent, signal.SIGKILL)
    assert not alive, "a Ray process outlived its driver"


def test_held_stderr_keeps_descriptor_2_out_and_our_lines_in(capfd):
    import os

    from ortformer.scale.ray_guard import held_stderr

    with held_stderr() as stream:
        os.write(2, b"ray: a warning written by C++\n")
        stream.write("ours\n")
    err = capfd.readouterr().err
    assert "ours" in err and "C++" not in err
