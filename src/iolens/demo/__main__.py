"""Demo training: an image-folder-like dataset of small files, a small CNN, CPU only.

    iolens run -- python -m iolens.demo            # what `make demo` runs
    python -m iolens.demo --files 4000 --workers 4 --epochs 2 --data /mnt/slow/demo
    iolens run -- python -m iolens.demo --slow-disk   # `make demo-slow`: root, loop devices
    python -m iolens.demo.cycle                      # `make demo`: the whole cycle (below)

The dataset is generated once (class subfolders of 64 KiB sample files) and
read back every epoch through a DataLoader, decoding each file's bytes into
a 3x64x64 tensor, as an image pipeline would.

With ``--slow-disk`` the dataset goes on a throttled loop device made for the
run (iolens.demo.slowdisk), its pages leave the page cache before every epoch
and this process joins the throttled cgroup, so its DataLoader workers wait on
a saturated disk: the storage-bound case, first hand. It is all removed at the
end; where it cannot be made (not root, no loop devices, no cgroup v1 blkio)
the demo says what is missing and exits 2.

``--pack DIR`` trains on a pack made by ``iolens pack --shuffle`` instead, read as
the pack advice says (iolens.data's dataset, BlockShuffleSampler with the batch
size). ``--throttle CGROUP`` joins an existing blkio cgroup after a warm-up step and
drops the dataset's pages from the page cache before every epoch: how the cycle
(``python -m iolens.demo.cycle``) trains on the slow disk it made.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from iolens.demo.slowdisk import SlowDisk


def make_dataset(root: str, files: int, size: int, classes: int = 4) -> None:
    """Write ``files`` sample files of ``size`` bytes into ``classes`` subfolders (once; a
    marker file beside ``root`` says it is whole)."""
    marker = os.path.normpath(root) + ".complete"
    if os.path.exists(marker):
        return
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c}"), exist_ok=True)
    for i in range(files):
        path = os.path.join(root, f"class{i % classes}", f"{i:06d}.bin")
        with open(path, "wb") as fh:
            fh.write(os.urandom(size))
    with open(marker, "w") as fh:
        fh.write(f"{files} {size}\n")


def slow_disk_size(files: int, size: int) -> int:
    """Bytes of disk for ``files`` files of ``size`` bytes on ext4, with room to spare."""
    per_file = -(-size // 4096) * 4096 + 4096
    return max(64 << 20, (int(files * per_file * 1.25) + (64 << 20)) >> 20 << 20)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m iolens.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="dataset folder (default: a folder under the temp dir)")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--file-kib", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=None,
                    help="DataLoader workers (default 2, or 4 with --slow-disk)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--pack", metavar="DIR",
                    help="train on this pack (iolens pack --shuffle), read in shuffled "
                         "blocks of a batch")
    ap.add_argument("--throttle", metavar="CGROUP",
                    help="join this blkio cgroup (a slow disk's) after a warm-up step, and "
                         "drop the dataset from the page cache before every epoch")
    slow = ap.add_argument_group(
        "slow disk", "Root only: the dataset on a loop device whose reads are throttled, "
        "removed again at the end.")
    slow.add_argument("--slow-disk", action="store_true",
                      help="put the dataset on a throttled loop device; every epoch starts on "
                           "a cold page cache")
    slow.add_argument("--slow-mbps", type=float, default=8.0, metavar="MB_S",
                      help="the disk's read limit in MB/s (MiB, as iostat -m; default 8)")
    args = ap.parse_args(argv)
    if args.slow_disk and (args.data or args.pack or args.throttle):
        ap.error("--slow-disk makes its own dataset and disk: no --data, --pack or --throttle")
    if args.pack and args.data:
        ap.error("--data and --pack exclude each other")
    if args.slow_mbps <= 0:
        ap.error("--slow-mbps must be positive")
    size = args.file_kib * 1024
    if not args.slow_disk:
        data = args.pack or args.data or os.path.join(tempfile.gettempdir(),
                                                      "iolens-demo-data")
        if not args.pack:
            t = time.monotonic()
            make_dataset(data, args.files, size)
            print(f"demo: dataset {data}: {args.files} files of {args.file_kib} KiB "
                  f"(ready in {time.monotonic() - t:.1f} s)", flush=True)
        workers = 2 if args.workers is None else args.workers
        ready = before_epoch = None
        if args.throttle:
            # What the training imports is read in before the throttle: its files live on the
            # backing disk too.
            import torch.utils.data  # noqa: PLC0415
            if args.pack:
                import h5py  # type: ignore[import-untyped,unused-ignore]  # noqa: F401, PLC0415
                import lmdb  # noqa: F401, PLC0415

            cgroup = args.throttle
            # More workers than cores are fine here: they wait on the disk, not the CPU.
            warnings.filterwarnings("ignore", message="This DataLoader will create",
                                    category=UserWarning)

            def ready() -> None:
                evict_tree(data)
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
                    fh.write(str(os.getpid()))
                print(f"demo: this process and its DataLoader workers now read through the "
                      f"limits of blkio cgroup {os.path.basename(cgroup)}; {data} leaves "
                      "the page cache before every epoch", flush=True)

            def before_epoch() -> None:
                evict_tree(data)
        return train(data, args.epochs, workers, args.batch_size, ready=ready,
                     before_epoch=before_epoch, pack=bool(args.pack))

    from iolens.demo.slowdisk import (  # noqa: PLC0415 - only the slow-disk demo needs it
        SlowDisk,
        SlowDiskUnavailable,
        missing_requirements,
    )

    missing = missing_requirements()
    if missing:
        print(f"demo: --slow-disk needs {'; '.join(missing)}; the plain demo "
              "(python -m iolens.demo, make demo) runs without it", file=sys.stderr)
        return 2
    # torch is read in before this process joins the throttled cgroup: its
    # libraries live on the backing disk too, and would load at the slow disk's pace.
    import torch.utils.data  # noqa: F401, PLC0415

    # Four workers on fewer cores are fine here: they wait on the disk, not the CPU.
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    try:
        with SlowDisk(slow_disk_size(args.files, size),
                      read_bps=int(args.slow_mbps * (1 << 20))) as disk:
            print(f"demo: slow disk: {disk.describe()}", flush=True)
            # The recorder finds the devices a job uses through the files it has open.
            # Holding the disk's root open lets it find this one at its next look, before
            # the first batch, instead of by catching a DataLoader worker mid-read.
            held = os.open(disk.mount_point, os.O_RDONLY | os.O_DIRECTORY)
            try:
                code = train_on_slow_disk(disk, args)
            finally:
                os.close(held)  # an open file would keep the mount busy at cleanup
            loop, cgroup = disk.loop_name, os.path.basename(disk.cgroup)
    except SlowDiskUnavailable as exc:
        print(f"demo: {exc}; the plain demo (python -m iolens.demo, make demo) runs without it",
              file=sys.stderr)
        return 2
    print(f"demo: slow disk removed ({loop} detached, cgroup {cgroup} and the mount gone)",
          flush=True)
    return code


def evict_tree(root: str) -> None:
    """Drop the cached pages of the files under ``root`` (a dataset larger than memory would
    find none of them cached at the next epoch)."""
    from iolens.demo.slowdisk import drop_cached_tree  # noqa: PLC0415

    drop_cached_tree(root)


def train_on_slow_disk(disk: SlowDisk, args: argparse.Namespace) -> int:
    """Write the dataset on ``disk``, then train with this process and its workers throttled."""
    data = os.path.join(disk.mount_point, "data")
    t = time.monotonic()
    make_dataset(data, args.files, args.file_kib * 1024)
    ready_s = time.monotonic() - t

    def ready() -> None:
        # Only the dataset leaves the page cache (a global drop would send this
        # process's own code pages through the throttle too); then this process
        # joins the throttled cgroup, and the DataLoader workers it forks with it.
        disk.evict()
        disk.join(os.getpid())
        print(f"demo: dataset {data}: {args.files} files of {args.file_kib} KiB "
              f"(ready in {ready_s:.1f} s); this process and its DataLoader workers "
              f"now read through the {args.slow_mbps:g} MB/s limit, and the dataset "
              "leaves the page cache before every epoch", flush=True)

    workers = 4 if args.workers is None else args.workers
    return train(data, args.epochs, workers, args.batch_size, ready=ready,
                 before_epoch=disk.evict)


def train(data: str, epochs: int, workers: int, batch_size: int, *,
          ready: Callable[[], None] | None = None,
          before_epoch: Callable[[], None] | None = None, pack: bool = False) -> int:
    """Train the small CNN for ``epochs`` over the files under ``data`` (or the pack at
    ``data``, read in shuffled blocks of a batch).

    ``ready`` runs once before the first epoch, after a warm-up step;
    ``before_epoch`` before each later epoch.
    """
    import torch  # noqa: PLC0415 - the demo's own dependency, not iolens'
    from torch.utils.data import DataLoader, Dataset  # noqa: PLC0415

    class Files(Dataset[tuple[torch.Tensor, int]]):
        def __init__(self, root: str) -> None:
            self.items = sorted(
                (os.path.join(root, c, f), int(c[5:]))
                for c in os.listdir(root) if c.startswith("class")
                for f in os.listdir(os.path.join(root, c)))

        def __len__(self) -> int:
            return len(self.items)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            path, label = self.items[i]
            with open(path, "rb") as fh:
                return decode(fh.read()), label

    def decode(raw: bytes) -> torch.Tensor:
        pixels = torch.frombuffer(bytearray(raw[: 3 * 64 * 64]), dtype=torch.uint8)
        return pixels.view(3, 64, 64).float().div_(255)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if pack:
        from iolens.data import BlockShuffleSampler, HDF5Dataset, LMDBDataset  # noqa: PLC0415
        from iolens.pack import read_manifest  # noqa: PLC0415

        kind = HDF5Dataset if read_manifest(data)["format"] == "hdf5" else LMDBDataset
        ds = kind(data, transform=decode)
        loader = DataLoader(ds, batch_size=batch_size, num_workers=workers,
                            sampler=BlockShuffleSampler(ds, batch_size))
    else:
        loader = DataLoader(Files(data), batch_size=batch_size, shuffle=True,
                            num_workers=workers)
    # About 45 ms a step of 32 samples on one core: a model whose step the data can keep up
    # with once it is packed, on the cycle's slow disk.
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, stride=2), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(), torch.nn.Linear(512, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if ready is not None:
        # One step on a blank batch at learning rate 0 (the model stays as it is), so
        # the code a training step runs is in memory before ready() throttles the reads.
        warm = torch.optim.SGD(model.parameters(), lr=0.0)
        blank = torch.zeros(2, 3, 64, 64)
        torch.nn.functional.cross_entropy(model(blank), torch.zeros(2, dtype=torch.long)) \
            .backward()  # type: ignore[no-untyped-call]
        warm.step()
        model.zero_grad()
        ready()
    for epoch in range(epochs):
        if before_epoch is not None and epoch:
            before_epoch()
        t = time.monotonic()
        seen = 0
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            seen += len(y)
        dt = time.monotonic() - t
        print(f"demo: epoch {epoch + 1}/{epochs}: {seen} samples in {dt:.1f} s "
              f"({seen / dt:.0f} samples/s), loss {loss.item():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
