"""The fork server's rehearsal of a job's path (``workers.isolation.rehearse``, issue 44).

The fork server runs the generic part of a job's path before it forks any job's process, so that what that path
writes the first time is written once there. It must do nothing a job does to the world: no thread (the server
forks, and must stay single-threaded), no cgroup, no connection, no task event. Checked in a fresh interpreter (a
subprocess, as the fork server is one) that imported the fork server's ``PRELOAD``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import builtins, importlib, json, os, socket, sys, threading
from workers import isolation
for name in isolation.PRELOAD:
    importlib.import_module(name)

made, written, connected = [], [], []
mkdir, real_open, os_open, connect = os.mkdir, builtins.open, os.open, socket.socket.connect
os.mkdir = lambda path, *a, **k: (made.append(str(path)), mkdir(path, *a, **k))[1]
def watched_open(path, mode="r", *a, **k):
    if any(flag in mode for flag in "wax+"):
        written.append(str(path))
    return real_open(path, mode, *a, **k)
def watched_os_open(path, flags, *a, **k):
    if flags & (os.O_WRONLY | os.O_RDWR):
        written.append(str(path))
    return os_open(path, flags, *a, **k)
def watched_connect(self, address):
    connected.append(str(address))
    return connect(self, address)
builtins.open, os.open, socket.socket.connect = watched_open, watched_os_open, watched_connect
cgroup_before = real_open("/proc/self/cgroup").read()
isolation.rehearse(int(sys.argv[1]))
print(json.dumps({"tasks": len(os.listdir("/proc/self/task")), "threads": threading.active_count(),
                  "cgroup_unchanged": real_open("/proc/self/cgroup").read() == cgroup_before,
                  "made": made, "written": written, "connected": connected,
                  "job_log_pointed_nowhere": isolation._JOB_LOG.conn is None}))
"""


def test_the_rehearsal_leaves_the_fork_server_single_threaded_in_its_cgroup_and_writes_nothing_outside():
    done = subprocess.run([sys.executable, "-c", PROBE, "3"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert (seen["tasks"], seen["threads"]) == (1, 1), seen
    assert seen["cgroup_unchanged"], seen
    assert seen["made"] == [] and seen["written"] == [] and seen["connected"] == [], seen
    assert seen["job_log_pointed_nowhere"], seen


FAULTS_PROBE = """
import gc, importlib, os, resource
from workers import isolation
for name in isolation.PRELOAD:
    importlib.import_module(name)

def faults_of_a_fork_that_runs_the_path():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        isolation.rehearse(1)
        os.write(write, str(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before).encode())
        os._exit(0)
    os.close(write)
    faults = int(os.read(read, 64))
    os.waitpid(pid, 0)
    return faults

cold = faults_of_a_fork_that_runs_the_path()
isolation.rehearse()
gc.collect()
gc.freeze()
print(cold, faults_of_a_fork_that_runs_the_path())
"""
# Measured here: 1,764-1,768 page faults in a fork of the preloaded interpreter, 1,650-1,665 once it rehearsed. What
# is left is mostly the reference counts of what the path touches, which every fork writes again.
FAULTS_SAVED_AT_LEAST = 50


def test_a_fork_of_a_server_that_rehearsed_copies_fewer_pages_when_it_runs_the_path():
    done = subprocess.run([sys.executable, "-c", FAULTS_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cold, warm = (int(figure) for figure in done.stdout.split())
    assert warm <= cold - FAULTS_SAVED_AT_LEAST, (cold, warm)
