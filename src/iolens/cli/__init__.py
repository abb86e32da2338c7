"""The ``iolens`` command: argument parsing and exit codes only.

Exit codes: 0 success, 1 the measurement could not be made (a clear message
says why), 2 usage error (bad argument, unknown device), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from iolens._version import __version__

_COMMANDS = ("iostat", "run", "report", "compare", "top", "doctor", "pack", "tune", "probe",
             "exporter")
"""Each is the module iolens.cli.<name>, with build_parser() and run(ns); only the one asked
for is imported, so that a command pays for none of the others' imports."""


def _command(name: str) -> tuple[Callable[[], argparse.ArgumentParser],
                                 Callable[[argparse.Namespace], int]]:
    module = importlib.import_module(f"iolens.cli.{name}")
    return module.build_parser, module.run


_DESCRIPTION = """\
Find out why a training job waits for its data.

commands:
  run       run a training command and record what holds it back
  report    the verdict on a recorded run, its evidence and what to do (text, json, html)
  compare   two runs side by side, whether each difference is real; fail on a regression
  top       live view of the disks, a process tree (or the machine), CPU and GPUs
  iostat    extended device statistics, digit for digit as `iostat -x -d`
  exporter  serve the disks', a process tree's, CPU, memory and GPU metrics to Prometheus
  pack      pack a folder of many small sample files into LMDB or HDF5 shards (verified, resumable)
  tune      measure the DataLoader's samples/s over num_workers, prefetch, persistence, pinning
  probe     which stage bounds the job: compute, preprocessing or storage, measured apart
  doctor    what can be measured on this machine, and why not where it cannot

Run `iolens COMMAND --help` for a command's options and examples.
"""


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iolens", description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="iolens [--version] COMMAND [ARGS...]",
    )
    parser.add_argument("--version", action="version", version=f"iolens {__version__}")
    parser.add_argument("command", nargs="?", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not args or args[0] not in _COMMANDS:
        if args and not args[0].startswith("-"):
            top.print_usage(sys.stderr)
            names = ", ".join(_COMMANDS)
            print(f"iolens: error: unknown command {args[0]!r} (commands: {names})",
                  file=sys.stderr)
            return 2
        top.parse_args(args)  # --help and --version exit here
        top.print_help()
        return 2
    build, run = _command(args[0])
    parser = build()
    # `run` passes the job's own arguments through untouched, so no intermixing there.
    parse = parser.parse_args if args[0] == "run" else parser.parse_intermixed_args
    ns = parse(args[1:])
    ns.parser = parser
    try:
        return run(ns)
    except KeyboardInterrupt:
        return 130
    except FileNotFoundError as exc:
        print(f"iolens: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
