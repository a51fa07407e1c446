"""The container's main process: it lives exactly as long as the host holds its stdin open, and signals for it.

The host keeps the write end of this process's stdin (through the engine's
``run -i``) in the run's process. When that process ends, however it ends (a
SIGKILL included), the pipe reaches end of file, this process exits, and with it
the container (``--rm`` removes it). It says ``ready`` once on stdout so the host
waits on an event, not a clock.

It also answers the host, one line each way, so that stopping a process never
needs a new process in the container (a fork bomb may have taken every slot):

    signal PID SIG GROUP  ->  ok | gone | error ...    (GROUP 1: the process group PID)
    oom                   ->  N | unknown              (processes the memory limit killed so far)

As process 1 it also reaps the orphans that exited commands leave behind, so they
do not hold slots under the pids limit.
"""

import os
import signal
import sys

OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")  # cgroups v2, v1


def _reap(signum, frame):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal(pid, sig, group):
    if pid <= 1:
        return "error pid must be above 1"
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except ProcessLookupError:
        return "gone"
    except OSError as exc:
        return f"error {exc}"
    return "ok"


def _oom_kills():
    for path in OOM_FILES:
        try:
            with open(path) as handle:
                for line in handle:
                    if line.startswith("oom_kill "):
                        return str(int(line.split()[1]))
        except (OSError, ValueError):
            continue
    return "unknown"


def _answer(line):
    words = line.split()
    if len(words) == 4 and words[0] == "signal":
        try:
            return _signal(int(words[1]), int(words[2]), words[3] == "1")
        except ValueError:
            return "error bad numbers"
    if words == ["oom"]:
        return _oom_kills()
    return "error unknown request"


def main():
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline(1024)
        if not line:
            return
        out.write(_answer(line.decode("ascii", "replace")) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
