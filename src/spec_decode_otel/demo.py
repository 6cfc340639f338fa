"""Placeholder until the instrumented demo lands (same session)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=40)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("demo: not built yet")
