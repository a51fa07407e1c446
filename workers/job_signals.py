"""Imported first by the job processes' forkserver (``workers.isolation.PRELOAD``): Ctrl-C is not theirs.

A job's process is forked from the forkserver with the signal handlers the forkserver had once it imported its
preload, so with SIGINT ignored here no job process can die of a ``KeyboardInterrupt`` while it starts. Ctrl-C
reaches the whole process group of a terminal's `specialists serve`, and a job process forked at that moment is
still in it (it takes a group of its own only once its body runs); it printed a traceback from multiprocessing's
bootstrap (the forkserver's before issue 44; ours, ``workers.isolation._serve``, imports this module first). The
worker stops its job processes itself (its control pipe, then SIGKILL to the job's group).
"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
