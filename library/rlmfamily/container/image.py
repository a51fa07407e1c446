"""The local container image: ``python3`` (standard library only) and ``bash``, from this machine's Debian packages.

No registry is needed: the image is the files of the installed packages that
python3, bash and a few shell tools depend on (their dependency closure, read with
``dpkg-query``), less documentation, manual pages and translations, put into a tar
archive and imported by the engine (``podman import`` / ``docker import``; ~1 s,
~65 MB on Debian 12). Its tag is a digest of its inputs (the packages and their
versions, and this builder's ``BUILDER_VERSION``), so a build is reused while
nothing changed; the name asked for (``RLM_CONTAINER_IMAGE``'s default) is tagged
onto it. ``rlm container image`` runs this; the tests build it once per machine.

On a machine without dpkg, set ``RLM_CONTAINER_IMAGE`` to any image that provides
``python3`` and ``bash`` (for example ``docker.io/library/python:3.12-slim``, pulled
by you: the library never pulls).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rlmfamily.container.engine import STDERR_SHOWN_CHARS, ContainerUnavailable, Engine, image_present
from rlmfamily.settings import DEFAULT_CONTAINER_IMAGE

BUILDER_VERSION: Final = "2"  # change when what goes into the image changes, so old builds are not reused
IMAGE_REPOSITORY: Final = "localhost/rlmfamily-python"
ROOT_PACKAGES: Final = ("python3", "bash", "coreutils", "grep", "sed", "findutils", "diffutils", "procps")
SKIPPED_PREFIXES: Final = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/locale/", "/usr/share/info/",
                           "/usr/share/lintian/", "/usr/share/bug/")
USR_MERGE_LINKS: Final = (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"))
EMPTY_DIRS: Final = (("tmp", 0o1777), ("workspace", 0o755), ("rlm", 0o755), ("rlm-kernel", 0o755), ("root", 0o700))
ETC_FILES: Final = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}
IMPORT_TIMEOUT_S: Final = 600.0
DPKG_TIMEOUT_S: Final = 120.0
# Waiting for another process's build of the image: its own calls are bounded (dpkg, import, tag, removals), so a
# holder past this is stuck, not slow.
LOCK_WAIT_S: Final = 2 * DPKG_TIMEOUT_S + 2 * IMPORT_TIMEOUT_S
LOCK_POLL_S: Final = 0.1


class ImageBuildFailed(ContainerUnavailable):
    code = "container_image_build_failed"


@dataclass(frozen=True)
class BuiltImage:
    name: str  # the name asked for, tagged onto the build
    build_tag: str  # IMAGE_REPOSITORY:<digest of the inputs>
    reused: bool  # the build of these inputs was there already
    packages: int
    archive_bytes: int  # 0 when reused
    duration_s: float


def build_image(engine: Engine, *, name: str = DEFAULT_CONTAINER_IMAGE) -> BuiltImage:
    """Build (or reuse) the image of this machine's packages in ``engine`` and tag it ``name``."""
    started = time.monotonic()
    packages = package_closure(ROOT_PACKAGES)
    digest = inputs_digest(packages)
    build_tag = f"{IMAGE_REPOSITORY}:{digest[:16]}"
    with _machine_lock():  # two test workers building at once import one archive, not two
        reused = image_present(engine, build_tag)
        size = 0
        if not reused:
            with tempfile.TemporaryDirectory(prefix="rlm-image-") as tmp:
                archive = Path(tmp) / "rootfs.tar"
                write_rootfs(archive, sorted(packages))
                size = archive.stat().st_size
                _engine(engine, "import", str(archive), build_tag)
        if name != build_tag:
            _engine(engine, "tag", build_tag, name)
        if not reused:
            _remove_stale_builds(engine, keep=build_tag)
    return BuiltImage(name=name, build_tag=build_tag, reused=reused, packages=len(packages), archive_bytes=size,
                      duration_s=time.monotonic() - started)


def package_closure(roots: tuple[str, ...]) -> dict[str, str]:
    """The installed packages ``roots`` need, transitively: name -> version (an alternative: the first installed)."""
    listed = _dpkg(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Status}\t${Pre-Depends}, ${Depends}\n"])
    installed: dict[str, tuple[str, list[list[str]]]] = {}
    for line in listed.splitlines():
        package, version, status, depends = (line.split("\t") + ["", "", ""])[:4]
        if not status.endswith(" installed"):
            continue
        alternatives = []
        for clause in depends.split(","):
            names = [re.sub(r"\s*\(.*?\)", "", choice).strip().split(":")[0] for choice in clause.split("|")]
            if any(names):
                alternatives.append([n for n in names if n])
        installed[package] = (version, alternatives)
    missing = [root for root in roots if root not in installed]
    if missing:
        raise ImageBuildFailed(f"the image needs the packages {', '.join(missing)} installed on this machine "
                               f"(apt-get install {' '.join(missing)}), or set RLM_CONTAINER_IMAGE to an image "
                               "that provides python3 and bash", setting="container_image")
    closure: dict[str, str] = {}
    todo = list(roots)
    while todo:
        package = todo.pop()
        if package in closure:
            continue
        version, alternatives = installed[package]
        closure[package] = version
        for choices in alternatives:
            found = next((c for c in choices if c in installed), None)
            if found is not None:
                todo.append(found)
    return closure


def inputs_digest(packages: dict[str, str]) -> str:
    text = "\n".join([f"builder {BUILDER_VERSION}", *(f"{p} {v}" for p, v in sorted(packages.items())),
                      *(f"{k} {v}" for k, v in sorted(ETC_FILES.items()))])
    return hashlib.sha256(text.encode()).hexdigest()


def write_rootfs(archive: Path, packages: list[str]) -> None:
    """The packages' files (through the usr-merge links, as they really are), the empty folders, /etc's two files."""
    listed = _dpkg(["dpkg-query", "-L", *packages])
    files = sorted({line for line in listed.splitlines()
                    if line.startswith("/") and not line.startswith(SKIPPED_PREFIXES)})
    with tarfile.open(archive, "w") as tar:
        added: set[str] = set()

        def add_parents(path: str) -> None:
            parts = path.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                folder = "/".join(parts[:depth])
                if folder and folder not in added:
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                    added.add(folder)

        for link, target in USR_MERGE_LINKS:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
            added.add(link)
        for listed_path in files:
            real = os.path.join(os.path.realpath(os.path.dirname(listed_path)), os.path.basename(listed_path))
            name = real.lstrip("/")
            if name in added or not os.path.lexists(real) or (os.path.isdir(real) and not os.path.islink(real)):
                continue  # folders come from their files' paths
            add_parents(name)
            tar.add(real, arcname=name, recursive=False)
            added.add(name)
            for compiled in _bytecode_of(real):
                compiled_name = compiled.lstrip("/")
                if compiled_name not in added:
                    add_parents(compiled_name)
                    tar.add(compiled, arcname=compiled_name, recursive=False)
                    added.add(compiled_name)
        for folder, mode in EMPTY_DIRS:
            if folder not in added:
                info = tarfile.TarInfo(folder)
                info.type, info.mode = tarfile.DIRTYPE, mode
                tar.addfile(info)
        add_parents("etc/x")
        for name, text in ETC_FILES.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


def _bytecode_of(path: str) -> list[str]:
    """The bytecode Debian compiled for a module at install time (``__pycache__/<name>.cpython-3X.pyc``).

    dpkg does not list it (the packages' scripts write it), yet without it every Python start in the read-only
    image compiles what it imports again: ``import unittest, subprocess`` cost ~150 ms a process, ~15 ms with it.
    The archive keeps each file's mtime, which is what the bytecode is checked against.
    """
    if not path.endswith(".py"):
        return []
    folder, name = os.path.split(path)
    cache = os.path.join(folder, "__pycache__")
    stem = name[:-3] + "."
    try:
        return sorted(os.path.join(cache, entry) for entry in os.listdir(cache)
                      if entry.startswith(stem) and entry.endswith(".pyc") and entry.count(".") == 2)
    except OSError:
        return []


def _remove_stale_builds(engine: Engine, *, keep: str) -> None:
    """Untag earlier builds (their packages changed since); one still used by a container stays."""
    listed = engine.call("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPOSITORY)
    stale = [tag for tag in listed.stdout.split()
             if tag != keep and re.fullmatch(re.escape(IMAGE_REPOSITORY) + r":[0-9a-f]{16}", tag)]
    for tag in stale:
        engine.call("rmi", tag)


def _dpkg(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        raise ImageBuildFailed(f"building the local image needs {argv[0]} (a Debian or Ubuntu machine); elsewhere set "
                               "RLM_CONTAINER_IMAGE to an image that provides python3 and bash", setting="container_image")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=DPKG_TIMEOUT_S)
    if done.returncode != 0 and not done.stdout:
        raise ImageBuildFailed(f"{argv[0]} failed: {done.stderr.strip()[:STDERR_SHOWN_CHARS]}", setting="container_image")
    return done.stdout


def _engine(engine: Engine, *args: str) -> None:
    done = engine.call(*args, timeout_s=IMPORT_TIMEOUT_S)
    if done.returncode != 0:
        raise ImageBuildFailed(f"{engine.kind} {args[0]} failed (exit {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[:STDERR_SHOWN_CHARS]}", setting="container_engine")


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    path = Path(tempfile.gettempdir()) / f"rlmfamily-image-{os.getuid()}.lock"
    with open(path, "a+b") as handle:
        give_up = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    raise ImageBuildFailed(
                        f"another process has been building the image for over {LOCK_WAIT_S:g} s (it holds {path}); "
                        "stop it, or set RLM_CONTAINER_IMAGE to an image that provides python3 and bash",
                        setting="container_image") from None
                time.sleep(LOCK_POLL_S)  # flock announces nothing: the holder's release is polled
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
