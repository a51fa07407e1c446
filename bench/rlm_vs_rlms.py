"""This library beside the reference `rlms` 0.1.3, on the same needle task against the same fake model server.

Run: .venv/bin/python bench/rlm_vs_rlms.py [--rlms-python PATH] [--mb 2] [--hang-s 30] [--json]

`rlms` is not a dependency of this project. Put it in a virtual environment of its own
(never the project's .venv) and name its interpreter:

    python3 -m venv /tmp/rlms && /tmp/rlms/bin/pip install rlms==0.1.3
    .venv/bin/python bench/rlm_vs_rlms.py --rlms-python /tmp/rlms/bin/python

(or set RLMS_PYTHON). Without it, only this library's rows are measured.

One fake OpenAI-compatible server on 127.0.0.1 plays the model for both. It tells the
two apart by their system prompts and gives each the same program in its own dialect
(``rlms``: a ```repl block that sets ``answer["ready"]``; this library: a ```python block,
its text protocol, that calls ``final_answer``): cut the ~2 MB document into 100,000-
character chunks, ask one batched sub-call per chunk, answer with the one that is not
NONE. Sub-calls are answered from the text they carry, so a right answer means the
chunk holding the needle really reached a sub-call. Usage is four characters a token,
with OpenRouter's ``usage.cost`` at $1 / $4 per million tokens, which both libraries read.

Scenarios, each run in a fresh process of each library with a deadline (``--hang-s``):
- ``needle``: the task with usage reported;
- ``no-usage``: the same with no usage object in the answers (servers that omit it);
- ``runaway``: the root's first program is ``while True: pass``, with each library's
  own time limit set to 5 s (``rlms``: ``max_timeout``; here: ``RLM_STEP_TIMEOUT_S``);
- ``usd-cap``: the task under a $0.05 cap, which the task needs about $0.53 to finish
  (``rlms``: ``max_budget``; here: ``--max-usd``, with the same price given to the table).
It prints, per scenario and library: the outcome, the answer, wall time, the model calls
the server saw, and the tokens and USD the library itself reports. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NEEDLE_CODE = "4417-KESTREL"
QUESTION = "What is the vault code written in the document?"
CHUNK = 100_000
PRICE_IN, PRICE_OUT = 1.0, 4.0  # USD per million tokens, reported as usage.cost
TIME_LIMIT_S = 5
USD_CAP = 0.05
SUB_PROMPT = "What is the vault code in this text? Answer with the code only, or NONE."

RLMS_PROGRAM = f'''```repl
chunks = [context[i:i + {CHUNK}] for i in range(0, len(context), {CHUNK})]
answers = llm_query_batched([{SUB_PROMPT!r} + "\\n\\n" + c for c in chunks])
found = [a.strip() for a in answers if "NONE" not in a]
answer["content"] = found[0] if found else "not found"
answer["ready"] = True
```'''
RLM_PROGRAM = f'''```python
chunks = context.chunk({CHUNK})
answers = llm_query_batched([{SUB_PROMPT!r}] * len(chunks), chunks)
found = [a.text.strip() for a in answers if a.ok and "NONE" not in a.text]
final_answer(found[0] if found else "not found")
```'''
RUNAWAY = {"rlms": "```repl\nwhile True:\n    pass\n```", "rlm": "```python\nwhile True:\n    pass\n```"}


class FakeModel:
    """The model of both libraries: root turns get the program, sub-calls an answer from their own text."""

    def __init__(self, *, usage: bool, runaway: bool) -> None:
        self.usage, self.runaway = usage, runaway
        self.calls = {"root": 0, "subcall": 0}
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                data = json.dumps(fake.answer(body)).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        text = "\n".join(str(m.get("content") or "") for m in messages)
        system = next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")
        dialect = "rlms" if "```repl" in system else "rlm" if "final_answer" in system else None
        with self.lock:
            self.calls["root" if dialect else "subcall"] += 1
            first_root = dialect is not None and self.calls["root"] == 1
        if dialect is None:
            found = re.search(r"the vault code is ([0-9A-Z-]+)", text)
            content = found.group(1) if found else "NONE"
        elif self.runaway and first_root:
            content = RUNAWAY[dialect]
        else:
            content = RLMS_PROGRAM if dialect == "rlms" else RLM_PROGRAM
        payload: dict[str, Any] = {
            "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        }
        if self.usage:
            prompt, completion = len(text) // 4 + 1, len(content) // 4 + 1
            payload["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                "total_tokens": prompt + completion,
                                "cost": (prompt * PRICE_IN + completion * PRICE_OUT) / 1e6}
        return payload

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_document(path: Path, mb: float, seed: int = 7) -> None:
    rng = random.Random(seed)
    words = ["storage", "replica", "latency", "queue", "ledger", "retry", "shard", "index", "backup", "cache"]
    lines: list[str] = []
    size, target = 0, int(mb * 1_000_000) - 1_000  # under RLM_MAX_FILE_BYTES (2,000,000) at the default 2 MB
    while size < target:
        line = f"{size:09d} " + " ".join(rng.choice(words) for _ in range(12)) + "."
        lines.append(line)
        size += len(line) + 1
    lines.insert(rng.randrange(len(lines) // 3, len(lines)), f"Note from the operator: the vault code is {NEEDLE_CODE}.")
    path.write_text("\n".join(lines) + "\n")


RLMS_RUNNER = textwrap.dedent('''
    import json, sys, time
    from rlm import RLM
    args = json.loads(sys.argv[1])
    document = open(args["document"]).read()
    kwargs = {}
    if args.get("time_limit_s"):
        kwargs["max_timeout"] = args["time_limit_s"]
    if args.get("usd_cap"):
        kwargs["max_budget"] = args["usd_cap"]
    started = time.monotonic()
    out = {"library": "rlms"}
    try:
        rlm = RLM(backend="openai", backend_kwargs={"model_name": "fake-model", "base_url": args["base_url"],
                                                    "api_key": "fake-key"},
                  environment="local", max_iterations=6, **kwargs)
        result = rlm.completion(document, root_prompt=args["question"])
        usage = result.usage_summary.to_dict() if result.usage_summary else {}
        out.update(outcome="answered", answer=result.response, usage=usage)
    except BaseException as exc:  # what the user would see
        out.update(outcome="raised", error=f"{type(exc).__name__}: {str(exc)[:160]}")
    out["wall_s"] = round(time.monotonic() - started, 2)
    print(json.dumps(out, default=str))
''')

RLM_RUNNER = textwrap.dedent('''
    import json, sys, time
    from rlmfamily import Context, Session, load_settings
    from rlmfamily.providers.select import build_provider
    args = json.loads(sys.argv[1])
    overrides = dict(provider="openai", protocol="text", base_url=args["base_url"], model="fake-model",
                     api_key_env="BENCH_FAKE_KEY", max_turns=6, data_dir=args["data_dir"],
                     prices_usd_per_mtok={"fake-model": {"prompt": %(in)s, "completion": %(out)s}})
    if args.get("time_limit_s"):
        overrides["step_timeout_s"] = args["time_limit_s"]
    if args.get("usd_cap"):
        overrides["max_usd"] = args["usd_cap"]
    started = time.monotonic()
    out = {"library": "rlm"}
    try:
        settings = load_settings(**overrides)
        context = Context.from_document(args["document"], settings)
        result = Session(context=context, provider=build_provider(settings), settings=settings).run(args["question"])
        b = result.budget
        out.update(outcome=result.stop_reason, answer=result.answer, error=result.error,
                   usage={"calls": b.calls, "tokens": b.tokens, "usd": round(b.usd, 6),
                          "calls_with_unknown_usage": b.unknown_tokens, "calls_with_unknown_cost": b.unknown_usd})
    except BaseException as exc:
        out.update(outcome="raised", error=f"{type(exc).__name__}: {str(exc)[:160]}")
    out["wall_s"] = round(time.monotonic() - started, 2)
    print(json.dumps(out, default=str))
''') % {"in": PRICE_IN, "out": PRICE_OUT}

SCENARIOS = {
    "needle": {"usage": True, "runaway": False},
    "no-usage": {"usage": False, "runaway": False},
    "runaway": {"usage": True, "runaway": True, "time_limit_s": TIME_LIMIT_S},
    "usd-cap": {"usage": True, "runaway": False, "usd_cap": USD_CAP},
}


def run_one(library: str, python: str, scenario: str, document: Path, work: Path, hang_s: float) -> dict[str, Any]:
    spec = SCENARIOS[scenario]
    fake = FakeModel(usage=spec["usage"], runaway=spec["runaway"])
    args = {"document": str(document), "question": QUESTION, "base_url": fake.base_url,
            "data_dir": str(work / f"data-{library}-{scenario}"),
            "time_limit_s": spec.get("time_limit_s"), "usd_cap": spec.get("usd_cap")}
    runner = RLMS_RUNNER if library == "rlms" else RLM_RUNNER
    env = {**os.environ, "BENCH_FAKE_KEY": "fake-key"}
    env.pop("OPENAI_API_KEY", None)
    started = time.monotonic()
    try:
        done = subprocess.run([python, "-c", runner, json.dumps(args)], capture_output=True, text=True,
                              timeout=hang_s, env=env, cwd=work, start_new_session=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else {
            "library": library, "outcome": f"exit {done.returncode}", "error": done.stderr.strip()[-200:]}
    except subprocess.TimeoutExpired as expired:
        _kill_group(expired)
        result = {"library": library, "outcome": f"hung: killed by the bench after {hang_s:g} s"}
    result["process_s"] = round(time.monotonic() - started, 2)
    result["server_calls"] = dict(fake.calls)
    fake.close()
    return result


def _kill_group(expired: subprocess.TimeoutExpired) -> None:
    # subprocess.run killed the interpreter it started; a REPL thread or worker it left behind is in its group.
    pid = getattr(expired, "pid", None)
    if pid:
        try:
            os.killpg(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rlms-python", default=os.environ.get("RLMS_PYTHON"),
                        help="the interpreter of a venv with rlms==0.1.3 (or RLMS_PYTHON)")
    parser.add_argument("--mb", type=float, default=2.0, help="size of the document (default 2 MB)")
    parser.add_argument("--hang-s", type=float, default=30.0, help="a run still going after this is killed")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    libraries = [("rlm", sys.executable)]
    if args.rlms_python:
        check = subprocess.run([args.rlms_python, "-c", "import importlib.metadata as m; print(m.version('rlms'))"],
                               capture_output=True, text=True)
        if check.returncode != 0:
            print(f"{args.rlms_python} cannot import rlms: {check.stderr.strip()[-200:]}", file=sys.stderr)
            return 2
        libraries.append(("rlms", args.rlms_python))
        print(f"rlms {check.stdout.strip()} from {args.rlms_python}", file=sys.stderr)
    else:
        print("rlms not measured: give --rlms-python (see this script's docstring)", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlm-vs-rlms-") as tmp:
        work = Path(tmp)
        document = work / "document.txt"
        write_document(document, args.mb)
        for scenario in args.scenarios.split(","):
            for library, python in libraries:
                row = {"scenario": scenario, **run_one(library, python, scenario, document, work, args.hang_s)}
                rows.append(row)
                if not args.json:
                    print(_line(row), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    return 0


def _line(row: dict[str, Any]) -> str:
    usage = row.get("usage") or {}
    answer = row.get("answer")
    right = "right" if answer and NEEDLE_CODE in str(answer) else "wrong" if answer else "-"
    return (f"{row['scenario']:9} {row['library']:5} {row['outcome'][:44]:44} answer {right:5} "
            f"{row['process_s']:6.2f} s  server calls {row['server_calls']}  reported {json.dumps(usage)[:160]}"
            + (f"  error: {row['error']}" if row.get("error") else ""))


if __name__ == "__main__":
    sys.exit(main())
