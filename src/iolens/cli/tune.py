"""``iolens tune``: the DataLoader settings that deliver the most samples per second."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

_EPILOG = """\
the data (one of):
  --dataset MODULE:FACTORY  FACTORY() returns your torch Dataset (map-style: __len__ and
                            __getitem__); MODULE is imported with the current folder on
                            sys.path, e.g. `--dataset mypkg.data:make_dataset`
  --folder DIR              a class-folder of files (DIR/CLASS/FILE, or files directly in
                            DIR), each read and decoded to a tensor: --decode raw takes the
                            first C*H*W bytes, image decodes jpg/png/... with Pillow and
                            resizes; auto picks by the files' extensions

how it measures:
  Each setting is a fresh DataLoader (shuffle=True) drawn for --seconds after a warm-up (the
  first batches, one per worker: the workers' start-up), over epochs as needed; the rate is
  samples per second delivered to the loop, which does nothing else (with CUDA, it copies
  each batch to the GPU). The settings, in order:
    1. num_workers 0, 1, 2, 3, 4, 6, 8, ... up to --max-workers (default: the cores in this
       process's affinity mask less those other work keeps busy, sampled for half a
       second), prefetch_factor 2; from one worker on it stops when a step gains under
       5% twice in a row, or loses over 5%
    2. prefetch_factor 4, then 8, at the best worker count, while each gains 5%
    3. persistent_workers=True at the best so far
    4. pin_memory=True, only where CUDA is available (skipped otherwise, and said so)
  The best is the simplest setting within 3% of the highest rate.

the training step beside it:
  Alone, the loop does nothing with each batch, so the workers have every core. In
  training the step takes its share: on a machine without spare cores the best setting
  measured alone can be slower in training. --run RUN (a run recorded with `iolens run`)
  takes the step's time and CPU from that run's figures, and --step-ms MS (with
  --step-cpu-ms, default all of it) gives them by hand: each batch then costs the loop a
  stand-in step (that much CPU in the loop's thread, then a sleep for the rest), and the
  rate is the training's own. Without either, the output says it measured the loader
  alone.

  Run it on the machine and the data the training uses, with nothing else running.

exit codes: 0 measured, 1 the dataset failed while it was read, 2 bad arguments (a
MODULE:FACTORY that cannot be imported or does not return a Dataset, a missing folder)

examples:
  iolens tune --dataset mypkg.data:make_dataset --batch-size 64
  iolens tune --folder /data/train --decode image --shape 3,224,224 --seconds 10
  iolens tune --folder /data/train --max-workers 8 --format json > tune.json
  iolens tune --dataset mypkg.data:make_dataset --run iolens-runs/train-20261203
"""


def add_source_arguments(p: argparse.ArgumentParser, seconds_help: str, *,
                         required: bool = True) -> argparse._MutuallyExclusiveGroup:
    """The options ``iolens tune`` and ``iolens probe`` share: the data and the pace.
    Returns the group of --dataset and --folder, for a caller to add another source to
    (then ``required=False``, and the caller checks that one is given)."""
    data = p.add_argument_group("the data")
    one = data.add_mutually_exclusive_group(required=required)
    one.add_argument("--dataset", metavar="MODULE:FACTORY",
                     help="a callable that returns the torch Dataset to read")
    one.add_argument("--folder", metavar="DIR",
                     help="a class-folder of sample files, read and decoded by iolens")
    data.add_argument("--decode", choices=("auto", "raw", "image"), default="auto",
                      help="--folder: how a file's bytes become a tensor (default auto)")
    data.add_argument("--shape", default="3,64,64", metavar="C,H,W",
                      help="--folder: the decoded tensor's shape (default 3,64,64)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N",
                   help="samples per batch (default 32)")
    p.add_argument("--seconds", type=float, default=5.0, metavar="S", help=seconds_help)
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="output format (default text)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress on stderr")
    return one


def check_source_arguments(ns: argparse.Namespace) -> tuple[int, ...]:
    """Usage errors in the shared options (through the parser); the parsed --shape."""
    p: argparse.ArgumentParser = ns.parser
    if ns.batch_size < 1:
        p.error(f"--batch-size must be at least 1, not {ns.batch_size}")
    if not 0 < ns.seconds <= 3600:
        p.error(f"--seconds must be above 0 and at most 3600, not {ns.seconds:g}")
    try:
        shape = tuple(int(v) for v in ns.shape.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        p.error(f"--shape {ns.shape!r}: expected C,H,W, three positive numbers like 3,64,64")
    if ns.dataset is not None and (ns.decode != "auto" or ns.shape != "3,64,64"):
        p.error("--decode and --shape apply to --folder; a --dataset decodes its own samples")
    return shape


def load_source(ns: argparse.Namespace, shape: tuple[int, ...]) -> Any:
    """The Source the options name; raises SpecError (a usage error) when they cannot."""
    if ns.dataset is not None:
        from iolens.loaderbench.source import dataset_source  # noqa: PLC0415

        return dataset_source(ns.dataset)
    from iolens.loaderbench.folder import folder_source  # noqa: PLC0415

    return folder_source(ns.folder, ns.decode, shape)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens tune``."""
    p = argparse.ArgumentParser(
        prog="iolens tune",
        usage="iolens tune (--dataset MODULE:FACTORY | --folder DIR) [--batch-size N] "
              "[--seconds S] [--max-workers N] [--run RUN | --step-ms MS [--step-cpu-ms MS]] "
              "[--format text|json]",
        description="Measure how many samples per second the DataLoader delivers over "
                    "num_workers, prefetch_factor, persistent_workers and pin_memory, and "
                    "print the best setting with the rate of each one tried.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_arguments(p, "seconds to measure each setting, after its warm-up (default 5)")
    p.add_argument("--max-workers", type=int, metavar="N",
                   help="the most workers to try (default: the free cores)")
    step = p.add_argument_group("the training step beside it")
    one = step.add_mutually_exclusive_group()
    one.add_argument("--run", metavar="RUN",
                     help="a run recorded with `iolens run`: its step's time and CPU")
    one.add_argument("--step-ms", type=float, metavar="MS",
                     help="a step of MS milliseconds a batch")
    step.add_argument("--step-cpu-ms", type=float, metavar="MS",
                      help="--step-ms: how much of it is CPU in the loop (default all)")
    return p


def step_load(ns: argparse.Namespace) -> Any:
    """The stand-in for the training step the options give, or None; usage errors through
    the parser."""
    p: argparse.ArgumentParser = ns.parser
    from iolens.loaderbench.tune import StepLoad  # noqa: PLC0415

    if ns.step_cpu_ms is not None and ns.step_ms is None:
        p.error("--step-cpu-ms goes with --step-ms")
    if ns.step_ms is not None:
        cpu = ns.step_ms if ns.step_cpu_ms is None else ns.step_cpu_ms
        if not 0 < ns.step_ms <= 60_000 or not 0 <= cpu <= ns.step_ms:
            p.error(f"--step-ms must be above 0 and at most 60000, and --step-cpu-ms "
                    f"between 0 and it (got {ns.step_ms:g} and {cpu:g})")
        return StepLoad(ns.step_ms / 1000, cpu / 1000, "from --step-ms")
    if ns.run is None:
        return None
    from iolens._errors import IolensError  # noqa: PLC0415
    from iolens.analysis.model import Model, declared_workers  # noqa: PLC0415
    from iolens.analysis.rundata import load_run  # noqa: PLC0415

    try:
        run = load_run(ns.run)
    except IolensError as exc:
        p.error(f"--run {ns.run}: {exc}")
    cols = run.columns
    # (the workers the whole run declared: NOTE [the workers a run declared])
    f = Model(cols.take(cols.timed()), int(run.meta.get("cpus") or 0) or None,
              workers=declared_workers(cols) or None).whole
    if f is None:
        p.error(f"--run {ns.run}: the run has no timed training steps and stages to take "
                "the step from (record it with `iolens run`, which times them)")
    return StepLoad(f.compute_s, min(f.compute_s, f.main_cpu_s), f"from {ns.run}")


def run(ns: argparse.Namespace) -> int:
    """Measure and print; returns the exit code."""
    p: argparse.ArgumentParser = ns.parser
    shape = check_source_arguments(ns)
    if ns.max_workers is not None and ns.max_workers < 0:
        p.error(f"--max-workers must be 0 or more, not {ns.max_workers}")
    from iolens.loaderbench.measure import cores  # noqa: PLC0415
    from iolens.loaderbench.source import SpecError  # noqa: PLC0415
    from iolens.loaderbench.tune import render_text, tune  # noqa: PLC0415

    try:
        source = load_source(ns, shape)
    except SpecError as exc:
        p.error(str(exc))
    step = step_load(ns)
    free = cores()
    max_workers = free.free if ns.max_workers is None else ns.max_workers
    return measure_and_print(
        ns, "iolens tune", 1,
        lambda bar: tune(source.dataset, name=source.name, batch_size=ns.batch_size,
                         seconds=ns.seconds, max_workers=max_workers, cores=free,
                         progress=bar, step=step),
        render=render_text, failure="the DataLoader failed")


def main(argv: Sequence[str] | None = None) -> int:
    """``iolens tune`` on its own (``python -m iolens.cli.tune``); returns the exit code."""
    return standalone(build_parser, run, argv)


def measure_and_print(ns: argparse.Namespace, command: str, stages: int,
                      measure: Callable[[Any], Any], *, render: Callable[[Any], str],
                      failure: str) -> int:
    """Run ``measure(progress)`` under a progress bar and print its result as text or JSON.

    A SpecError from the user's code is a usage error; any other exception is the
    user's dataset or model failing while read (exit 1, ``failure`` says what failed).
    """
    from iolens.loaderbench.measure import Progress  # noqa: PLC0415
    from iolens.loaderbench.source import SpecError  # noqa: PLC0415

    p: argparse.ArgumentParser = ns.parser
    bar = Progress(command, stages, enabled=not ns.quiet)
    try:
        result = measure(bar)
    except SpecError as exc:
        bar.close()
        p.error(str(exc))
    except Exception as exc:  # noqa: BLE001 - the user's dataset failed while read
        bar.close()
        print(f"{command}: {failure}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    bar.close()
    if ns.format == "json":
        sys.stdout.write(json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n")
    else:
        sys.stdout.write(render(result))
    sys.stdout.flush()
    return 0


def standalone(build: Callable[[], argparse.ArgumentParser],
               run_ns: Callable[[argparse.Namespace], int],
               argv: Sequence[str] | None) -> int:
    """A command on its own (``python -m iolens.cli.tune``): parse, run, map exits."""
    parser = build()
    try:
        ns = parser.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
        ns.parser = parser
        return run_ns(ns)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
