"""The job processes' fork server's heap in huge pages (``workers.isolation.collapse_heap``, issue 44).

A fork copies, and an exit drops, one page-table entry for each 2 MiB huge page of the server's heap instead of 512;
what a job's process writes must still be copied alone (a 4 KiB page), never the whole huge page. Checked in a fresh
interpreter (a subprocess): an anonymous mapping collapsed, then written by a forked child.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workers.isolation import _heap_ranges

HUGE = 2 << 20
ROOT = Path(__file__).resolve().parents[2]


def test_only_the_huge_page_aligned_parts_of_private_writable_anonymous_mappings_and_the_heap_are_collapsed():
    maps = "\n".join([
        "00400000-00a00000 rw-p 00000000 00:00 0 ",  # anonymous: 0x400000-0xa00000, 6 MiB aligned
        "00a00000-00b00000 rw-p 00000000 00:00 0                          [heap]",  # 1 MiB: no whole huge page
        "01100000-01600000 rw-p 00000000 00:00 0                          [heap]",  # 0x1200000-0x1600000
        "02000000-02800000 r--p 00000000 00:00 0 ",  # read-only
        "03000000-03800000 rw-s 00000000 00:01 7                          /dev/zero (deleted)",  # shared
        "04000000-04800000 rw-p 00001000 08:01 123                        /usr/lib/libpython3.11.so",  # a file's
        "7ffc00000000-7ffc00800000 rw-p 00000000 00:00 0                  [stack]",
    ])
    assert _heap_ranges(maps, HUGE) == [(0x400000, 0xA00000), (0x1200000, 0x1600000)]


PROBE = """
import json, mmap, os, sys
from workers.isolation import collapse_heap

def smaps_of(pid, address):
    fields, inside = {}, False
    for line in open(f"/proc/{pid}/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head.endswith(":") and line.split()[-1] == "kB":
            fields[head[:-1]] = int(line.split()[1])
    return fields

region = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
region.write(b"x" * (8 << 20))
import ctypes
address = ctypes.addressof(ctypes.c_char.from_buffer(region)) + (4 << 20)
collapsed = collapse_heap()
parent = smaps_of(os.getpid(), address)
read, write = os.pipe()
hold_r, hold_w = os.pipe()  # the parent's end open: the child lives until it is killed, or its parent is gone
pid = os.fork()
if pid == 0:
    os.close(hold_w)
    region[4 << 20] = ord("y")  # one byte of a huge page the parent shares
    os.write(write, b".")
    os.read(hold_r, 1)  # killed by the parent once it has read its smaps (EOF if the parent died first)
    os._exit(0)
os.read(read, 1)
child = smaps_of(pid, address)
os.kill(pid, 9)
os.waitpid(pid, 0)
print(json.dumps({"collapsed": collapsed, "parent": parent, "child": child,
                  "unchanged": region[(4 << 20) + 1] == ord("x") and region[4 << 20] == ord("x")}))
"""


def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")]


def test_a_collapsed_heap_is_in_huge_pages_and_a_forked_process_that_writes_one_copies_only_a_small_page():
    if _thp_mode() in (None, "never"):
        pytest.skip("this kernel has no transparent huge pages")
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True,
                          timeout=60)
    seen = json.loads(done.stdout)
    if seen["collapsed"] == 0:
        pytest.skip(f"this kernel does not collapse on demand (MADV_COLLAPSE, Linux 6.1): {seen}")
    assert seen["parent"]["AnonHugePages"] >= 4096, seen  # the 8 MiB region's aligned part, at least 2 huge pages
    child = seen["child"]
    assert child["Private_Dirty"] <= 64, seen  # the page it wrote (and no more than a few), not 2 MiB of it
    assert child["AnonHugePages"] >= 2048, seen  # what it did not write is still shared in huge pages
    assert seen["unchanged"], seen  # the parent's copy is its own
