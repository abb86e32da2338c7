"""The data-library lab: one small dataset in every format users read through, and one
training script that reads it the way each library's own docs show.

    with SlowDisk(1 << 30, read_bps=8 << 20) as disk:
        paths = build(Path(disk.mount_point) / "lab", FORMATS)
        disk.evict()
        script.write_text(TRAIN)
        # iolens run -- python train.py READER DATA SECONDS CGROUP WORKERS STEP_S BATCH [EXTRA]

Every format holds the same ``samples`` samples of ``kib`` KiB of random bytes (sample i
is :func:`sample` ``(i, kib)``, label ``i % 4``), except ``jpeg``, whose images are random
noise sized to come out near ``kib`` KiB. :func:`build` returns, per format, what its
reader takes as DATA:

=========  =========================================================  ===================
format     what is written                                            TRAIN's reader(s)
=========  =========================================================  ===================
files      DATA/00000000.bin, ... (one file a sample)                  files
jpeg       DATA/c0..c3/00000000.jpg, ... (an image folder)             jpeg
lmdb       an lmdb environment, key b"%08d", value the bytes           lmdb, lmdb-bytes,
                                                                      lmdb-uint8
pack       ``iolens pack files DATA --shuffle`` (LMDB)                 pack
h5         DATA, one HDF5 file: ``data`` (samples, kib*1024) uint8,    h5py
           ``labels``
arrow      ``datasets.Dataset.save_to_disk(DATA)``: ``data`` binary,   hf
           ``label`` int
wds        DATA/shard-000000.tar, ... (webdataset.ShardWriter,         wds, wds-http
           ~6 MiB each): KEY.bin, KEY.cls
litdata    ``litdata.optimize()`` output (chunks of ~6 MiB and         litdata
           index.json): the "remote" folder
=========  =========================================================  ===================

TRAIN's arguments: READER DATA SECONDS CGROUP WORKERS STEP_S BATCH [EXTRA], with CGROUP a
blkio cgroup folder the job joins or ``-``, and EXTRA the cache folder for ``litdata``
(emptied at the start, so the run copies every chunk from DATA) or the base URL for
``wds-http`` (DATA is then the shard folder the server serves, for the names of the
shards and for the eviction). The script imports its reader's library before it joins
the cgroup (as torch: a lab run reads its code in first), drops DATA's pages from the page
cache before every epoch (a dataset larger than RAM: pages that a worker still maps, as
lmdb's and Arrow's, stay), sleeps ``STEP_S`` a batch (the model step) and stops after
``SECONDS``; it ends printing ``done`` and ``samples N``, the samples it consumed. Each
reader returns a tensor of a sample's first 256 bytes and its label, but ``lmdb-bytes``
(the value as stored, bytes: pickled whole on its way from a worker) and ``lmdb-uint8``
(the value as a uint8 tensor: through shared memory).

:func:`http_server` serves a folder over HTTP from inside a blkio cgroup (a capped store,
the job outside it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

FORMATS = ("files", "jpeg", "lmdb", "pack", "h5", "arrow", "wds", "litdata")
"""Every format :func:`build` writes."""
READERS = ("files", "jpeg", "lmdb", "pack", "h5py", "hf", "wds", "wds-http", "litdata",
           "lmdb-bytes", "lmdb-uint8")
"""Every reader of :data:`TRAIN`."""
FORMAT_OF = {"files": "files", "jpeg": "jpeg", "lmdb": "lmdb", "pack": "pack", "h5py": "h5",
             "hf": "arrow", "wds": "wds", "wds-http": "wds", "litdata": "litdata",
             "lmdb-bytes": "lmdb", "lmdb-uint8": "lmdb"}
"""The format each reader reads."""
CLASSES = 4
SHARD_BYTES = 6 << 20
"""The size of a WebDataset shard and of a litdata chunk."""


def sample(i: int, kib: int) -> bytes:
    """Sample ``i``: ``kib`` KiB of random bytes, the same in every format."""
    return random.Random(i).randbytes(kib << 10)


def build(root: Path, formats: Iterable[str], samples: int = 1200,
          kib: int = 64) -> dict[str, Path]:
    """Write the dataset under ``root`` in each of ``formats`` (see the module); returns the
    path each reader takes, per format. ``pack`` packs ``root/files``, written first when
    ``files`` is not asked for."""
    wanted = list(formats)
    unknown = sorted(set(wanted) - set(FORMATS))
    if unknown:
        raise ValueError(f"unknown formats {unknown}; known: {FORMATS}")
    root.mkdir(parents=True, exist_ok=True)
    data = [sample(i, kib) for i in range(samples)]
    out: dict[str, Path] = {}
    for fmt in FORMATS:
        if fmt not in wanted:
            continue
        dst = root / fmt
        if fmt == "files":
            _files(dst, data)
        elif fmt == "jpeg":
            _jpeg(dst, samples, kib)
        elif fmt == "lmdb":
            _lmdb(dst, data)
        elif fmt == "pack":
            src = root / "files"
            if not src.exists():
                _files(src, data)
            _pack(src, dst)
        elif fmt == "h5":
            dst = root / "h5" / "data.h5"
            _h5(dst, data)
        elif fmt == "arrow":
            _arrow(dst, data)
        elif fmt == "wds":
            _wds(dst, data)
        elif fmt == "litdata":
            _litdata(dst, samples, kib)
        out[fmt] = dst
    os.sync()
    return out


def _files(dst: Path, data: list[bytes]) -> None:
    dst.mkdir()
    for i, blob in enumerate(data):
        (dst / f"{i:08d}.bin").write_bytes(blob)


def _noise_jpeg(i: int, side: int) -> bytes:
    import io

    from PIL import Image

    img = Image.frombytes("RGB", (side, side), random.Random(i).randbytes(side * side * 3))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _jpeg(dst: Path, samples: int, kib: int) -> None:
    # Noise compresses evenly: one side length gives every image about the same size.
    side = 128
    for _ in range(3):
        size = len(_noise_jpeg(0, side))
        side = max(8, round(side * ((kib << 10) / size) ** 0.5))
    for c in range(CLASSES):
        (dst / f"c{c}").mkdir(parents=True)
    for i in range(samples):
        (dst / f"c{i % CLASSES}" / f"{i:08d}.jpg").write_bytes(_noise_jpeg(i, side))


def _lmdb(dst: Path, data: list[bytes]) -> None:
    import lmdb

    size = sum(len(b) for b in data)
    env = lmdb.open(str(dst), map_size=2 * size + (64 << 20))
    try:
        with env.begin(write=True) as txn:
            for i, blob in enumerate(data):
                txn.put(b"%08d" % i, blob)
    finally:
        env.close()


def _pack(src: Path, dst: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "iolens", "pack", str(src), str(dst),
                           "--shuffle"], capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"iolens pack failed ({done.returncode}): {done.stderr}")


def _h5(dst: Path, data: list[bytes]) -> None:
    import h5py  # type: ignore[import-untyped,unused-ignore]
    import numpy as np

    dst.parent.mkdir()
    with h5py.File(dst, "w") as f:
        f.create_dataset("data", data=np.frombuffer(b"".join(data), dtype=np.uint8)
                         .reshape(len(data), -1))
        f.create_dataset("labels", data=np.arange(len(data), dtype=np.int64) % CLASSES)


def _arrow(dst: Path, data: list[bytes]) -> None:
    import datasets  # type: ignore[import-untyped,unused-ignore]

    ds = datasets.Dataset.from_dict({"data": data,
                                     "label": [i % CLASSES for i in range(len(data))]})
    ds.save_to_disk(str(dst))


def _wds(dst: Path, data: list[bytes]) -> None:
    import webdataset as wds  # type: ignore[import-untyped,unused-ignore]

    dst.mkdir()
    with wds.ShardWriter(str(dst / "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for i, blob in enumerate(data):
            sink.write({"__key__": f"{i:08d}", "bin": blob, "cls": i % CLASSES})


def _litdata_item(i: int, kib: int) -> dict[str, Any]:
    """One sample as litdata's optimize() stores it (run in its worker process)."""
    return {"data": sample(i, kib), "label": i % CLASSES}


def _litdata(dst: Path, samples: int, kib: int) -> None:
    import litdata  # type: ignore[import-untyped,unused-ignore]

    # optimize() asks PyPI for a newer litdata first (seconds, and a socket out of the lab).
    # Its worker is forked: spawned (its default) it would import the caller's __main__ again
    # (a script without a __main__ guard runs twice) and torch again (seconds).
    with mock.patch("litdata.processing.functions._check_version_and_prompt_upgrade"), \
            contextlib.redirect_stdout(sys.stderr):
        litdata.optimize(fn=functools.partial(_litdata_item, kib=kib),
                         inputs=list(range(samples)), output_dir=str(dst),
                         chunk_bytes=SHARD_BYTES, num_workers=1, reorder_files=False,
                         start_method="fork")


@contextlib.contextmanager
def http_server(folder: Path, cgroup: str) -> Iterator[str]:
    """``python -m http.server`` serving ``folder`` on a free loopback port, started inside
    the blkio ``cgroup`` (a folder, or ``-`` for none) so that its disk reads are throttled;
    yields its base URL once it answers, and stops it at the end."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port),
           "--directory", str(folder)]
    if cgroup != "-":
        cmd = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh", *cmd]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # its code is read through the throttle too
        while True:
            try:
                with urllib.request.urlopen(url + "/", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"http.server exited ({proc.returncode})") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


TRAIN = r'''
import os, shutil, sys, time, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)
READER, D, SECONDS, CGROUP = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
WORKERS, STEP_S, BATCH = int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
EXTRA = sys.argv[8] if len(sys.argv) > 8 else ""

# The reader's library, read in before the throttle, as torch is.
if READER == "jpeg":
    from PIL import Image
elif READER.startswith("lmdb"):
    import lmdb
elif READER == "pack":
    from iolens.data import BlockShuffleSampler, LMDBDataset
elif READER == "h5py":
    import h5py
elif READER == "hf":
    import datasets
elif READER in ("wds", "wds-http"):
    import webdataset as wds
elif READER == "litdata":
    import litdata
    from litdata.streaming import dataset as _litdata_dataset
    from litdata.streaming.cache import Dir
    # StreamingDataset() asks PyPI for a newer litdata: not part of reading the data.
    _litdata_dataset._check_version_and_prompt_upgrade = lambda version: None

if CGROUP != "-":  # the slow disk's readers
    with open(os.path.join(CGROUP, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))

def evict():  # a dataset larger than RAM: no epoch finds it in the page cache
    if os.path.isfile(D):
        paths = [D]
    else:
        paths = [os.path.join(r, f) for r, _, files in os.walk(D) for f in files]
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

def tensor(data):  # a cheap input for the model step: the first 256 bytes
    return torch.frombuffer(bytearray(bytes(data[:256])), dtype=torch.uint8).float()

order = dict(shuffle=True)
if READER == "files":
    NAMES = sorted(os.listdir(D))
    class Files(Dataset):
        def __len__(self):
            return len(NAMES)
        def __getitem__(self, i):
            with open(os.path.join(D, NAMES[i]), "rb") as fh:
                return tensor(fh.read()), i % 4
    ds = Files()
elif READER == "jpeg":  # an image folder, as torchvision's ImageFolder lists it
    CLASSES = sorted(os.listdir(D))
    ITEMS = [(os.path.join(D, c, name), k) for k, c in enumerate(CLASSES)
             for name in sorted(os.listdir(os.path.join(D, c)))]
    class Images(Dataset):
        def __len__(self):
            return len(ITEMS)
        def __getitem__(self, i):
            path, label = ITEMS[i]
            with Image.open(path) as img:
                small = img.convert("RGB").resize((16, 16))
            return tensor(small.tobytes()) / 255, label
    ds = Images()
elif READER.startswith("lmdb"):  # one environment per process, opened in the worker
    class Lmdb(Dataset):
        def __init__(self):
            env = lmdb.open(D, readonly=True, lock=False)
            self.n = env.stat()["entries"]
            env.close()
            self.env = None
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            if self.env is None:
                self.env = lmdb.open(D, readonly=True, lock=False)
            with self.env.begin() as txn:
                value = txn.get(b"%08d" % i)
            if READER == "lmdb-bytes":  # the stored bytes, decoded in the step
                return value, i % 4
            if READER == "lmdb-uint8":  # ... as a tensor of them
                return torch.frombuffer(bytearray(value), dtype=torch.uint8), i % 4
            return tensor(value), i % 4
    ds = Lmdb()
elif READER == "pack":  # as iolens' pack advice says
    ds = LMDBDataset(D, transform=tensor)
    order = dict(sampler=BlockShuffleSampler(ds, BATCH))
elif READER == "h5py":  # one file handle per process, opened in the worker
    class H5(Dataset):
        def __init__(self):
            with h5py.File(D, "r") as f:
                self.n = len(f["labels"])
            self.f = None
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            if self.f is None:
                self.f = h5py.File(D, "r")
            return tensor(self.f["data"][i]), int(self.f["labels"][i])
    ds = H5()
elif READER == "hf":  # Arrow files mapped by the main process, indexed in the workers
    hf = datasets.load_from_disk(D)
    class HF(Dataset):
        def __len__(self):
            return len(hf)
        def __getitem__(self, i):
            row = hf[i]
            return tensor(row["data"]), row["label"]
    ds = HF()
elif READER in ("wds", "wds-http"):  # shards split over the workers, read whole, in order
    SHARDS = sorted(name for name in os.listdir(D) if name.endswith(".tar"))
    if READER == "wds":
        urls = [os.path.join(D, name) for name in SHARDS]
    else:  # fetched by curl children of the workers
        urls = EXTRA.rstrip("/") + "/shard-{000000..%06d}.tar" % (len(SHARDS) - 1)
    ds = (wds.WebDataset(urls, shardshuffle=len(SHARDS)).shuffle(64).decode()
          .to_tuple("bin", "cls").map_tuple(tensor, int))
    order = {}
elif READER == "litdata":  # chunks copied from the "remote" folder into the cache
    shutil.rmtree(EXTRA, ignore_errors=True)  # a cold cache: every chunk is copied
    class Samples(litdata.StreamingDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return tensor(item["data"]), item["label"]
    ds = Samples(input_dir=Dir(path=EXTRA, url="local:" + D), shuffle=True)
else:
    sys.exit(f"unknown reader {READER}")

if READER == "litdata":
    loader = litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
else:
    loader = DataLoader(ds, batch_size=BATCH, num_workers=WORKERS,
                        persistent_workers=WORKERS > 0, **order)
end = time.monotonic() + SECONDS
n = 0
while time.monotonic() < end:
    evict()
    for x, y in loader:
        time.sleep(STEP_S)  # the model step
        n += len(y)
        if time.monotonic() > end:
            break
print("done")
print(f"samples {n}")
'''
"""The training script (see the module for its arguments)."""
