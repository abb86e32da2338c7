"""What serves the dataset (iolens/recorder/storage.py), on fake /proc trees over real folders.

The folders are real (a tmpfs, so their device number has major 0, as NFS and FUSE
mounts do); the mount table and mountstats are fixtures, so an NFS mount can be
followed on a kernel without an NFS client.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from iolens.recorder.storage import StorageWatch, kind_of, page_cache_visible

FIXTURES = Path(__file__).parent / "fixtures" / "nfs"


def _fake_proc(tmp_path: Path, folder: Path, fstype: str, source: str) -> Path:
    """A /proc whose mountinfo lists ``folder`` as a mount of ``fstype``."""
    st = os.stat(folder)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(
        "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        f"90 22 {major}:{minor} / {folder} rw,relatime shared:40 - {fstype} {source} rw\n")
    return proc


@pytest.fixture
def shm_folder() -> Iterator[Path]:
    base = Path("/dev/shm")
    if not base.is_dir() or os.major(os.stat(base).st_dev) != 0:
        pytest.skip("needs /dev/shm on a tmpfs")
    folder = base / f"iolens-storage-test-{os.getpid()}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_an_nfs_mount_is_named_and_followed_with_nfsiostat_figures(tmp_path: Path,
                                                                   shm_folder: Path) -> None:
    """The dataset's folder on an NFS mount: no block device, no page-cache figure, and
    each interval the mountstats rates of that mount."""
    text0 = (FIXTURES / "mountstats_0.txt").read_text()
    text1 = (FIXTURES / "mountstats_1.txt").read_text()
    mnt = str(shm_folder)
    proc = _fake_proc(tmp_path, shm_folder, "nfs4", "fileserver.lab:/export/datasets")
    stats = proc / "self" / "mountstats"
    stats.write_text(text0.replace("/mnt/datasets", mnt))
    watch = StorageWatch(str(proc), "/sys")
    data = shm_folder / "train"
    data.mkdir()
    served = watch.add(str(data))
    assert served is not None
    assert (served.mount, served.fstype, served.device, served.kind) == (mnt, "nfs4", None, "nfs")
    assert watch.add(str(data)) is None  # known already
    assert watch.sample(5.0) == {}  # a first snapshot: nothing to compare yet
    stats.write_text(text1.replace("/mnt/datasets", mnt))
    figures = watch.sample(5.0)[mnt]
    assert figures["read_ops_s"] > 0 and figures["read_avg_rtt_ms"] > 0, figures
    (entry,) = watch.meta()
    assert entry["page_cache_visible"] is False and entry["folders"] == [str(data)]


def test_a_fuse_mount_without_its_daemon_or_connection_still_maps(tmp_path: Path,
                                                                  shm_folder: Path) -> None:
    proc = _fake_proc(tmp_path, shm_folder, "fuse.s3fs", "s3fs")
    watch = StorageWatch(str(proc), str(tmp_path / "sys"))
    served = watch.add(str(shm_folder))
    assert served is not None and served.kind == "fuse" and served.device is None
    assert served.daemon is None  # no process here holds /dev/fuse for it
    fig = watch.sample(1.0)[str(shm_folder)]
    assert fig.get("waiting") is None  # no fusectl under the fake /sys
    assert watch.meta()[0]["subtype"] == "s3fs"


def test_kinds_and_where_the_page_cache_hit_holds() -> None:
    assert kind_of("ext4", "vda") == "block" and page_cache_visible("block")
    assert kind_of("fuse.rclone", None) == "fuse" and not page_cache_visible("fuse")
    assert kind_of("nfs4", None) == "nfs" and not page_cache_visible("nfs")
    assert kind_of("tmpfs", None) == "tmpfs" and not page_cache_visible("tmpfs")
    assert kind_of("overlay", None) == "overlay"
    assert kind_of("9p", None) == "other"


def test_folders_beyond_the_limits_are_counted_not_followed(tmp_path: Path) -> None:
    watch = StorageWatch()
    assert watch.add("relative/path") is None and watch.add("/proc/self") is None
    root = tmp_path / "many"
    for i in range(8):
        (root / str(i)).mkdir(parents=True)
    for i in range(8):
        watch.add(str(root / str(i)))
    (entry,) = [s for s in watch.meta() if any(str(root) in f for f in s["folders"])]
    assert len(entry["folders"]) == 5 and entry["more_folders"] == 3


def test_mapped_data_files_leave_out_code_system_and_special_mappings() -> None:
    from iolens.sources.procmaps import mapped_files

    text = "\n".join([
        "55d0c000-55d0d000 r--p 00000000 fe:00 131 /usr/bin/python3.11",
        "7f00-7f10 r--s 00000000 07:00 12 /data/imagenet/train.f32",
        "7f10-7f20 r--s 00100000 07:00 12 /data/imagenet/train.f32",
        "7f20-7f30 r-xp 00000000 fe:00 99 /venv/lib/torch/lib/libtorch_cpu.so",
        "7f30-7f40 r--p 00000000 fe:00 98 /venv/lib/libgomp.so.1.0.0",
        "7f40-7f50 rw-s 00000000 00:1a 5 /dev/shm/torch_123_456",
        "7f50-7f60 r--p 00000000 fe:00 97 /data/old.bin (deleted)",
        "7f60-7f70 rw-p 00000000 00:00 0 [heap]",
        "7f70-7f80 rw-p 00000000 00:00 0",
        "garbage",
        "7f80-7f90 r--s 00000000 07:00 13 /runs/x/timing/1.bin",
        "7f90-7fa0 r--s 00000000 07:00 14 /data/with space/labels.npy",
    ])
    assert mapped_files(text, ("/runs/x/timing",)) == [
        "/data/imagenet/train.f32", "/data/with space/labels.npy"]


def test_programs_mapped_without_a_library_name_are_not_data() -> None:
    from iolens.sources.procmaps import mapped_files

    text = "\n".join([
        "5600-5700 r--p 00000000 fe:00 131 /opt/conda/bin/python3.11",
        "5700-5800 r-xp 00001000 fe:00 131 /opt/conda/bin/python3.11",
        "5800-5900 r--p 00000000 fe:00 132 /data/shard-000.bin",
    ])
    assert mapped_files(text) == ["/data/shard-000.bin"]
