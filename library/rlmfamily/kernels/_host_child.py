"""The child side of the host kernel: runs the user's own Python, one step at a time.

Started by ``HostKernel`` as ``python _host_child.py <fd_in> <fd_out>``; it talks to
the parent over two pipes with length-prefixed frames (JSON header + binary payload)
and imports nothing but the standard library, so it works in any Python the user
points the kernel at. The parent imports the framing helpers from here, so both
sides share one definition.

What it owns: the persistent namespace (a module named ``__rlm_user__``, so classes
the user defines pickle by reference), bridge proxies that call back into the
parent, the capped stdout/stderr of a step, SIGINT as a step interrupt (raised only
while user code runs, deferred during pipe I/O so frames are never torn), and the
checkpoint taken after each successful step: the definitions of top-level
functions and classes as source, imported modules by name, and the other values
pickled; what cannot be kept is named.

Guardrails, not a security boundary: user code can do anything this process can.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import json
import linecache
import os
import pickle
import resource
import select
import signal
import struct
import sys
import time
import traceback
import types
from typing import Any

FRAME_HEAD = struct.Struct(">II")
USER_MODULE = "__rlm_user__"
_RAISABLE = {
    name: getattr(builtins, name)
    for name in (
        "ArithmeticError", "AssertionError", "AttributeError", "FileNotFoundError", "IndexError", "KeyError",
        "LookupError", "MemoryError", "NameError", "NotImplementedError", "OSError", "OverflowError",
        "PermissionError", "RecursionError", "RuntimeError", "TimeoutError", "TypeError", "ValueError",
        "ZeroDivisionError",
    )
}


class ChannelClosed(Exception):
    """The other side is gone (EOF) or broke the protocol."""


class FrameTimeout(Exception):
    pass


def encode_frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    return FRAME_HEAD.pack(len(raw), len(payload)) + raw + payload


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BrokenPipeError:
            raise ChannelClosed("the other side closed the pipe") from None
        view = view[written:]


class FrameReader:
    """Reads frames from a pipe; ``deadline`` (monotonic seconds) bounds the wait for a frame to begin."""

    def __init__(self, fd: int, max_frame_bytes: int) -> None:
        self.fd = fd
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()

    def _fill(self, need: int, deadline: float | None) -> None:
        while len(self._buffer) < need:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise FrameTimeout()
                ready, _, _ = select.select([self.fd], [], [], remaining)
                if not ready:
                    raise FrameTimeout()
            chunk = os.read(self.fd, max(need - len(self._buffer), 1 << 16))
            if not chunk:
                raise ChannelClosed("the other side closed the pipe")
            self._buffer += chunk

    def read(self, deadline: float | None = None, *, body_timeout_s: float | None = 60.0) -> tuple[dict[str, Any], bytes]:
        self._fill(FRAME_HEAD.size, deadline)
        head_len, payload_len = FRAME_HEAD.unpack(self._buffer[: FRAME_HEAD.size])
        total = FRAME_HEAD.size + head_len + payload_len
        if head_len + payload_len > self.max_frame_bytes:
            raise ChannelClosed(f"frame of {head_len + payload_len} bytes exceeds {self.max_frame_bytes}")
        # Once a frame has begun the writer sends it whole; a stall here means it died or hung.
        self._fill(total, None if body_timeout_s is None else time.monotonic() + body_timeout_s)
        header = json.loads(bytes(self._buffer[FRAME_HEAD.size : FRAME_HEAD.size + head_len]))
        payload = bytes(self._buffer[FRAME_HEAD.size + head_len : total])
        del self._buffer[:total]
        return header, payload


# ---- the child process ----------------------------------------------------------------------


class _CappedWriter:
    """stdout/stderr of a step: the first ``max_bytes`` kept, the rest counted."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0
        self.truncated = False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        self.total += size
        room = self.max_bytes - self.kept
        if size <= room:
            self.parts.append(text)
            self.kept += size
        else:
            self.truncated = True
            if room > 0:
                head = text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
                self.parts.append(head)
                self.kept = self.max_bytes
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return "utf-8"

    def text(self) -> str:
        return "".join(self.parts)


class _Child:
    def __init__(self, fd_in: int, fd_out: int) -> None:
        self.fd_out = fd_out
        self.reader = FrameReader(fd_in, max_frame_bytes=1 << 40)
        self.module = types.ModuleType(USER_MODULE)
        sys.modules[USER_MODULE] = self.module
        self.ns: dict[str, Any] = self.module.__dict__
        self.ns["__builtins__"] = builtins
        self.bridge: list[str] = []
        self.prelude = ""
        self.reserved: set[str] | None = None
        self.defs: dict[str, str] = {}
        self.config: dict[str, Any] = {}
        self.armed = False
        self.interrupt_pending = False
        self.call_seq = 0
        self.calls_this_step = 0

    # -- signals: SIGINT interrupts user code only, never the pipe protocol

    def on_sigint(self, signum: int, frame: Any) -> None:
        if self.armed:
            raise KeyboardInterrupt("step interrupted (step_timeout_s)")
        self.interrupt_pending = True

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        armed, self.armed = self.armed, False
        try:
            write_all(self.fd_out, encode_frame(header, payload))
        finally:
            self.armed = armed

    # -- bridge proxies

    def host_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            request = {"op": "call", "id": self.call_seq + 1, "name": name, "args": list(args), "kwargs": kwargs}
            frame = encode_frame(request)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"arguments to host function {name} must be JSON-like values ({exc})") from None
        if len(frame) > self.config["max_message_bytes"]:
            raise ValueError(
                f"arguments to host function {name} are {len(frame)} bytes; at most "
                f"{self.config['max_message_bytes']} cross the bridge (host_max_checkpoint_bytes)"
            )
        self.call_seq += 1
        call_id = self.call_seq
        armed, self.armed = self.armed, False
        try:
            write_all(self.fd_out, frame)
            while True:
                header, _ = self.reader.read()
                if header.get("op") == "result" and header.get("id") == call_id:
                    break  # replies to calls abandoned by an earlier interrupt are skipped
        finally:
            self.armed = armed
        if self.interrupt_pending and self.armed:
            self.interrupt_pending = False
            raise KeyboardInterrupt("step interrupted (step_timeout_s)")
        if header.get("ok"):
            return header.get("value")
        exc_type = _RAISABLE.get(header.get("exc_type", ""), RuntimeError)
        raise exc_type(header.get("message", "host call failed"))

    def make_proxy(self, name: str) -> Any:
        def proxy(*args: Any, **kwargs: Any) -> Any:
            return self.host_call(name, args, kwargs)

        proxy.__name__ = proxy.__qualname__ = name
        proxy.__doc__ = f"Host function {name} (runs in the parent process)."
        return proxy

    # -- ops

    def op_init(self, header: dict[str, Any]) -> None:
        self.config = header
        self.bridge = list(header["bridge"])
        self.prelude = header["prelude"]
        limit = header.get("max_address_space_bytes")
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        self.send({"op": "ready", "pid": os.getpid()})

    def bind_bridge_and_prelude(self) -> None:
        for name in self.bridge:
            self.ns[name] = self.make_proxy(name)
        before = set(self.ns)
        exec(compile(self.prelude, "<prelude>", "exec"), self.ns)
        if self.reserved is None:
            self.reserved = set(self.bridge) | (set(self.ns) - before)

    def op_step(self, header: dict[str, Any]) -> None:
        code: str = header["code"]
        filename = f"<step-{header['step']}>"
        out = _CappedWriter(self.config["max_output_bytes"])
        ok, error_code, error, exc_type = True, None, None, None
        signal.signal(signal.SIGINT, self.on_sigint)  # user code may have replaced it
        self.interrupt_pending = False
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = out  # type: ignore[assignment]
        stage = "prelude"
        try:
            self.armed = True
            self.bind_bridge_and_prelude()
            stage = "step"
            try:
                compiled = compile(code, filename, "exec")
            except SyntaxError as exc:
                ok, error_code, error = False, "syntax", "".join(traceback.format_exception_only(exc)).strip()
            else:
                linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
                exec(compiled, self.ns)
        except KeyboardInterrupt:
            ok, error_code, error = False, "timeout", "the step was interrupted: it exceeded step_timeout_s"
        except MemoryError:
            ok, error_code, error = False, "memory", "MemoryError: the step exceeded host_max_address_space_bytes"
        except RecursionError as exc:
            ok, error_code, error = False, "recursion", _format_user_error(exc)
        except SystemExit as exc:
            ok, error_code, error = False, "exception", f"SystemExit({exc.code!r}): exit() does not end the kernel"
        except BaseException as exc:  # noqa: BLE001 - the user's error is data for the model
            ok, error_code, error, exc_type = False, "exception", _format_user_error(exc), type(exc).__name__
        finally:
            self.armed = False
            sys.stdout, sys.stderr = saved
        if stage == "prelude" and not ok:
            error = f"the step's prelude failed: {error}"
        self.record_defs(code, filename)
        payload, unkept = (self.checkpoint() if ok else (b"", []))
        self.send(
            {
                "op": "done",
                "ok": ok,
                "error_code": error_code,
                "exc_type": exc_type,
                "error": None if error is None else error[-self.config["max_error_bytes"] :],
                "stdout": out.text(),
                "stdout_bytes": out.total,
                "stdout_truncated": out.truncated,
                "has_checkpoint": ok,
                "unkept": unkept,
            },
            payload,
        )

    def record_defs(self, code: str, filename: str) -> None:
        """Remember the source of top-level defs that now hold their name (restored by re-running them)."""
        try:
            tree = ast.parse(code)
        except SyntaxError:
            return
        lines = code.splitlines(True)
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            value = self.ns.get(node.name)
            code_obj = getattr(value, "__code__", None)
            if isinstance(value, type):
                defined_here = value.__module__ == USER_MODULE
            else:
                defined_here = code_obj is not None and code_obj.co_filename == filename
            if not defined_here:
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            self.defs.pop(node.name, None)  # re-insert: restore order follows definition order
            self.defs[node.name] = "".join(lines[first - 1 : node.end_lineno])

    def checkpoint(self) -> tuple[bytes, list[str]]:
        reserved = self.reserved or set()
        modules: dict[str, str] = {}
        values: dict[str, Any] = {}
        unkept: list[str] = []
        for name, value in self.ns.items():
            if name.startswith("__") or name in reserved:
                continue
            if isinstance(value, types.ModuleType):
                modules[name] = value.__name__
            elif getattr(value, "__module__", None) == USER_MODULE and isinstance(value, (type, types.FunctionType)):
                if name not in self.defs or getattr(value, "__qualname__", None) != name:
                    unkept.append(name)  # a lambda or a def inside a block: no source to re-run
            else:
                values[name] = value
        defs = {name: src for name, src in self.defs.items() if name not in reserved}
        limit = self.config["max_checkpoint_bytes"]
        try:
            blob = pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
            whole = len(blob) <= limit
        except Exception:  # noqa: BLE001 - some value is not picklable; find which, below
            whole = False
        if whole:
            kept: dict[str, bytes] | bytes = blob
            value_names = list(values)
        else:
            kept = {}
            used = 0
            for name, value in values.items():
                try:
                    one = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception:  # noqa: BLE001
                    unkept.append(name)
                    continue
                if used + len(one) > limit:
                    unkept.append(name)
                    continue
                kept[name] = one
                used += len(one)
            value_names = list(kept)
        record = {"modules": modules, "defs": defs, "values": kept, "value_names": value_names, "unkept": sorted(unkept)}
        return pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL), sorted(unkept)

    def op_restore(self, payload: bytes) -> None:
        record = pickle.loads(payload)
        lost = list(record["unkept"])
        try:
            # Values may be instances of prelude classes: those must exist before unpickling.
            self.bind_bridge_and_prelude()
        except Exception:  # noqa: BLE001 - the next step re-runs the prelude and reports its error
            pass
        for name, module in record["modules"].items():
            try:
                self.ns[name] = importlib.import_module(module)
            except Exception:  # noqa: BLE001
                lost.append(name)
        for name, src in record["defs"].items():
            try:
                exec(compile(src, f"<restored {name}>", "exec"), self.ns)
                self.defs[name] = src
            except Exception:  # noqa: BLE001
                lost.append(name)
        values = record["values"]
        if isinstance(values, bytes):
            try:
                self.ns.update(pickle.loads(values))
            except Exception:  # noqa: BLE001 - e.g. a value of a class whose def could not be re-run
                lost.extend(record["value_names"])
        else:
            for name, blob in values.items():
                try:
                    self.ns[name] = pickle.loads(blob)
                except Exception:  # noqa: BLE001
                    lost.append(name)
        self.send({"op": "restored", "lost": sorted(set(lost))})

    def serve(self) -> None:
        signal.signal(signal.SIGINT, self.on_sigint)
        while True:
            try:
                header, payload = self.reader.read()
            except ChannelClosed:
                return
            op = header.get("op")
            if op == "init":
                self.op_init(header)
            elif op == "step":
                self.op_step(header)
            elif op == "restore":
                self.op_restore(payload)
            elif op == "exit":
                return
            # "result" frames for calls abandoned by an interrupt arrive here; they are dropped.


def _format_user_error(exc: BaseException) -> str:
    # The frames of this file (the step runner, bridge proxies) are noise to the model.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip()


def die_with_parent(parent: int) -> None:
    """Be SIGKILLed when the parent dies (Linux; elsewhere nothing changes).

    The child runs in a session of its own (a terminal's Ctrl-C is the parent's), so nothing
    else ties it to its parent: a parent SIGKILLed during ``while True: pass`` left it spinning.
    The signal follows the parent *thread* that started the child; a kernel is started and
    used by the thread that runs its session, which closes it before it ends.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError, ImportError):
        return
    if os.getppid() != parent:  # the parent died before prctl: nothing will signal this process
        os._exit(1)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main(argv: list[str]) -> None:
    # Running this file put its folder first on sys.path; the user's code must not import
    # siblings of this file (monty.py, host.py) by accident. Behave like `python -c`.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path[0] = ""
    fd_in, fd_out = int(argv[1]), int(argv[2])
    if len(argv) > 3:
        die_with_parent(int(argv[3]))
    _Child(fd_in, fd_out).serve()


if __name__ == "__main__":
    main(sys.argv)
