"""Command line: ``python -m harbor.cli --env production``."""

from __future__ import annotations

import argparse

from harbor import config


def main() -> None:
    parser = argparse.ArgumentParser(prog="harbor")
    parser.add_argument("--env", default="staging", choices=["staging", "production"])
    args = parser.parse_args()
    cfg = config.load(args.env)
    print(f"harbor: bucket {cfg['storage']['bucket']}, up to {cfg['upload']['max_attempts']} attempts")


if __name__ == "__main__":
    main()
