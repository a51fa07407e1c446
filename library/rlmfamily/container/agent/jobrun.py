"""One command job inside a run's container: the in-container half of the bash broker's launcher.

Runs with the image's ``python3`` and its standard library only (nothing of
rlmfamily is importable here). The host starts it through the engine
(``<engine> exec -i -w WORKDIR -e ... CONTAINER python3 /rlm/jobrun.py``) and
speaks to it over the exec session's three streams:

- stdin: one line ``DEADLINE_S GRACE_S MARKER_HEX COMMAND_BYTES``, then the
  command's UTF-8 bytes, then nothing: the host holds stdin open while it waits.
  Its end (EOF) means the host's engine client is gone (the job was cancelled,
  or the run died): the command's process group is killed at once.
- stdout: the command's stdout, byte for byte.
- stderr: the command's stderr, byte for byte, then this runner's report as the
  stream's last line: the marker, then JSON ``{"exit_code", "stopped_by",
  "pid"}``. ``exit_code`` is as Python's ``Popen.returncode`` has it on the host
  (``-N`` when signal N ended the command), so the receipt reads the same. When
  Bash cannot be started, ``exit_code`` is null and ``error`` says why.
- the exit status: the command's (128+N when signal N ended it).

The command is ``bash --noprofile --norc -c COMMAND`` in its own session (its own
process group), in this process's working directory, with this process's
environment (the engine sets both). At the deadline the group gets SIGTERM, then
SIGKILL after the grace; when the command's main process ends, whatever it left
in its group is killed (a background process does not outlive its job), exactly
as the host broker does. A process that left the group (its own ``setsid``) is
out of reach of the job, as on the host; it dies with the container, at the
run's end. The container's main process (keeper.py) reaps what is killed.

It imports only ``os``, ``sys``, ``select`` and ``time``: an image's standard
library may have no bytecode and a read-only root, so every other module would
be compiled from source at each job's start (subprocess, threading and json
cost 0.1-0.3 s that way, measured).
"""

import os
import select
import sys
import time

MAX_COMMAND_BYTES = 4 << 20  # RLM_BASH_MAX_COMMAND_CHARS is at most 10^6 characters, 4 bytes each in UTF-8
MAX_HEADER_BYTES = 256
READ_CHUNK_BYTES = 65_536
READER_JOIN_S = 5.0  # after the group is gone its pipes close; a process that escaped it may hold them
EXIT_POLL_S = 0.05  # how often the leader is looked at where pidfd_open is missing (Python < 3.9, Linux < 5.3)
SIGKILL, SIGTERM, SIGPIPE = 9, 15, 13  # Linux's numbers (a container is Linux); the signal module costs an import
EXIT_BAD_REQUEST = 2
EXIT_NOT_STARTED = 127  # as a shell's "command not found"


def read_exactly(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, min(READ_CHUNK_BYTES, size - len(data)))
        if not chunk:
            raise ValueError(f"the request ended after {len(data)} of {size} bytes")
        data += chunk
    return data


def read_request():
    """(deadline_s, grace_s, marker, command) from stdin; nothing past the command is read."""
    line = b""
    while not line.endswith(b"\n"):
        if len(line) >= MAX_HEADER_BYTES:
            raise ValueError(f"the request's first line is over {MAX_HEADER_BYTES} bytes")
        byte = os.read(0, 1)
        if not byte:
            raise ValueError("the request ended before its first line did")
        line += byte
    fields = line.split()
    if len(fields) != 4:
        raise ValueError("the request's first line is DEADLINE_S GRACE_S MARKER_HEX COMMAND_BYTES")
    deadline_s, grace_s, size = float(fields[0]), float(fields[1]), int(fields[3])
    if not (deadline_s > 0 and grace_s > 0 and 0 < size <= MAX_COMMAND_BYTES):
        raise ValueError("deadline_s and grace_s must be positive, and the command 1 to "
                         f"{MAX_COMMAND_BYTES} bytes")
    return deadline_s, grace_s, bytes.fromhex(fields[2].decode()), read_exactly(0, size)


def json_string(text):
    """``text`` as a JSON string (ASCII, escaped by hand: the json module costs an import)."""
    def escaped(c):
        units = c.encode("utf-16-be")  # past U+FFFF: two escapes (a surrogate pair), as JSON has it
        return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))

    return ('"' + "".join(c if " " <= c <= "~" and c not in '"\\' else escaped(c) for c in text) + '"').encode()


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def leader_ended(pid):
    """The leader has exited (it is not reaped: while it is a zombie its group id cannot be reused)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


class Job:
    """The command's process group, its two pipes relayed, its deadline, its cancel."""

    def __init__(self, command, deadline_s, grace_s):
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            self.pid = os.posix_spawnp(
                "bash", ["bash", "--noprofile", "--norc", "-c", command], dict(os.environ),
                file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                              (os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_DUP2, err_write, 2)],
                setsid=True, setsigdef=(SIGPIPE,),  # Python ignores SIGPIPE; a command must not inherit that
            )
        finally:
            os.close(out_write)
            os.close(err_write)
        self.pipes = {out_read: 1, err_read: 2}  # our read end -> the stream it is relayed to
        self.give_up = time.monotonic() + deadline_s
        self.grace_s = grace_s
        self.stopped_by = None
        self.ended = False
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def run(self):
        """Relay until the leader ended and its pipes closed (or READER_JOIN_S after); the status, reaped."""
        poller = select.poll()
        for fd in self.pipes:
            poller.register(fd, select.POLLIN)
        poller.register(0, select.POLLIN)
        if self.pidfd is not None:
            poller.register(self.pidfd, select.POLLIN)
        while not self.ended or (self.pipes and time.monotonic() < self.give_up):
            wait_s = max(0.0, self.give_up - time.monotonic())
            if self.pidfd is None and not self.ended:
                wait_s = min(wait_s, EXIT_POLL_S)
            for fd, _ in poller.poll(int(wait_s * 1000) + 1):
                if fd == 0:
                    self._stdin(poller)
                elif fd == self.pidfd:
                    poller.unregister(fd)
                    self._leader_ended()
                elif fd in self.pipes:
                    self._relay(fd, poller)
            if not self.ended and self.pidfd is None and leader_ended(self.pid):
                self._leader_ended()
            if time.monotonic() >= self.give_up and not self.ended:
                self._past_deadline()
        for fd in list(self.pipes):
            os.close(fd)
        if self.pidfd is not None:
            os.close(self.pidfd)
        _, status = os.waitpid(self.pid, 0)
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def _relay(self, fd, poller):
        chunk = os.read(fd, READ_CHUNK_BYTES)
        if chunk:
            try:
                write_all(self.pipes[fd], chunk)
            except OSError:  # the host stopped reading: it is gone, and its cancel comes by stdin
                pass
            return
        poller.unregister(fd)
        os.close(fd)
        del self.pipes[fd]

    def _stdin(self, poller):
        if os.read(0, READ_CHUNK_BYTES):
            return  # nothing is sent after the request; ignored
        poller.unregister(0)
        if not self.ended:
            self.stopped_by = "cancel"
            signal_group(self.pid, SIGKILL)

    def _past_deadline(self):
        if self.stopped_by is None:
            self.stopped_by = "deadline"
            signal_group(self.pid, SIGTERM)
            self.give_up = time.monotonic() + self.grace_s
        else:
            signal_group(self.pid, SIGKILL)
            self.give_up = time.monotonic() + READER_JOIN_S

    def _leader_ended(self):
        self.ended = True
        signal_group(self.pid, SIGKILL)  # what is left of the group: all of it at a deadline or a cancel
        self.give_up = time.monotonic() + READER_JOIN_S


def main():
    try:
        deadline_s, grace_s, marker, command = read_request()
        command = command.decode("utf-8", "surrogateescape")  # back to the bytes the host was given
    except ValueError as exc:
        write_all(2, f"jobrun: {exc}\n".encode())
        return EXIT_BAD_REQUEST
    try:
        job = Job(command, deadline_s, grace_s)
    except OSError as exc:  # no Bash in the image, a command over the kernel's argument size: it never started
        write_all(2, f"jobrun: bash cannot be started: {exc}\n".encode() + marker + b'{"exit_code": null, '
                  b'"stopped_by": null, "pid": null, "error": %s}\n' % json_string(str(exc)))
        return EXIT_NOT_STARTED
    code = job.run()
    stopped_by = b"null" if job.stopped_by is None else b'"%s"' % job.stopped_by.encode()
    try:
        write_all(2, marker + b'{"exit_code": %d, "stopped_by": %s, "pid": %d}\n' % (code, stopped_by, job.pid))
    except OSError:
        pass
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
