"""One command job inside a run's container: the in-container half of the bash broker's launcher.

Runs with the image's ``python3`` and its standard library only (nothing of
rlmfamily is importable here). The host starts it through the engine
(``<engine> exec -i -w WORKDIR -e ... CONTAINER python3 /rlm/jobrun.py``) and
speaks to it over the exec session's three streams:

- stdin: one line of JSON, ``{"command", "deadline_s", "grace_s", "marker"}``
  (at most ``MAX_HEADER_BYTES``), then nothing: the host holds it open while it
  waits. Its end (EOF) means the host's engine client is gone (the job was
  cancelled, or the run died): the command's process group is killed at once.
- stdout: the command's stdout, byte for byte.
- stderr: the command's stderr, byte for byte, then this runner's report as the
  stream's last line: ``marker`` followed by JSON ``{"exit_code", "stopped_by",
  "pid"}``. ``exit_code`` is as Python's ``Popen.returncode`` has it on the host
  (``-N`` when signal N ended the command), so the receipt reads the same.
- the exit status: the command's (128+N when signal N ended it).

The command is ``bash --noprofile --norc -c COMMAND`` in its own session (its own
process group), in this process's working directory, with this process's
environment (the engine sets both). At ``deadline_s`` the group gets SIGTERM,
then SIGKILL after ``grace_s``; when the command's main process ends, whatever it
left in its group is killed (a background process does not outlive its job),
exactly as the host broker does. A process that left the group (its own
``setsid``) is out of reach of the job, as on the host; it dies with the
container, at the run's end. This runner is the subreaper of what the command
starts, so the processes it kills are reaped here, not left as zombies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

MAX_HEADER_BYTES = 8 << 20  # the command (RLM_BASH_MAX_COMMAND_CHARS, at most 10^6 characters) as JSON
READ_CHUNK_BYTES = 65_536
READER_JOIN_S = 5.0  # after the group is gone its pipes close; a process that escaped it may hold them
PR_SET_CHILD_SUBREAPER = 36
EXIT_BAD_REQUEST = 2
EXIT_NO_BASH = 127  # as a shell's "command not found"


class Relay:
    """Copies one of the command's pipes to one of this process's streams until told to stop."""

    def __init__(self, source: int, target: int) -> None:
        self.source, self.target = source, target
        self.lock = threading.Lock()
        self.open = True  # False: the report follows, nothing more of the command is written
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        try:
            while chunk := os.read(self.source, READ_CHUNK_BYTES):
                with self.lock:
                    if self.open:
                        write_all(self.target, chunk)
        except OSError:  # the host stopped reading: it is gone, and the cancel comes by stdin
            pass
        finally:
            os.close(self.source)

    def close(self) -> None:
        self.thread.join(READER_JOIN_S)
        with self.lock:
            self.open = False


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_header() -> dict:
    line = sys.stdin.buffer.readline(MAX_HEADER_BYTES + 1)
    if not line.endswith(b"\n"):
        raise ValueError(f"the request is not one line of at most {MAX_HEADER_BYTES} bytes")
    header = json.loads(line)
    if not isinstance(header.get("command"), str) or not isinstance(header.get("marker"), str):
        raise ValueError("the request needs a command and a marker")
    for name in ("deadline_s", "grace_s"):
        if not isinstance(header.get(name), (int, float)) or not header[name] > 0:
            raise ValueError(f"{name} must be a positive number of seconds")
    return header


def become_subreaper() -> None:
    """Orphans of the command are re-parented here (not to the container's init), so they are reaped here."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass  # without it the container's init reaps them


def watch_stdin(cancelled: threading.Event, ended: threading.Event) -> None:
    try:
        while os.read(0, READ_CHUNK_BYTES):
            pass
    except OSError:
        pass
    cancelled.set()
    ended.set()


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap_orphans() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def supervise(process: subprocess.Popen, deadline_s: float, grace_s: float,
              cancelled: threading.Event, ended: threading.Event) -> str | None:
    """Wait for the command; at its deadline (or a cancel) stop its whole group. Its leftovers never outlive it.

    The leader is waited for without being reaped (``WNOWAIT``): while it is a zombie its process group id
    cannot be reused, so the group signalled is certainly this job's.
    """

    def wait_unreaped() -> None:
        try:
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        ended.set()

    threading.Thread(target=wait_unreaped, daemon=True).start()
    stopped_by = None
    ended.wait(deadline_s)
    if cancelled.is_set():
        stopped_by = "cancel"
    elif not ended.is_set():
        stopped_by = "deadline"
        signal_group(process.pid, signal.SIGTERM)
        ended.wait(grace_s)
        if cancelled.is_set():
            stopped_by = "cancel"
    signal_group(process.pid, signal.SIGKILL)  # what is left of the group: all of it at a deadline or a cancel
    process.wait()
    return stopped_by


def main() -> int:
    try:
        header = read_header()
    except (ValueError, UnicodeDecodeError) as exc:
        sys.stderr.write(f"jobrun: {exc}\n")
        return EXIT_BAD_REQUEST
    become_subreaper()
    cancelled, ended = threading.Event(), threading.Event()
    try:
        process = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-c", header["command"]], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
        )
    except OSError as exc:  # no Bash in the image: said on stderr, with a report, as a shell says it
        report = {"exit_code": EXIT_NO_BASH, "stopped_by": None, "pid": None}
        write_all(2, f"jobrun: bash cannot be started: {exc}\n".encode() + header["marker"].encode()
                  + json.dumps(report).encode() + b"\n")
        return EXIT_NO_BASH
    relays = [Relay(os.dup(process.stdout.fileno()), 1), Relay(os.dup(process.stderr.fileno()), 2)]
    process.stdout.close()
    process.stderr.close()
    threading.Thread(target=watch_stdin, args=(cancelled, ended), daemon=True).start()
    stopped_by = supervise(process, float(header["deadline_s"]), float(header["grace_s"]), cancelled, ended)
    for relay in relays:
        relay.close()
    reap_orphans()
    code = process.returncode
    report = {"exit_code": code, "stopped_by": stopped_by, "pid": process.pid}
    try:
        write_all(2, header["marker"].encode() + json.dumps(report).encode() + b"\n")
    except OSError:
        pass
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
