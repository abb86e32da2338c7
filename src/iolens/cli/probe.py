"""``iolens probe``: which stage of the data pipeline bounds the job (compute,
preprocessing or storage), from three rates measured apart; or, with
``--storage PATH``, what bounds the storage that holds a dataset (IOPS,
bandwidth, latency or a rate limit), from a short read-only probe of its files."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from iolens._errors import IolensError
from iolens.cli.tune import (
    add_source_arguments,
    check_source_arguments,
    load_source,
    measure_and_print,
    standalone,
)
from iolens.rundir import STORAGE_PROBE

_EPILOG = """\
the data (one of):
  --dataset MODULE:FACTORY  FACTORY() returns your torch Dataset (map-style); MODULE is
                            imported with the current folder on sys.path
  --folder DIR              a class-folder of files, read and decoded by iolens (see
                            `iolens tune --help`)
  --storage PATH            no stages: the storage under PATH alone (see below)

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

the storage alone (--storage PATH, instead of the stages; no --dataset, --folder, --model):
  A short read-only probe of the storage under PATH, on the dataset's own files, for
  --seconds in all (default 6): random reads of the sample size (the median file size, at
  most 4 MiB: a whole small file, or a chunk of a large one) with 1 and with --concurrency
  K in flight (default 8), then sequential reads of the device's readahead window (1 to 8
  MiB: what reading a pack in order asks for) of the largest files, or, when every file is
  small, of the block device under them (read-only, O_DIRECT, root). Reads pass the
  page cache with O_DIRECT; where the filesystem refuses it, only ranges out of the cache
  are read and then dropped, so the page cache is left as found. Nothing is written (but
  --run's file). The limit it names:
    iops       sequential reads deliver 1.5x the bytes/s of random ones or more: packing
               small files into large shards read in order (iolens pack) helps
    bandwidth  they deliver no more: packing gains nothing
    latency    FUSE/NFS (or no sequential figure): K reads in flight deliver 1.5x the
               reads/s of one or more: more workers or threads help
    rate       they do not: a fixed ceiling of requests/s; fewer, larger requests help
    unknown    too few reads (under 20 a phase) to tell, or the reads came from memory
  --run DIR also writes the result to DIR/storage_probe.json, DIR being the run directory
  of an iolens run (holding its meta.json), beside that run's records; where the files
  are packs (32 of the run's samples large or more: HDF5, LMDB, one big file), the random
  reads are the run's bytes per sample.

exit codes: 0 measured, 1 the dataset failed while it was read (--storage: the probe
failed, or --run's file could not be written), 2 bad arguments (a
MODULE:FACTORY that cannot be imported or returns the wrong thing, a missing folder or
--storage PATH, a PATH with no readable file, a --run that is not a run directory)

examples:
  iolens probe --folder /data/train --model mypkg.train:model_and_loss
  iolens probe --dataset mypkg.data:make_dataset --evict /data/train --num-workers 8
  iolens probe --folder /data/train --format json > probe.json
  iolens probe --storage /data/train
  iolens probe --storage /mnt/bucket/train --seconds 20 --concurrency 16 --format json
  iolens probe --storage /data/train --run runs/20240501-120000-train
"""

_STAGE_SECONDS = 5.0
"""The stage probe's default --seconds (per stage)."""
_STORAGE_SECONDS = 6.0
"""The storage probe's default --seconds (in all)."""
_STORAGE_CONCURRENCY = 8
"""The storage probe's default --concurrency: a DataLoader's workers, typically."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens probe``."""
    p = argparse.ArgumentParser(
        prog="iolens probe",
        usage="iolens probe (--dataset MODULE:FACTORY | --folder DIR) [--model MODULE:FACTORY] "
              "[--num-workers N] [--batch-size N] [--seconds S] [--evict PATH] "
              "[--drop-caches] [--format text|json]\n"
              "       iolens probe --storage PATH [--seconds S] [--concurrency K] [--run DIR] "
              "[--format text|json]",
        description="Measure the compute, preprocessing and storage ceilings of a training "
                    "job's data pipeline apart, and say which one bounds the job and what "
                    "lifting it could give. With --storage PATH, probe the storage under "
                    "PATH alone and say whether IOPS, bandwidth, latency or a rate limit "
                    "bounds it.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = add_source_arguments(p, "seconds to measure each stage, after its warm-up "
                                   "(default 5); with --storage, the whole probe's time "
                                   "(default 6)", required=False)
    p.set_defaults(seconds=None)  # the default depends on the mode (see run)
    data.add_argument("--storage", metavar="PATH",
                      help="probe the storage under PATH instead of the stages (see below)")
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
    storage = p.add_argument_group("the storage probe (with --storage)")
    storage.add_argument("--concurrency", type=int, metavar="K",
                         help="random reads in flight in the parallel phase (default 8)")
    storage.add_argument("--run", metavar="DIR",
                         help=f"also write the result to DIR/{STORAGE_PROBE}, DIR being an "
                              "iolens run directory; in packed files, random reads of its "
                              "bytes per sample")
    return p


_STAGE_ONLY: tuple[tuple[str, str, object], ...] = (
    ("--model", "model", None), ("--num-workers", "num_workers", None),
    ("--subset", "subset", 1024), ("--evict", "evict", []),
    ("--drop-caches", "drop_caches", False), ("--device", "device", None),
    ("--batch-size", "batch_size", 32), ("--decode", "decode", "auto"),
    ("--shape", "shape", "3,64,64"))
"""The stage probe's options, with their defaults: given with --storage, a usage error."""


def run(ns: argparse.Namespace) -> int:
    """Measure and print; returns the exit code."""
    p: argparse.ArgumentParser = ns.parser
    if ns.storage is not None:
        return _run_storage(ns)
    if ns.dataset is None and ns.folder is None:
        p.error("one of --dataset MODULE:FACTORY, --folder DIR or --storage PATH is required")
    for option, dest in (("--concurrency", "concurrency"), ("--run", "run")):
        if getattr(ns, dest) is not None:
            p.error(f"{option} applies to --storage PATH (the storage probe), not to the "
                    "stage probe")
    if ns.seconds is None:
        ns.seconds = _STAGE_SECONDS
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


def _run_storage(ns: argparse.Namespace) -> int:
    """``--storage PATH``: probe the storage, print, and write ``--run``'s file."""
    p: argparse.ArgumentParser = ns.parser
    given = [option for option, dest, default in _STAGE_ONLY if getattr(ns, dest) != default]
    if given:
        p.error(f"--storage probes the storage alone; {', '.join(given)} "
                f"{'applies' if len(given) == 1 else 'apply'} to the stage probe "
                "(--dataset or --folder)")
    seconds = _STORAGE_SECONDS if ns.seconds is None else ns.seconds
    if not 0 < seconds <= 3600:
        p.error(f"--seconds must be above 0 and at most 3600, not {seconds:g}")
    concurrency = _STORAGE_CONCURRENCY if ns.concurrency is None else ns.concurrency
    if not 2 <= concurrency <= 256:
        p.error(f"--concurrency must be from 2 to 256, not {concurrency}")
    if not os.path.exists(ns.storage):
        p.error(f"--storage {ns.storage}: no such file or folder")
    if ns.run is not None:
        from iolens.rundir import META  # noqa: PLC0415

        if not os.path.isdir(ns.run):
            p.error(f"--run {ns.run}: no such folder (give an iolens run directory)")
        if not os.path.isfile(os.path.join(ns.run, META)):
            p.error(f"--run {ns.run}: not an iolens run directory (no {META} in it)")
    from iolens.loaderbench.storageprobe import probe_storage, render_text  # noqa: PLC0415

    sample = _run_sample_bytes(ns.run) if ns.run is not None else None

    def measure(bar: Any) -> Any:
        result = probe_storage(ns.storage, seconds=seconds, concurrency=concurrency,
                               progress=bar, sample_bytes=sample)
        if ns.run is not None:
            from iolens.rundir import write_atomic  # noqa: PLC0415

            data = json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"
            write_atomic(os.path.join(ns.run, STORAGE_PROBE), data.encode())
        return result

    return measure_and_print(ns, "iolens probe", 4, measure, render=render_text,
                             failure="the storage probe failed")


def _run_sample_bytes(run: str) -> float | None:
    """What the run's job read per sample (NOTE [bytes per sample]), or None where the run
    timed no batch's stages."""
    from iolens.analysis.pipeline import pipeline_over  # noqa: PLC0415
    from iolens.analysis.rundata import load_run  # noqa: PLC0415

    try:
        data = load_run(run)
        pipe = pipeline_over(data.columns, range(data.columns.n), data.meta)
    except (IolensError, OSError, ValueError):
        return None
    return pipe.bytes_per_sample if pipe is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    """``iolens probe`` on its own (``python -m iolens.cli.probe``); returns the exit code."""
    return standalone(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
