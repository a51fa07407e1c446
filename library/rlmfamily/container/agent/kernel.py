"""The container kernel's child: the host kernel's own child process, run inside the container.

Started by ``podman|docker exec -i`` as ``python3 /rlm/kernel.py``: the frames of
the host kernel's protocol travel on this process's stdin and stdout. They are
moved to new descriptors first (not inherited by anything the model starts) and
fds 0 and 1 are pointed at /dev/null and stderr, so a subprocess's output can
never tear a frame. The process leads its own process group, so the host stops
the child and everything it started with one signal (``RunContainer.signal``).
"""

import os
import sys

CHILD_DIR = "/rlm-kernel"  # where the host mounts rlmfamily/kernels/_host_child.py, read-only


def main():
    if os.getpgrp() != os.getpid():  # the engine may have made it a group leader already
        os.setsid()
    fd_in, fd_out = os.dup(0), os.dup(1)  # os.dup's descriptors are not inherited by subprocesses
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    sys.path.insert(0, CHILD_DIR)
    import _host_child

    # The model's code sees the workspace first, as `python -c` would, and neither folder of this machinery.
    sys.path[:] = [""] + [p for p in sys.path if p not in (CHILD_DIR, os.path.dirname(os.path.abspath(__file__)))]
    _host_child._Child(fd_in, fd_out).serve()


if __name__ == "__main__":
    main()
