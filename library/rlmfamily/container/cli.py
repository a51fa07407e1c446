"""``rlm container image``: build (or reuse) the container kernel's local image; ``rlm container sweep``: remove
the containers of runs that are gone.

``image`` builds the image of this machine's Debian packages (rlmfamily/container/image.py)
in the engine ``RLM_CONTAINER_ENGINE`` picks (or ``--engine``) and tags it as
``RLM_CONTAINER_IMAGE`` (or ``--name``); it prints the name, the build's tag and whether
the build was reused. ``sweep`` does now what every container run does at its start.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from rlmfamily.container.engine import ENGINE_KINDS, find_engine
from rlmfamily.settings import RLMSettings

COMMANDS = ("container",)
EXIT_OK = 0


def add_parsers(sub: Any) -> None:
    container = sub.add_parser("container", help="the container kernel: build its local image, sweep orphans")
    actions = container.add_subparsers(dest="container_command", required=True)
    image = actions.add_parser("image", help="build or reuse the local image (python3 and bash from this "
                                              "machine's Debian packages)")
    image.add_argument("--engine", choices=ENGINE_KINDS, help="podman or docker (RLM_CONTAINER_ENGINE; default auto)")
    image.add_argument("--name", help="the name to tag it with (RLM_CONTAINER_IMAGE)")
    image.add_argument("--json", action="store_true")
    sweep = actions.add_parser("sweep", help="remove this machine's containers whose run's process is gone")
    sweep.add_argument("--engine", choices=ENGINE_KINDS, help="podman or docker (RLM_CONTAINER_ENGINE; default auto)")
    sweep.add_argument("--json", action="store_true")


def main(args: argparse.Namespace, settings: RLMSettings, out: Console, err: Console) -> int:
    if args.engine:
        settings = settings.model_copy(update={"container_engine": args.engine})
    engine = find_engine(settings, check_image=False)
    if args.container_command == "sweep":
        from rlmfamily.container.sandbox import sweep_orphans

        removed = sweep_orphans(engine)
        if args.json:
            out.print_json(json.dumps({"engine": engine.kind, "removed": removed}))
            return EXIT_OK
        out.print(f"{engine.kind}: removed {len(removed)} orphaned container(s)"
                  + (f": {', '.join(removed)}" if removed else ""), markup=False, highlight=False)
        return EXIT_OK
    from rlmfamily.container.image import build_image

    built = build_image(engine, name=args.name or settings.container_image)
    if args.json:
        out.print_json(json.dumps({"engine": engine.kind, **vars(built)}))
    else:
        how = "reused" if built.reused else f"built from {built.packages} packages, {built.archive_bytes:,} bytes"
        out.print(f"{built.name} ({engine.kind}, {built.build_tag}): {how} in {built.duration_s:.1f} s",
                  markup=False, highlight=False)
    return EXIT_OK
