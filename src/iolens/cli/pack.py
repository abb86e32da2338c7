"""``iolens pack SRC DST``: many small sample files into LMDB, HDF5 or WebDataset shards."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

_EPILOG = """\
SRC is either an image-folder layout, SRC/<class>/.../<file> (every file under a
class folder, at any depth, is a sample; its label is the class's index in the
sorted class names, as torchvision's ImageFolder), or a folder of files only
(packed without labels). Read the pack back with iolens.data.LMDBDataset(DST) or
iolens.data.HDF5Dataset(DST): ds[i] is (the file's bytes, its label).

--format webdataset writes tar shards for the webdataset library (and any tar
reader): per sample KEY.EXT, the file's bytes under its own extension (bin
where it has none), and KEY.cls, its label; read them with
  webdataset.WebDataset(DST + "/shard-{00000..N}.tar", shardshuffle=True)
      .shuffle(1000).to_tuple("jpg", "cls")
(shards in a new order each epoch, samples mixed in a buffer: the reads stay
whole shards read in order). Give --shard-size (256M, say) so that there are
shards to shuffle and to spread over the DataLoader's workers.

DST gets shard-00000.lmdb (or .h5, .tar), ... and manifest.json: the format, the
classes, the shards and, per sample, its key, source path, size, label and
blake2b checksum, and the files skipped with the reason. Every stored sample
is read back and its checksum compared with the source's before the manifest
is written.

Interrupted (Ctrl-C, a kill, a crash), the same command continues where the
last committed transaction ended (every --commit-every samples) and ends with
the pack an uninterrupted run would have made. Files that cannot be read (a
FIFO, a dangling symlink or a symlink loop, permission denied, a file gone
since the listing) are skipped, named in the summary and in the manifest, and
the rest is packed. Files added to SRC after the start are not packed.

exit codes: 0 packed and verified, 1 packed and verified but some files were
skipped, 2 bad arguments (SRC missing or empty, DST inside SRC, DST exists and
is not a pack of SRC with these options), 3 the pack could not be written or
failed verification, 130 interrupted (run the same command again to continue)

examples:
  iolens pack data/train data/train.lmdb
  iolens pack data/train /fast/train.h5pack --format hdf5 --shard-size 4G
  iolens pack data/train data/train.lmdb --shuffle   # read in shuffled blocks
  iolens pack data/train data/train-wds --format webdataset --shard-size 256M --shuffle
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens pack``."""
    p = argparse.ArgumentParser(
        prog="iolens pack",
        usage="iolens pack SRC DST [--format lmdb|hdf5|webdataset] [--shard-size SIZE] "
              "[--shuffle]",
        description="Pack a folder of many small sample files into a few large LMDB, HDF5 or "
                    "WebDataset (tar) files that a disk serves in large reads.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="the folder of sample files")
    p.add_argument("dst", metavar="DST", help="the pack's folder (made; or an interrupted "
                                              "pack of SRC to continue)")
    p.add_argument("--format", choices=("lmdb", "hdf5", "webdataset"), default="lmdb",
                   help="storage format (default lmdb; webdataset: tar shards)")
    p.add_argument("--shard-size", metavar="SIZE",
                   help="split into shards of about SIZE bytes (512M, 4G; K, M, G, T are "
                        "powers of 1024); default one shard")
    p.add_argument("--shuffle", action="store_true",
                   help="store the samples in a random order (drawn from --seed), so that "
                        "consecutive samples, read together in one large request, mix the "
                        "classes; read it with iolens.data.BlockShuffleSampler")
    p.add_argument("--seed", metavar="N", type=int, default=0,
                   help="the seed of --shuffle's order (default 0)")
    p.add_argument("--commit-every", metavar="N", type=int, default=1000,
                   help="samples per transaction, the most an interruption costs "
                        "(default 1000)")
    p.add_argument("--readers", metavar="N", type=int, default=8,
                   help="threads reading source files ahead (default 8; more for network "
                        "or slow storage)")
    return p


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the pack as Ctrl-C does (resumable, exit 130)."""
    def stop(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Plain:
    """Progress as a line on stderr every few seconds (stderr is not a terminal)."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self.last = time.monotonic()
        self.t0 = self.last
        self.phase = ""

    def __call__(self, p: Any) -> None:
        from iolens.pack import human_bytes  # noqa: PLC0415

        now = time.monotonic()
        if p.phase != self.phase:
            self.phase, self.t0, self.last = p.phase, now, now
            return
        if now - self.last < self.every and p.done < p.total:
            return
        self.last = now
        rate = p.bytes / max(now - self.t0, 1e-9)
        what = (f"read {p.done}/{p.total} files, {human_bytes(p.bytes)} packed"
                if p.phase == "pack" else
                f"verified {p.done}/{p.total} samples, {human_bytes(p.bytes)}")
        print(f"iolens pack: {what} ({human_bytes(rate)}/s)", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class _Bar:
    """A rich progress bar on stderr (a terminal)."""

    def __init__(self) -> None:
        from rich.console import Console  # noqa: PLC0415
        from rich.progress import (  # noqa: PLC0415
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                            TimeRemainingColumn(), console=Console(stderr=True),
                            transient=False)
        self.bar.start()
        self.tasks: dict[str, Any] = {}
        self.t0: dict[str, float] = {}

    def __call__(self, p: Any) -> None:
        from iolens.pack import human_bytes  # noqa: PLC0415

        if p.phase not in self.tasks:
            self.tasks[p.phase] = self.bar.add_task(
                "packing" if p.phase == "pack" else "verifying", total=p.total, rate="")
            self.t0[p.phase] = time.monotonic()
        rate = p.bytes / max(time.monotonic() - self.t0[p.phase], 1e-9)
        self.bar.update(self.tasks[p.phase], completed=p.done, total=p.total,
                        rate=f"{human_bytes(rate)}/s")

    def close(self) -> None:
        self.bar.stop()


def run(ns: argparse.Namespace) -> int:
    """Pack, verify and print the summary; returns the exit code."""
    from iolens import pack as packing  # noqa: PLC0415

    prog = "iolens pack"
    shard_size = None
    if ns.shard_size is not None:
        try:
            shard_size = packing.parse_size(ns.shard_size)
        except ValueError as exc:
            print(f"{prog}: --shard-size: {exc}", file=sys.stderr)
            return 2
    if ns.commit_every < 1 or ns.readers < 1:
        print(f"{prog}: --commit-every and --readers must be at least 1", file=sys.stderr)
        return 2
    opts = packing.Options(fmt=ns.format, shard_size=shard_size,
                           commit_every=ns.commit_every, readers=ns.readers,
                           shuffle_seed=ns.seed if ns.shuffle else None)
    show: _Plain | _Bar
    show = _Bar() if packing.stderr_is_terminal() else _Plain()
    try:
        with _sigterm_interrupts():
            result = packing.pack(ns.src, ns.dst, opts, progress=show)
    except packing.PackError as exc:
        show.close()
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except (packing.PackFailed, OSError) as exc:
        show.close()
        detail = exc if isinstance(exc, packing.PackFailed) else \
            f"cannot write the pack: {exc}; run the same command again once the cause is fixed"
        print(f"{prog}: {detail}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        show.close()
        print(f"{prog}: interrupted; run the same command again to continue where it stopped",
              file=sys.stderr)
        return 130
    show.close()
    print(summary(result, ns.dst))
    return 1 if result.manifest["skipped"] else 0


def summary(result: Any, dst: str) -> str:
    """The one-line summary of a pack."""
    from iolens.pack import describe_skipped, human_bytes  # noqa: PLC0415

    m = result.manifest
    shards = len(m["shards"])
    kind = {"lmdb": "LMDB", "hdf5": "HDF5", "webdataset": "WebDataset (tar)"}.get(
        m["format"], m["format"])
    what = f"{m['count']} samples ({human_bytes(m['bytes'])})"
    labels = f" in {len(m['classes'])} classes" if m["classes"] else ""
    if result.already:
        line = (f"iolens pack: {dst} already holds {what}{labels} of {m['src']} in {shards} "
                f"{kind} shard{'s' * (shards != 1)}, verified")
    else:
        rate = m["bytes"] / max(result.seconds, 1e-9)
        resumed = f", resumed at file {result.resumed_from}" if result.resumed_from else ""
        line = (f"iolens pack: packed {what}{labels} from {m['src']} into {shards} {kind} "
                f"shard{'s' * (shards != 1)} at {dst} in {result.seconds:.1f} s "
                f"({human_bytes(rate)}/s{resumed}), verified")
    if m["skipped"]:
        line += f"; skipped {len(m['skipped'])}: {describe_skipped(m['skipped'])}"
    return line


def main(argv: Sequence[str] | None = None) -> int:
    """``iolens pack`` on its own (as ``python -m iolens.cli.pack``); returns the exit code."""
    parser = build_parser()
    try:
        ns = parser.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    ns.parser = parser
    try:
        return run(ns)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
