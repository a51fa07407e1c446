"""The container boundary: the model's Python and commands run inside one container per run.

- ``engine.py``: which CLI runs containers (Podman or Docker), found and checked; ``ContainerUnavailable``.
- ``image.py``: the local image built from this machine's Debian packages (``rlm container image``).
- ``sandbox.py``: ``RunContainer``, one container per run (root or child), its limits, labels and removal;
  ``sweep_orphans`` for containers whose run was killed.
- ``agent/``: the in-container code (standard library only), mounted read-only at ``/rlm``.

The kernel that runs in it is ``rlmfamily/kernels/container.py``.
"""
