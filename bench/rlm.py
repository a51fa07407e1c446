"""Benchmark of the RLM session: how much of a 10 MB corpus the root model has to see.

Run: .venv/bin/python bench/rlm.py [--mb 10] [--kernels host,monty] [--with-kernel-bench]

Builds a git repository of generated service logs (about ``--mb`` megabytes, one
fact hidden in one file), then runs a scripted investigation in each kernel:
search for the fact's marker, chunk the file it is in, ask a batch of sub-calls
about the chunks, and answer from what they return. It prints the characters
sent to the root model (every root request counted in full, as an API bills it)
and to sub-calls, next to the baseline of stuffing the whole corpus into one
prompt. The corpus is ASCII, so characters are bytes. A benchmark, not a test:
it never fails on speed. ``--with-kernel-bench`` also runs bench/rlm_kernels.py
(per-step overhead, host-call round trip, checkpoint size and time).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlmfamily import Context, ScriptedProvider, Session, load_settings  # noqa: E402
from rlmfamily.trajectory import read_trajectory  # noqa: E402

FILE_BYTES = 50_000
NEEDLE = "ESCALATION-CODE"
ANSWER = "7Q-ORCHID-41"
QUESTION = "Which escalation code did the on-call engineer use during the storage outage, and in which file is it?"

SCRIPT = {
    "model": "scripted-bench",
    "default_answer": "NONE",
    "root": [
        {"code": (
            "s = context.stats()\n"
            "print(s['files'], 'files', s['bytes'], 'bytes', [f['folder'] for f in s['top_folders']])\n"
            f"hits = context.search(r'{NEEDLE}', 5)\n"
            "print([(h['path'], h['line']) for h in hits])\n"
        )},
        {"code": (
            "target = hits[0]['path']\n"
            "chunks = context.select(target).chunk(8000, 400)\n"
            "notes = llm_query_batched(['Which escalation code was used during the storage outage? "
            "Answer with the code or NONE.'] * len(chunks), chunks)\n"
            "codes = [n.text for n in notes if n.ok and n.text != 'NONE']\n"
            "print(len(chunks), 'chunks', codes)\n"
        )},
        {"code": "final_answer({'code': codes[0], 'file': target})"},
    ],
    "subcall": [
        {"pattern": r"storage outage[^\n]*" + NEEDLE + r" (\S+)\.", "answer": r"\1"},
    ],
}


def build_corpus(root: Path, total_bytes: int) -> tuple[int, str]:
    """A git repository of ~total_bytes of logs; returns (bytes, path of the file holding the fact)."""
    rng = random.Random(11)
    services = ["billing", "storage", "search", "auth", "render", "mail", "queue", "edge"]
    files = max(1, total_bytes // FILE_BYTES)
    needle_file = ""
    written = 0
    for index in range(files):
        service = services[index % len(services)]
        folder = root / "services" / service
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        size = 0
        while size < FILE_BYTES:
            line = (f"2024-05-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} "
                    f"{service} worker-{rng.randint(1, 40)} handled request {rng.getrandbits(48):012x} "
                    f"in {rng.randint(1, 900)} ms status {rng.choice([200, 200, 200, 204, 404, 500])}\n")
            lines.append(line)
            size += len(line)
        if index == files * 2 // 3:
            needle_file = f"services/{service}/log-{index:04d}.txt"
            lines[len(lines) // 2] = (f"note: during the storage outage the on-call engineer used {NEEDLE} "
                                      f"{ANSWER}.\n")
        text = "".join(lines)
        (folder / f"log-{index:04d}.txt").write_text(text)
        written += len(text)
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=b", "-c", "user.email=b@x", "commit", "-qm", "c"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    return written, needle_file


def run_once(kernel: str, repo: Path, data: Path, script: Path) -> dict[str, object]:
    settings = load_settings(data_dir=data, kernel=kernel)
    started = time.perf_counter()
    context = Context.from_repository(repo, settings)
    loaded = time.perf_counter()
    result = Session(context=context, provider=ScriptedProvider.from_file(script), settings=settings).run(QUESTION)
    finished = time.perf_counter()
    events = read_trajectory(result.trajectory_path)
    subcall_chars = sum(e["prompt_chars"] + e["context_chars"] for e in events if e["event"] == "subcall")
    answer = json.loads(result.answer or "{}")
    return {
        "ok": result.stop_reason == "answered" and answer.get("code") == ANSWER,
        "answer": answer,
        "root_chars": result.root_chars_sent,
        "root_largest": result.root_chars_last,
        "subcall_chars": subcall_chars,
        "subcalls": result.subcalls,
        "turns": result.turns,
        "load_s": loaded - started,
        "run_s": finished - loaded,
        "corpus_bytes": result.corpus_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="corpus size in megabytes (default 10)")
    parser.add_argument("--kernels", default="host,monty", help="kernels to run (default host,monty)")
    parser.add_argument("--with-kernel-bench", action="store_true", help="also run bench/rlm_kernels.py")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlm-bench-") as tmp:
        repo, data, script = Path(tmp, "corpus"), Path(tmp, "data"), Path(tmp, "script.json")
        repo.mkdir()
        script.write_text(json.dumps(SCRIPT))
        started = time.perf_counter()
        corpus_bytes, needle_file = build_corpus(repo, int(args.mb * 1_000_000))
        print(f"corpus: {corpus_bytes:,} bytes in {corpus_bytes // FILE_BYTES} git-tracked files "
              f"(built in {time.perf_counter() - started:.1f} s); the fact is in {needle_file}")
        baseline = corpus_bytes + len(QUESTION)
        print(f"baseline, the whole corpus stuffed into one prompt: {baseline:,} characters per root request\n")
        header = f"{'kernel':<7} {'root saw':>12} {'vs corpus':>10} {'baseline/root':>14} {'largest req':>12} " \
                 f"{'sub-call in':>12} {'calls':>6} {'load s':>7} {'run s':>6}  answer"
        print(header)
        print("-" * len(header))
        for kernel in [k.strip() for k in args.kernels.split(",") if k.strip()]:
            r = run_once(kernel, repo, data, script)
            root = int(r["root_chars"])  # type: ignore[arg-type]
            print(f"{kernel:<7} {root:>12,} {root / corpus_bytes:>10.5f} {baseline / root:>13,.0f}x "
                  f"{int(r['root_largest']):>12,} {int(r['subcall_chars']):>12,} "  # type: ignore[arg-type]
                  f"{int(r['subcalls']) + int(r['turns']):>6} {float(r['load_s']):>7.2f} "  # type: ignore[arg-type]
                  f"{float(r['run_s']):>6.2f}  {'correct' if r['ok'] else 'WRONG'} {r['answer']}")  # type: ignore[arg-type]
        print("\nroot saw: characters of every root request summed (the conversation is resent each turn);\n"
              "sub-call in: prompt + context characters sent to sub-calls (each a bounded slice of one file).")
    if args.with_kernel_bench:
        print("\n== bench/rlm_kernels.py ==", flush=True)
        subprocess.run([sys.executable, str(Path(__file__).with_name("rlm_kernels.py"))], check=False)


if __name__ == "__main__":
    main()
