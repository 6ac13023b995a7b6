"""`python -m benchmarks`: the peer harness's command refuses before measuring and runs the
scenarios through ortformer.bench.run, so bench.json and the table are `ortformer bench`'s."""
import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from benchmarks.__main__ import main
from benchmarks.peers.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parents[2]


def test_scenarios_are_the_peer_ones_and_none_of_ortformer_bench():
    from ortformer.bench.scenarios import SCENARIOS as OWN

    assert set(SCENARIOS) == {"real", "serve", "cpu-engines"} and not set(SCENARIOS) & set(OWN)


def test_an_unknown_scenario_is_a_usage_error():
    result = CliRunner().invoke(main, ["--scenario", "latency"])
    assert result.exit_code == 2 and "'latency' is not one of" in result.output


def test_an_earlier_report_is_kept_without_force(tmp_path):
    (tmp_path / "bench.json").write_text("{}")
    result = CliRunner().invoke(main, ["--scenario", "serve", "--out", str(tmp_path)])
    assert result.exit_code == 1 and f"{tmp_path / 'bench.json'} already exists; pass --force" in result.output
    assert json.loads((tmp_path / "bench.json").read_text()) == {}


def test_a_scenario_runs_through_ortformer_bench_run(tmp_path, monkeypatch):
    calls = []

    def fake(workdir, threads, quick, iterations):
        calls.append((threads, quick, iterations))
        return {"rows": [{"contender": "ortformer", "median_s": 0.5}], "targets": []}

    monkeypatch.setitem(SCENARIOS, "serve", fake)
    result = CliRunner().invoke(main, ["--scenario", "serve", "--quick", "--threads", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert calls == [(1, True, 3)]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["scenarios"]["serve"]["rows"] == [{"contender": "ortformer", "median_s": 0.5}]
    assert "[serve]" in result.output and "contender=ortformer  median_s=0.5" in result.output


def test_the_module_runs_from_the_repository_root():
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--setup-peers" in done.stdout and "cpu-engines" in done.stdout


def test_the_package_never_imports_the_harness():
    import ast

    importers = []
    for path in (ROOT / "ortformer").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            importers += [str(path.relative_to(ROOT)) for n in names if n.split(".")[0] == "benchmarks"]
    assert importers == []
