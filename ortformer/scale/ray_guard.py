"""What a local Ray instance leaves outside Python's reach: its stderr, and its processes.

- Ray's processes and C++ core write warnings straight to file descriptor 2 (token
  authentication notes, actor-restart notes), past Python's warnings and logging.
  ``held_stderr`` points descriptor 2 at a temporary file while Ray runs and hands
  the caller a stream to the real stderr for its own lines; what Ray wrote is shown
  only when the run fails and the caller asks for it (``--debug``).
- ``ray.init`` starts agents (DashboardAgent, RuntimeEnvAgent) that survive a driver
  killed with SIGKILL (measured: both still running, reparented to init). ``guard``
  starts a small watchdog in its own session that records the driver's Ray
  descendants while it lives and ends them once it is gone. Linux only (/proc);
  elsewhere it does nothing.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from typing import Iterator, TextIO

_WATCHDOG = r'''
import os, signal, sys, time
driver = int(sys.argv[1])

def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), fields[19]  # state, ppid, start time
    except (OSError, IndexError, ValueError):
        return None

def is_ray(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"ray" in f.read()
    except OSError:
        return False

seen, first = {}, True
while True:
    s = stat(driver)
    if s is None or s[0] == "Z":
        break
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = stat(int(name))
            if info:
                parents[int(name)] = info
    family, grew = {driver}, True
    while grew:
        grew = False
        for pid, (_, ppid, _) in parents.items():
            if ppid in family and pid not in family:
                family.add(pid)
                grew = True
    for pid in family - {driver, os.getpid()}:
        if pid not in seen and is_ray(pid):
            seen[pid] = parents[pid][2]
    if first:  # guard() returns once what runs now is recorded
        print("ready", flush=True)
        sys.stdout.close()
        first = False
    time.sleep(0.5)
time.sleep(2)  # a clean shutdown needs no help: give it a moment to finish
for sig in (signal.SIGTERM, signal.SIGKILL):
    alive = [pid for pid, start in seen.items() if (stat(pid) or (None, None, None))[2] == start]
    for pid in alive:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    if not alive:
        break
    time.sleep(2)
'''


def guard() -> None:
    """Start the watchdog for this process's Ray descendants (Linux; a no-op elsewhere).

    Returns once the watchdog has recorded the descendants alive now, so a driver killed right
    after this call leaves none of them behind (and a test needs no sleep to know they are seen)."""
    if not os.path.isdir("/proc"):
        return
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid())], start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                close_fds=True)
    watchdog.stdout.readline()  # "ready", or "" if it died: either way nothing more to wait for
    watchdog.stdout.close()


@contextlib.contextmanager
def held_stderr(replay_on_error: bool = False) -> Iterator[TextIO]:
    """Descriptor 2 goes to a temporary file inside the block; yields a stream to the real
    stderr. On an exception, what was held is written out when ``replay_on_error``."""
    sys.stderr.flush()
    real = os.dup(2)
    held = tempfile.TemporaryFile()
    os.dup2(held.fileno(), 2)
    stream = os.fdopen(os.dup(real), "w", buffering=1)
    try:
        yield stream
    except BaseException:
        if replay_on_error:
            held.seek(0)
            stream.write(held.read().decode(errors="replace"))
        raise
    finally:
        stream.flush()
        os.dup2(real, 2)
        os.close(real)
        stream.close()
        held.close()
