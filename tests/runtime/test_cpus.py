"""available_cpus: the affinity mask capped by the cgroup CPU quota, the one count Runtime,
serve and Ray batch size themselves by."""
from ortformer.core import cpus
from ortformer.runtime import Runtime, session
from ortformer.serve.options import ServeOptions


def test_threads_follow_the_cgroup_quota_not_the_host(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus, "_affinity_cores", lambda: 8)  # the affinity mask: 8 cores
    proc = tmp_path / "cgroup"
    # cgroup v2: a half-CPU quota on the parent of the process's cgroup
    (tmp_path / "v2" / "pod" / "app").mkdir(parents=True)
    (tmp_path / "v2" / "pod" / "cpu.max").write_text("50000 100000\n")
    (tmp_path / "v2" / "pod" / "app" / "cpu.max").write_text("max 100000\n")
    proc.write_text("0::/pod/app\n")
    assert cpus.cgroup_cpu_quota(tmp_path / "v2", proc) == 0.5
    assert cpus.available_cpus(tmp_path / "v2", proc) == 1
    # cgroup v1: 2.5 CPUs of quota rounds up to 3
    (tmp_path / "v1" / "cpu,cpuacct" / "docker").mkdir(parents=True)
    (tmp_path / "v1" / "cpu,cpuacct" / "docker" / "cpu.cfs_quota_us").write_text("250000\n")
    (tmp_path / "v1" / "cpu,cpuacct" / "docker" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("5:cpu,cpuacct:/docker\n4:memory:/docker\n")
    assert cpus.available_cpus(tmp_path / "v1", proc) == 3
    # no quota (v1's -1, or no cgroup files): the affinity mask
    (tmp_path / "v1" / "cpu,cpuacct" / "docker" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus.cgroup_cpu_quota(tmp_path / "v1", proc) is None
    assert cpus.available_cpus(tmp_path / "v1", proc) == 8
    assert cpus.available_cpus(tmp_path / "none", tmp_path / "missing") == 8


def test_runtime_and_serve_size_by_the_same_count(tokens_model, monkeypatch):
    monkeypatch.setattr(session, "available_cpus", lambda: 3)  # a container with a 3-CPU quota
    assert Runtime(tokens_model, "cpu").threads == 3
    assert Runtime(tokens_model, "cpu", threads=2).threads == 2
    monkeypatch.setattr("ortformer.serve.options.available_cpus", lambda: 3)
    assert ServeOptions().resolved_threads() == 3 and ServeOptions(threads=5).resolved_threads() == 5


def test_no_other_module_counts_cpus_itself():
    import ast
    from pathlib import Path

    root = Path(cpus.__file__).resolve().parent  # the package
    counting = []
    for path in root.rglob("*.py"):
        if path.name == "cpus.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("sched_getaffinity", "cpu_count"):
                counting.append(f"{path.relative_to(root)}:{node.lineno}")
    # bench.json's machine record names the host's count on purpose
    assert [c for c in counting if not c.startswith("bench/run.py:")] == [], counting
