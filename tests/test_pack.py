"""`iolens pack` and the pack datasets: every byte and label comes back, through DataLoaders
with workers too; an interrupted pack resumes to the same result; unreadable files are skipped
and reported; and, on a slow disk, packing turns a storage-bound training into a faster one."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from iolens import pack as packing
from iolens.cli.pack import main
from iolens.data import HDF5Dataset, LMDBDataset, PackDataset

# Four DataLoader workers on two cores are fine here: they read small samples.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

DATASETS: dict[str, type[PackDataset]] = {"lmdb": LMDBDataset, "hdf5": HDF5Dataset}


def expected(root: Path) -> list[tuple[str, bytes, int]]:
    """(relative path, bytes, label) of every regular file under a class folder, in the
    order ImageFolder lists them."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = []
    for label, name in enumerate(classes):
        for folder, _, files in sorted(os.walk(root / name)):
            for f in sorted(files):
                path = Path(folder, f)
                if not path.is_file():  # a FIFO, a dangling symlink: not a sample
                    continue
                out.append((str(path.relative_to(root)), path.read_bytes(), label))
    return out


def make_tree(root: Path, files: int = 60, seed: int = 1) -> Path:
    rng = random.Random(seed)
    names = ["cat", "dog", "zebra crossing", "ünïcödé"]
    for i in range(files):
        cls = names[i % len(names)]
        sub = ["", "nested", "nested/deeper", "with space"][i % 3 if i % 5 else 3]
        folder = root / cls / sub
        folder.mkdir(parents=True, exist_ok=True)
        size = 0 if i % 11 == 0 else rng.randrange(1, 6000)
        (folder / f"sample {i:03d} é.bin").write_bytes(rng.randbytes(size))
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tree(tmp_path_factory.mktemp("pack") / "src")


def pack(src: Path, dst: Path, *args: str) -> int:
    return main([str(src), str(dst), *args])


def keep_bytes(batch: list[tuple[Any, int]]) -> list[tuple[Any, int]]:
    return batch


def read_tars(dst: Path) -> list[tuple[bytes, int]]:
    """(bytes, label) of every sample of a WebDataset pack, in its order, read with tarfile."""
    import tarfile

    m = json.loads((dst / "manifest.json").read_text())
    out: list[tuple[bytes, int]] = []
    for s in m["shards"]:
        with tarfile.open(dst / s["file"]) as tar:
            files: dict[str, bytes] = {}
            for member in tar:
                fh = tar.extractfile(member)
                assert fh is not None
                files[member.name] = fh.read()
        for e in m["samples"][s["first"]:s["first"] + s["count"]]:
            name = f"{e['key']}.{packing.tar_extension(e['path'])}"
            label = int(files[f"{e['key']}.cls"]) if e["label"] is not None else -1
            out.append((files[name], label))
    return out


def wds_samples(dst: Path, workers: int, *, shuffle: bool) -> list[tuple[bytes, int]]:
    """Every sample of a WebDataset pack as the webdataset library reads it, through a
    DataLoader with ``workers``."""
    wds = pytest.importorskip("webdataset")
    from torch.utils.data import DataLoader

    urls = sorted(str(p) for p in dst.glob("shard-*.tar"))
    ds = wds.WebDataset(urls, shardshuffle=len(urls) if shuffle else False, empty_check=False)
    if shuffle:
        ds = ds.shuffle(50)
    ds = ds.map(lambda d: (d[next(k for k in d if not k.startswith("__") and k != "cls")],
                           int(d["cls"]) if "cls" in d else -1))
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    return [(bytes(b), int(label)) for b, label in loader]


def test_parse_size() -> None:
    assert packing.parse_size("512M") == 512 << 20
    assert packing.parse_size("4G") == 4 << 30
    assert packing.parse_size("1.5GiB") == 3 << 29
    assert packing.parse_size("100k") == 102400
    assert packing.parse_size("65536") == 65536
    for bad in ("", "12X", "-1M", "0", "M"):
        with pytest.raises(ValueError, match="size"):
            packing.parse_size(bad)


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
@pytest.mark.parametrize("shard", [None, "9K"])
def test_round_trip_through_dataloaders(tree: Path, tmp_path: Path, fmt: str,
                                        shard: str | None) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dst = tmp_path / "pack"
    args = ["--format", fmt] + (["--shard-size", shard] if shard else []) + \
        ["--commit-every", "7"]
    assert pack(tree, dst, *args) == 0
    want = expected(tree)
    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["format"] == fmt and manifest["complete"] and manifest["verified"]
    assert manifest["classes"] == ["cat", "dog", "zebra crossing", "ünïcödé"]
    assert manifest["count"] == len(want) and manifest["skipped"] == []
    assert [(s["path"], s["size"], s["label"]) for s in manifest["samples"]] == \
        [(p, len(b), label) for p, b, label in want]
    assert [s["blake2b"] for s in manifest["samples"]] == [packing.checksum(b) for _, b, _ in want]
    if shard:  # shards of about 9 KiB: none over it unless it holds one larger sample
        assert len(manifest["shards"]) > 5
        assert all(s["bytes"] <= 9 << 10 for s in manifest["shards"] if s["count"] > 1)
    else:
        assert len(manifest["shards"]) == 1
    assert sorted(os.listdir(dst)) == sorted(["manifest.json"] +
                                             [s["file"] for s in manifest["shards"]])

    ds = DATASETS[fmt](dst)
    assert len(ds) == len(want) and ds.classes == manifest["classes"]
    assert [ds[i] for i in range(len(ds))] == [(b, label) for _, b, label in want]
    assert ds[-1] == (want[-1][1], want[-1][2])
    with pytest.raises(IndexError):
        ds[len(ds)]
    # A transform gets the bytes; the label is left as it is.
    assert DATASETS[fmt](dst, transform=len)[3] == (len(want[3][1]), want[3][2])
    # Pickled after reading (its open handles stay behind), as the spawn start method does.
    again = pickle.loads(pickle.dumps(ds))
    assert again._handles == {} and again[5] == ds[5]

    for workers in (0, 1, 4):
        loader = DataLoader(ds, batch_size=5, num_workers=workers, collate_fn=keep_bytes)
        got = [item for batch in loader for item in batch]
        assert got == [(b, label) for _, b, label in want], workers
    # Persistent workers, two epochs, shuffled: every sample once per epoch.
    loader = DataLoader(ds, batch_size=4, num_workers=2, shuffle=True, collate_fn=keep_bytes,
                        persistent_workers=True, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        got = sorted(((label, b) for batch in loader for b, label in batch))
        assert got == sorted((label, b) for _, b, label in want)


def test_spawned_workers_read_the_pack(tree: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    assert pack(tree, tmp_path / "pack") == 0
    ds = LMDBDataset(tmp_path / "pack")
    ds[0]  # a handle open in the parent does not travel
    loader = DataLoader(ds, batch_size=16, num_workers=1, collate_fn=keep_bytes,
                        multiprocessing_context="spawn")
    assert [item for batch in loader for item in batch] == [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_flat_folder_is_packed_without_labels(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "flat"
    src.mkdir()
    blobs = {f"{i:02d} x.dat": os.urandom(i * 100) for i in range(12)}
    for name, data in blobs.items():
        (src / name).write_bytes(data)
    assert pack(src, tmp_path / "pack", "--format", fmt) == 0
    manifest = json.loads((tmp_path / "pack" / "manifest.json").read_text())
    assert manifest["classes"] == [] and not manifest["labeled"]
    assert all(s["label"] is None for s in manifest["samples"])
    ds = DATASETS[fmt](tmp_path / "pack")
    assert [ds[i] for i in range(len(ds))] == [(blobs[n], -1) for n in sorted(blobs)]


def test_unreadable_files_are_skipped_and_reported(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_tree(tmp_path / "src", files=20)
    os.mkfifo(src / "cat" / "a fifo.bin")
    (src / "dog" / "dangling.bin").symlink_to(src / "nowhere")
    (src / "dog" / "loop.bin").symlink_to(src / "dog" / "loop.bin")
    (src / "cat" / "nested" / "cycle").symlink_to(src / "cat")
    (src / "notes.txt").write_text("not a sample")
    gone, swapped = src / "dog" / "gone.bin", src / "dog" / "swapped.bin"
    gone.write_bytes(b"x")
    swapped.write_bytes(b"y")
    listed = packing.list_samples

    def list_then_change(where: str) -> packing.Listing:
        # Between the listing and the reading, one file vanishes and one becomes a folder.
        listing = listed(where)
        gone.unlink()
        swapped.unlink()
        swapped.mkdir()
        return listing

    monkeypatch.setattr(packing, "list_samples", list_then_change)
    assert pack(src, tmp_path / "pack") == 1
    out = capsys.readouterr().out
    manifest = json.loads((tmp_path / "pack" / "manifest.json").read_text())
    reasons = {s["path"]: s["reason"] for s in manifest["skipped"]}
    assert reasons == {
        "notes.txt": "not in a class folder",
        "cat/a fifo.bin": "a FIFO, not a file",
        "cat/nested/cycle": "a folder already packed (a cycle of symlinks)",
        "dog/dangling.bin": "no such file: vanished, or a dangling symlink",
        "dog/loop.bin": "a symlink loop",
        "dog/gone.bin": "no such file: vanished, or a dangling symlink",
        "dog/swapped.bin": "a folder, not a file",
    }
    assert "skipped 7: " in out and "cat/a fifo.bin (a FIFO, not a file)" in out
    assert "and 2 more (see the manifest)" in out
    # The rest is packed: every regular file, byte for byte.
    ds = LMDBDataset(tmp_path / "pack")
    want = [(b, label) for p, b, label in expected(src) if p not in reasons]
    assert len(want) == 20 and [ds[i] for i in range(len(ds))] == want


def test_bad_arguments_exit_2(tree: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    def err(*args: str) -> str:
        assert main(list(args)) == 2
        return capsys.readouterr().err

    assert "does not exist" in err(str(tmp_path / "nope"), str(tmp_path / "p"))
    assert "inside SRC" in err(str(tree), str(tree / "cat" / "p"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("mine")
    assert "is not a pack" in err(str(tree), str(other))
    assert "--shard-size" in err(str(tree), str(tmp_path / "p"), "--shard-size", "big")
    assert "invalid choice" in err(str(tree), str(tmp_path / "p"), "--format", "zip")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no files" in err(str(empty), str(tmp_path / "p"))
    assert pack(tree, tmp_path / "done") == 0
    assert "not of" in err(str(make_tree(tmp_path / "src2", 5)), str(tmp_path / "done"))
    assert "--format lmdb" in err(str(tree), str(tmp_path / "done"), "--format", "hdf5")
    # The same command on a finished pack says so and leaves it as it is.
    assert pack(tree, tmp_path / "done") == 0
    assert "already holds" in capsys.readouterr().out



@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_shuffled_pack_read_in_blocks_gives_every_sample_once(
        tree: Path, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from iolens.data import BlockShuffleSampler

    dst = tmp_path / "pack"
    assert pack(tree, dst, "--format", fmt, "--shuffle", "--seed", "5", "--shard-size",
                "40K") == 0
    want = expected(tree)
    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["order"] == {"kind": "shuffled", "seed": 5}
    order = [s["path"] for s in manifest["samples"]]
    assert sorted(order) == sorted(p for p, _, _ in want) and order != [p for p, _, _ in want]
    # the same seed draws the same order; the order is part of what a resume must match
    again = tmp_path / "again"
    assert pack(tree, again, "--format", fmt, "--shuffle", "--seed", "5", "--shard-size",
                "40K") == 0
    assert [s["path"] for s in json.loads((again / "manifest.json").read_text())["samples"]] \
        == order
    capsys.readouterr()
    assert pack(tree, dst, "--format", fmt, "--shard-size", "40K") == 2
    assert "--shuffle --seed 5" in capsys.readouterr().err
    ds = DATASETS[fmt](dst)
    by_path = {p: (b, label) for p, b, label in want}
    assert [ds[i] for i in range(len(ds))] == [by_path[p] for p in order]
    # __getitems__: runs across shards, out of order, repeated and negative indices
    idx = [7, 3, 4, 5, 6, -1, 30, 31, 3, 0]
    assert ds.__getitems__(idx) == [ds[i] for i in idx]
    with pytest.raises(IndexError):
        ds.__getitems__([1, len(ds)])
    assert DATASETS[fmt](dst, transform=len).__getitems__([2, 3]) == \
        [(len(ds[2][0]), ds[2][1]), (len(ds[3][0]), ds[3][1])]

    sampler = BlockShuffleSampler(ds, 8, seed=1)
    epochs = [list(sampler) for _ in range(2)]
    for got in epochs:
        assert sorted(got) == list(range(len(ds)))
        blocks = [got[k:k + 8] for k in range(0, len(got), 8)]
        assert all(b == list(range(b[0], b[0] + len(b))) and b[0] % 8 == 0 for b in blocks)
        assert blocks[-1][0] == len(ds) // 8 * 8 or len(ds) % 8 == 0  # the short one last
    assert epochs[0] != epochs[1]  # a new order each epoch
    sampler.set_epoch(0)
    assert list(sampler) == epochs[0] == list(sampler)  # set_epoch fixes it
    with pytest.raises(ValueError, match="block"):
        BlockShuffleSampler(ds, 0)
    # Through a DataLoader with workers: every sample once.
    def runs(batch: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
        return batch

    loader = DataLoader(ds, batch_size=8, sampler=BlockShuffleSampler(ds, 8), num_workers=2,
                        collate_fn=runs, generator=torch.Generator().manual_seed(0))
    got_items = [item for batch in loader for item in batch]
    assert sorted(got_items) == sorted(by_path.values())


@pytest.mark.parametrize("workers", [0, 3])
def test_webdataset_shards_read_back_through_webdataset(tree: Path, tmp_path: Path,
                                                        workers: int) -> None:
    pytest.importorskip("torch")
    dst = tmp_path / "wds"
    assert pack(tree, dst, "--format", "webdataset", "--shard-size", "9K", "--shuffle") == 0
    want = expected(tree)
    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["format"] == "webdataset" and len(manifest["shards"]) > 5
    assert sorted(os.listdir(dst)) == sorted(["manifest.json"] +
                                             [s["file"] for s in manifest["shards"]])
    originals = sorted((b, label) for _, b, label in want)
    # the manifest's order and offsets are the tar's own
    by_path = {p: (b, label) for p, b, label in want}
    assert read_tars(dst) == [by_path[e["path"]] for e in manifest["samples"]]
    for shuffle in (False, True):
        got = wds_samples(dst, workers, shuffle=shuffle)
        assert sorted(got) == originals, (workers, shuffle)  # every file once, its label
    unlabeled = tmp_path / "flat"
    unlabeled.mkdir()
    (unlabeled / "a.JPG").write_bytes(b"jpeg bytes")
    (unlabeled / "b").write_bytes(b"no suffix")
    (unlabeled / "c.tar.gz").write_bytes(b"double")
    assert pack(unlabeled, tmp_path / "flat.wds", "--format", "webdataset") == 0
    assert read_tars(tmp_path / "flat.wds") == [(b"jpeg bytes", -1), (b"no suffix", -1),
                                                (b"double", -1)]
    import tarfile

    with tarfile.open(tmp_path / "flat.wds" / "shard-00000.tar") as tar:
        assert tar.getnames() == ["0000000000.jpg", "0000000001.bin", "0000000002.gz"]


# ---- resuming ---------------------------------------------------------------------------

SLOW_PACK = """
import sys, time
import iolens.pack as p
read = p.read_sample
def slow(path):
    time.sleep(0.003)
    return read(path)
p.read_sample = slow
from iolens.cli.pack import main
sys.exit(main(sys.argv[1:]))
"""


def journal_lines(dst: Path) -> int:
    try:
        return (dst / packing.STATE_DIR / "journal.jsonl").read_text().count("\n")
    except FileNotFoundError:
        return 0


def comparable(dst: Path) -> dict[str, Any]:
    m = json.loads((dst / "manifest.json").read_text())
    return {k: m[k] for k in ("format", "count", "bytes", "classes", "shards", "samples",
                              "skipped", "digest", "verified")}


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("many") / "src"
    rng = random.Random(7)
    for i in range(2000):
        folder = src / f"class{i % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.bin").write_bytes(rng.randbytes(rng.randrange(0, 3000)))
    os.mkfifo(src / "class1" / "fifo")
    return src


@pytest.mark.parametrize(("fmt", "signum"), [("lmdb", signal.SIGKILL), ("hdf5", signal.SIGKILL),
                                             ("webdataset", signal.SIGKILL),
                                             ("lmdb", signal.SIGINT)])
def test_an_interrupted_pack_resumes_to_the_same_result(many: Path, tmp_path: Path, fmt: str,
                                                        signum: int) -> None:
    args = ["--format", fmt, "--shard-size", "1M", "--commit-every", "50"]
    assert pack(many, tmp_path / "whole", *args) == 1  # the FIFO is skipped
    script = tmp_path / "slow_pack.py"
    script.write_text(SLOW_PACK)
    dst = tmp_path / "resumed"
    cmd = [sys.executable, str(script), str(many), str(dst), *args, "--readers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while journal_lines(dst) < 8 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    if signum == signal.SIGINT:
        assert proc.returncode == 130, err
        assert "interrupted; run the same command again to continue" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    done = journal_lines(dst)
    assert not (dst / "manifest.json").exists() and 8 <= done < 40, done
    t = time.monotonic()
    again = subprocess.run([sys.executable, "-m", "iolens.cli.pack", str(many), str(dst), *args],
                           capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 1, again.stderr
    assert ", resumed at file " in again.stdout, again.stdout
    assert comparable(dst) == comparable(tmp_path / "whole")
    assert not (dst / packing.STATE_DIR).exists()
    want = [(b, label) for p, b, label in expected(many) if p != "class1/fifo"]
    if fmt == "webdataset":  # the same tar files, byte for byte
        assert read_tars(dst) == want
        for s in json.loads((dst / "manifest.json").read_text())["shards"]:
            assert (dst / s["file"]).read_bytes() == (tmp_path / "whole" / s["file"]).read_bytes()
    else:
        ds = DATASETS[fmt](dst)
        assert [ds[i] for i in range(len(ds))] == want
    print(f"resumed {fmt} pack after {signal.Signals(signum).name} at journal line {done} in "
          f"{time.monotonic() - t:.2f} s")


def test_an_hdf5_shard_damaged_by_a_kill_is_written_again(many: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str],
                                                          ) -> None:
    args = ["--format", "hdf5", "--shard-size", "1M", "--commit-every", "50", "--readers", "1"]
    assert pack(many, tmp_path / "whole", *args) == 1
    read, calls = packing.read_sample, [0]

    def interrupted(path: str) -> bytes:
        calls[0] += 1
        if calls[0] == 1000:  # in the middle of the second shard
            raise KeyboardInterrupt
        return read(path)

    monkeypatch.setattr(packing, "read_sample", interrupted)
    dst = tmp_path / "damaged"
    assert pack(many, dst, *args) == 130
    monkeypatch.setattr(packing, "read_sample", read)
    (part,) = dst.glob("*.h5.part")
    with open(part, "r+b") as fh:  # the file's superblock is garbage: HDF5 cannot open it
        fh.write(os.urandom(512))
    capsys.readouterr()
    assert pack(many, dst, *args) == 1
    first = json.loads((tmp_path / "whole" / "manifest.json").read_text())["shards"][1]["first"]
    assert f"resumed at file {first})" in capsys.readouterr().out  # its shard from the start
    assert comparable(dst) == comparable(tmp_path / "whole")
