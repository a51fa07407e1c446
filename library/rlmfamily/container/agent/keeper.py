"""The container's main process: it lives exactly as long as the host holds its stdin open.

The host keeps the write end of this process's stdin (through the engine's
``run -i``) in the run's process. When that process ends, however it ends (a
SIGKILL included), the pipe reaches end of file, this process exits, and with it
the container (``--rm`` removes it). It says ``ready`` once on stdout so the host
waits on an event, not a clock. As process 1 it also reaps the orphans that
exited commands leave behind, so they do not hold slots under the pids limit.
"""

import os
import signal
import sys


def _reap(signum, frame):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main():
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    stdin = sys.stdin.buffer
    while stdin.read1(65536):
        pass


if __name__ == "__main__":
    main()
