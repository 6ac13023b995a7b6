"""Zygote for the SIGKILL trials of tests/reliability/test_kill.py (run as a script, not collected).

Imports torch and ortformer once, then forks one child per trial; the child writes
(save_checkpoint or export) into the trial's own folder and is SIGKILLed at a random
moment, or at a chosen point. Each trial folder is left as the kill left it, for
the test to inspect. One JSON line per trial on stdout.

Export children replace the tracing step with a cached trace: tracing writes
nothing, and skipping it puts every kill inside staging, checking and the commit.
(tests/exporter/test_atomic.py kills real traces.)

No onnxruntime session and no parallel torch op runs in the zygote itself, so the
forked children start without inherited thread pools.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)

import onnx

import ortformer.exporter  # noqa: F401  (loads ortformer.exporter.export)
from ortformer.config import preset
from ortformer.models import build_encoder, checkpoint

export_module = sys.modules["ortformer.exporter.export"]

CKPT_OLD = preset("tiny")
CKPT_NEW = preset("tiny", attention="cosine", norm_eps=1e-6)  # other config, same shapes


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def fork_and_kill(work, delay: float | None, after: str | None = None, timeout: float = 120.0) -> dict:
    """Run work(report) in a forked child; SIGKILL it `delay` seconds after it reports a line
    starting with `after` (after=None: after the fork; delay=None: let it finish).
    Returns what the child reported, how it ended, and `window`: seconds from the `after`
    line (or the fork) to the child's end when it was not killed."""
    read_end, write_end = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        try:
            work(lambda text: os.write(write_end, (text + "\n").encode()))
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001
            os.write(write_end, f"EXC {type(exc).__name__}: {exc}\n".encode()[:2000])
            os._exit(3)
    os.close(write_end)
    pipe = os.fdopen(read_end)
    lines, mark = [], start
    if after is not None:
        for line in pipe:
            lines.append(line.rstrip("\n"))
            if line.startswith(after):
                mark = time.perf_counter()
                break
    sent = False
    if delay is not None:
        time.sleep(max(0.0, delay - (time.perf_counter() - mark)))
        os.kill(pid, signal.SIGKILL)  # on a child that already exited (a zombie) this does nothing
        sent = True
    lines += [line.rstrip("\n") for line in pipe]  # until the child's end closes the pipe
    _, status = os.waitpid(pid, 0)
    pipe.close()
    signaled = os.WIFSIGNALED(status)
    return {"seconds": time.perf_counter() - start, "window": time.perf_counter() - mark, "sent_kill": sent,
            "sigkilled": signaled and os.WTERMSIG(status) == signal.SIGKILL,
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "lines": lines[-3:], "progress": len(lines)}


def killing_at_replace(number: int, when: str, work):
    """work(report) run with os.replace patched to SIGKILL the process before or after its
    `number`-th call: a kill exactly at a rename, the instants random delays rarely hit."""
    def wrapped(report):
        real, calls = os.replace, [0]

        def replace(src, dst):
            calls[0] += 1
            if calls[0] == number and when == "before":
                report(f"killing before replace {number} of {dst}")
                os.kill(os.getpid(), signal.SIGKILL)
            real(src, dst)
            if calls[0] == number and when == "after":
                report(f"killing after replace {number} of {dst}")
                os.kill(os.getpid(), signal.SIGKILL)

        os.replace = replace
        work(report)
        report("finished without reaching the kill point")
    return wrapped


def checkpoint_trials(workdir: Path, count: int, rng: random.Random) -> None:
    old, new = build_encoder(CKPT_OLD, seed=0), build_encoder(CKPT_NEW, seed=1)
    probe = workdir / "ckpt-calibration"
    checkpoint.save_checkpoint(old, probe)
    start = time.perf_counter()
    for _ in range(5):
        checkpoint.save_checkpoint(new, probe, force=True)
    one_save = (time.perf_counter() - start) / 5
    shutil.rmtree(probe)

    def saver(report):
        for k in range(10**6):  # alternate new and old until killed
            report(f"save {k}")
            checkpoint.save_checkpoint(new if k % 2 == 0 else old, folder, force=True)

    def saver_once(report):
        checkpoint.save_checkpoint(new, folder, force=True)

    deterministic = [("before replace 1", killing_at_replace(1, "before", saver_once)),
                     ("before replace 2", killing_at_replace(2, "before", saver_once)),
                     ("after replace 2", killing_at_replace(2, "after", saver_once))]

    for i in range(count):
        folder = workdir / f"ckpt-{i:03d}"
        checkpoint.save_checkpoint(old, folder)
        if i < len(deterministic):
            name, work = deterministic[i]
            result = fork_and_kill(work, None)
            emit(writer="checkpoint", trial=i, folder=str(folder), mode=name, **result)
            continue
        delay = rng.uniform(0, 4 * one_save)
        result = fork_and_kill(saver, delay)
        emit(writer="checkpoint", trial=i, folder=str(folder), mode="random", delay=delay, one_save=one_save, **result)


def export_trials(workdir: Path, count: int, rng: random.Random, old_model: Path) -> None:
    cached = onnx.load(str(old_model))
    del cached.metadata_props[:]
    cfg = json.loads({p.key: p.value for p in onnx.load(str(old_model), load_external_data=False).metadata_props}["ortformer.config"])
    from ortformer.config import EncoderConfig

    cfg = EncoderConfig.from_dict(cfg)
    reference = build_encoder(cfg, seed=0)  # the weights the cached trace holds (exported with seed 0)

    def exporter(parity: bool):
        def work(report):
            export_module._trace_to_onnx = lambda *args, **kwargs: onnx.ModelProto.FromString(cached.SerializeToString())
            export_module.export(reference, path, force=True, parity=parity, source="kill-trial-new",
                                 progress=lambda step: report(f"step {step}"))
        return work

    windows = {}
    for parity in (False, True):  # calibration: one forked export each, run to completion
        path = workdir / f"export-calibration-{parity}" / "m.onnx"
        path.parent.mkdir()
        result = fork_and_kill(exporter(parity), None, after="step writing")
        windows[parity] = result["window"]  # from "writing" to the end: staging, checks, commit
        emit(writer="export-calibration", parity=parity, folder=str(path.parent), **result)
    # the commit is one os.replace of the ONNX file: kill right before and right after it
    deterministic = [("before the commit rename", killing_at_replace(1, "before", exporter(False))),
                     ("after the commit rename", killing_at_replace(1, "after", exporter(False)))]
    for i in range(count):
        parity = True  # the gate widens the window between staging and commit to ~1 s
        path = workdir / f"export-{i:03d}" / "m.onnx"
        path.parent.mkdir()
        shutil.copyfile(old_model, path)
        if i < len(deterministic):
            mode, work = deterministic[i]
            result = fork_and_kill(work, None)
            emit(writer="export", trial=i, folder=str(path.parent), parity=False, mode=mode, **result)
            continue
        delay = rng.uniform(0, 0.8 * windows[parity])
        result = fork_and_kill(exporter(parity), delay, after="step writing")
        emit(writer="export", trial=i, folder=str(path.parent), parity=parity, mode="random", delay=delay, **result)


if __name__ == "__main__":
    plan = json.loads(Path(sys.argv[1]).read_text())
    rng = random.Random(plan["seed"])
    workdir = Path(plan["workdir"])
    checkpoint_trials(workdir, plan["checkpoint_trials"], rng)
    export_trials(workdir, plan["export_trials"], rng, Path(plan["old_model"]))
    emit(writer="done")
