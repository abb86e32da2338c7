"""``iolens probe``: which stage of the data pipeline bounds the job (compute,
preprocessing or storage), from three rates measured apart."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from iolens.cli.tune import (
    add_source_arguments,
    check_source_arguments,
    load_source,
    measure_and_print,
    standalone,
)

_EPILOG = """\
the data (one of):
  --dataset MODULE:FACTORY  FACTORY() returns your torch Dataset (map-style); MODULE is
                            imported with the current folder on sys.path
  --folder DIR              a class-folder of files, read and decoded by iolens (see
                            `iolens tune --help`)

the stages, each measured apart for --seconds after a warm-up, in samples per second:
  compute        the training step alone (forward, loss, backward, an SGD step at learning
                 rate 0) repeated on one real batch kept in memory, on the GPU when there
                 is one: the job's rate with free, instant data. Needs --model
                 MODULE:FACTORY, whose FACTORY() returns (model, loss_fn); a batch
                 (input, target, ...) gives loss_fn(model(input), target, ...). Without
                 --model the loader alone is measured, and the result says so.
  preprocessing  the DataLoader over a random subset (--subset samples) read once to put it
                 in the page cache, then drawn again: reading from memory, decoding and
                 augmenting, no disk
  storage        the DataLoader over the whole dataset in random order, each sample at most
                 once, after the dataset's pages left the page cache: posix_fadvise DONTNEED
                 on its files (--folder's files, or --evict PATH; no root needed for files
                 you can open), or --drop-caches (root: the whole machine's page cache). A
                 --dataset without either is not measured cold, and the result says so.

The lowest rate names the bound; storage only when the cold rate is over 10% below the
preprocessing ceiling (the cold pass decodes too). The gain is the next stage's rate over
it. Run it where the job runs, with nothing else running.

exit codes: 0 measured, 1 the dataset failed while it was read, 2 bad arguments (a
MODULE:FACTORY that cannot be imported or returns the wrong thing, a missing folder)

examples:
  iolens probe --folder /data/train --model mypkg.train:model_and_loss
  iolens probe --dataset mypkg.data:make_dataset --evict /data/train --num-workers 8
  iolens probe --folder /data/train --format json > probe.json
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens probe``."""
    p = argparse.ArgumentParser(
        prog="iolens probe",
        usage="iolens probe (--dataset MODULE:FACTORY | --folder DIR) [--model MODULE:FACTORY] "
              "[--num-workers N] [--batch-size N] [--seconds S] [--evict PATH] "
              "[--drop-caches] [--format text|json]",
        description="Measure the compute, preprocessing and storage ceilings of a training "
                    "job's data pipeline apart, and say which one bounds the job and what "
                    "lifting it could give.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_arguments(p, "seconds to measure each stage, after its warm-up (default 5)")
    p.add_argument("--model", metavar="MODULE:FACTORY",
                   help="a callable returning (model, loss_fn) for the compute stage")
    p.add_argument("--num-workers", type=int, metavar="N",
                   help="DataLoader workers (default: the free cores, at most 8)")
    p.add_argument("--subset", type=int, default=1024, metavar="N",
                   help="samples in the cached subset (default 1024)")
    p.add_argument("--evict", action="append", default=[], metavar="PATH",
                   help="a file or folder of the dataset whose pages to drop before the "
                        "storage stage (repeatable)")
    p.add_argument("--drop-caches", action="store_true",
                   help="drop the whole page cache before the storage stage (root)")
    p.add_argument("--device", metavar="DEV",
                   help="where the compute stage runs (default cuda when available, else cpu)")
    return p


def run(ns: argparse.Namespace) -> int:
    """Measure and print; returns the exit code."""
    p: argparse.ArgumentParser = ns.parser
    shape = check_source_arguments(ns)
    if ns.num_workers is not None and ns.num_workers < 0:
        p.error(f"--num-workers must be 0 or more, not {ns.num_workers}")
    if ns.subset < 1:
        p.error(f"--subset must be at least 1, not {ns.subset}")
    from iolens.loaderbench.measure import cores  # noqa: PLC0415
    from iolens.loaderbench.probe import probe, render_text  # noqa: PLC0415
    from iolens.loaderbench.source import SpecError, model_step  # noqa: PLC0415

    try:
        source = load_source(ns, shape)
        model = model_step(ns.model) if ns.model else None
        if ns.device is not None:
            import torch  # noqa: PLC0415

            torch.device(ns.device)
    except SpecError as exc:
        p.error(str(exc))
    except RuntimeError as exc:
        p.error(f"--device {ns.device!r}: {exc}")
    workers = min(cores().free, 8) if ns.num_workers is None else ns.num_workers
    return measure_and_print(
        ns, "iolens probe", 3,
        lambda bar: probe(source, batch_size=ns.batch_size, num_workers=workers,
                          seconds=ns.seconds, subset=ns.subset, model=model,
                          evict_paths=ns.evict, drop_caches=ns.drop_caches, device=ns.device,
                          progress=bar),
        render=render_text, failure="the measurement failed")


def main(argv: Sequence[str] | None = None) -> int:
    """``iolens probe`` on its own (``python -m iolens.cli.probe``); returns the exit code."""
    return standalone(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
