"""Training-side timing: record aggregation and the writer's failure path (pure, no torch)."""

from __future__ import annotations

import os
import stat
from array import array
from pathlib import Path

import pytest

from iolens.rundir import records
from iolens.rundir.timing import TimingReader, TrainingAggregator, distribution
from iolens.training._hooks import TimingWriter

MS = 1_000_000


def recs(*triples: tuple[int, int, int]) -> array[int]:
    return array("q", [v for t in triples for v in t])


def test_distribution_nearest_rank() -> None:
    d = distribution([i * MS for i in range(1, 101)])
    assert d == {"count": 100, "sum_s": 5.05, "max_s": 0.1, "p50_s": 0.05, "p95_s": 0.095}
    assert distribution([])["count"] == 0


def test_wait_and_step_per_loader_and_epoch() -> None:
    agg = TrainingAggregator()
    tag = 1 << records.TAG_SHIFT
    agg.feed(42, recs(
        (records.EPOCH | tag, 0, 2),
        (records.WORKER | tag, 1001, 0),
        (records.BATCH | tag, 0, 30 * MS),  # first batch: 30 ms wait, step from epoch start
        (records.BATCH | tag, 40 * MS, 50 * MS),  # 10 ms compute, then 10 ms wait
        (records.BATCH | (2 << records.TAG_SHIFT), 51 * MS, 52 * MS),  # another loader
    ))
    out = agg.take()
    assert out["batches"] == 3 and out["epochs_started"] == 1
    assert out["data_wait"]["sum_s"] == 0.041
    assert out["step"]["sum_s"] == 0.051  # 30 + 20, and 1 ms for the other loader's first
    assert out["data_wait_share"] == 0.041 / 0.051
    assert out["epoch_start_wait"]["max_s"] == 0.03
    assert agg.worker_pids == {1001: 0}
    assert agg.take()["batches"] == 0  # a new interval starts empty


def test_step_marks_without_a_dataloader() -> None:
    agg = TrainingAggregator()
    agg.feed(7, recs((records.STEP, 0, 0), (records.STEP, 5 * MS, 0), (records.STEP, 15 * MS, 0)))
    out = agg.take()
    assert out["step"]["count"] == 2 and out["step_source"] == "marks"
    assert out["data_wait_share"] is None


def test_reader_skips_a_torn_record_until_it_is_whole(tmp_path: Path) -> None:
    data = recs((records.BATCH, 0, MS), (records.BATCH, 2 * MS, 3 * MS)).tobytes()
    path = tmp_path / "12.bin"
    path.write_bytes(data[:30])  # one record and a piece of the next
    agg = TrainingAggregator()
    reader = TimingReader(str(tmp_path))
    assert reader.poll(agg) == 1
    path.write_bytes(data)
    assert reader.poll(agg) == 1
    assert agg.take()["batches"] == 2


def test_records_written_as_their_process_ends_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that writes its last batch and ends while the reader polls its file: the
    reader asks whether it lives before it reads, so the batch is read, and only the poll
    after that finds the file done (asked after the read, the file was closed unread)."""
    from iolens.rundir import timing

    path = tmp_path / "4242.bin"
    path.write_bytes(b"")
    last = recs((records.FETCH, MS, MS), (records.COUNT, 16, 16)).tobytes()

    def ends_now(pid: int) -> bool:  # the worker's last write, then its exit
        if not path.read_bytes():
            path.write_bytes(last)
        return False

    monkeypatch.setattr(timing, "pid_alive", ends_now)
    agg = TrainingAggregator()
    reader = TimingReader(str(tmp_path))
    assert reader.poll(agg) == 2
    assert agg.take()["pipeline"]["samples"] == 16
    assert reader.poll(agg) == 0 and str(path) in reader._done


def test_writer_failure_is_recorded_not_raised(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("")
    w = TimingWriter(str(tmp_path / "blocker" / "timing"))
    w.buf.extend((records.BATCH, 0, 1))
    w.flush()
    assert w.error is not None and "cannot write timing records" in w.error
    assert w.dropped == 1 and len(w.buf) == 0
    w.close()


def test_writer_refuses_a_spare_folder_it_does_not_own(tmp_path: Path) -> None:
    """A spare folder planted by another user (or a link in its place) takes no record."""
    if os.geteuid() != 0:
        pytest.skip("needs root to plant a folder owned by another user")
    blocker = tmp_path / "blocker"
    blocker.write_text("")  # the run directory cannot be made: the writer moves at once
    for planted in ("folder", "link"):
        spare = tmp_path / f"spare-{planted}"
        if planted == "folder":
            spare.mkdir(mode=0o777)
            os.chown(spare, 65534, 65534)
        else:
            (tmp_path / "elsewhere").mkdir(exist_ok=True)
            spare.symlink_to(tmp_path / "elsewhere")
        w = TimingWriter(str(blocker / "timing"), spare=str(spare))
        w.buf.extend((records.BATCH, 0, 1))
        w.flush()
        assert w.moved is not None and w.error is not None, planted
        assert ("another user" if planted == "folder" else "symbolic link") in w.error
        assert w.dropped == 1 and not list(spare.iterdir())
        w.close()


def test_writer_moves_to_the_spare_folder_and_the_reader_follows(tmp_path: Path) -> None:
    timing, spare = tmp_path / "run" / "timing", tmp_path / "spare"
    w = TimingWriter(str(timing), spare=str(spare))
    w.buf.extend((records.BATCH, 0, 1 * MS))
    w.flush()
    assert w.moved is None and w.written == 1
    # The run directory stops taking writes: the next flush goes to the spare folder.
    (timing / f"{w.pid}.bin").chmod(0o444)
    os.close(w._fd)  # type: ignore[arg-type]
    w._fd = os.open(timing / f"{w.pid}.bin", os.O_RDONLY)
    w.buf.extend((records.BATCH, 2 * MS, 3 * MS))
    w.flush()
    assert w.error is None and w.moved is not None and w.moved.startswith("cannot write")
    assert w.written == 2 and w.dropped == 0
    assert (spare / f"{w.pid}.bin").stat().st_size == records.RECORD_BYTES
    assert stat.S_IMODE(spare.stat().st_mode) == 0o700  # made only now, and private
    agg = TrainingAggregator()
    assert TimingReader(str(timing), spare=str(spare)).poll(agg) == 2
    assert TimingReader(str(timing)).poll(TrainingAggregator()) == 1
    w.close()


def test_an_instrumented_plain_iterable_is_marked() -> None:
    agg = TrainingAggregator()
    tag = 1 << records.TAG_SHIFT
    agg.feed(7, recs((records.EPOCH | tag, 0, 0), (records.ITERABLE | tag, 1, 0),
                     (records.BATCH | tag, 0, MS)))
    out = agg.take()
    assert out["iterable_loader"] is True and out["batches"] == 1
    assert "iterable_loader" not in agg.take()


def test_the_writer_never_writes_through_a_descriptor_the_job_replaced(tmp_path: Path) -> None:
    """A worker that closes its descriptors or puts another file under the timing file's
    number: the next flush opens the timing file anew and leaves the other file alone."""
    w = TimingWriter(str(tmp_path / "timing"))
    w.buf.extend((records.STEP, 1, 0))
    w.flush()
    fd = w._fd
    assert fd is not None
    victim = tmp_path / "victim.bin"
    vfd = os.open(victim, os.O_RDWR | os.O_CREAT)
    os.dup2(vfd, fd)  # the job's file now sits under the writer's number
    w.buf.extend((records.STEP, 2, 0))
    w.flush()
    assert victim.read_bytes() == b""  # not written through
    assert (tmp_path / "timing" / f"{os.getpid()}.bin").stat().st_size == 2 * 24
    w.close()
    assert os.fstat(fd).st_ino == os.fstat(vfd).st_ino  # the job's file, not closed by us
    os.close(fd)
    os.close(vfd)


def test_the_folders_noted_are_the_jobs_data() -> None:
    from iolens.training._hooks import _data_folder, _folder

    assert (_folder("/data/a.jpg"), _folder("/x"), _folder("x.bin")) == ("/data", "/", ".")
    ignore = ("/runs/r/timing",)
    assert _data_folder("/data/train", ignore) == "/data/train"
    assert _data_folder("/dev/shm/cache", ignore) == "/dev/shm/cache"  # RAM, a dataset's place
    for kernel in ("/proc/self", "/sys/block", "/dev", "/dev/pts", "/proc"):
        assert _data_folder(kernel, ignore) is None
    assert _data_folder("/runs/r/timing", ignore) is None
    assert _data_folder(".", ()) == os.getcwd()


def test_a_new_loader_never_takes_the_tag_of_one_alive() -> None:
    """A loader's tag is the smallest no living loader holds: one made anew after another
    is gone takes that one's, never that of a loader still in use (the count of living
    loaders gave a new training loader the validation loader's tag)."""
    from iolens.training import _hooks

    class Loader:
        pass

    saved = dict(_hooks._loader_tags)
    _hooks._loader_tags.clear()
    try:
        train, val = Loader(), Loader()
        assert (_hooks._tag_for(train), _hooks._tag_for(val)) == (1, 2)
        del train
        again = Loader()
        assert _hooks._tag_for(again) == 1 and _hooks._tag_for(val) == 2
        assert _hooks._tag_for(Loader()) == 3  # (a temporary: gone at once)
        assert _hooks._tag_for(Loader()) == 3
    finally:
        _hooks._loader_tags.clear()
        _hooks._loader_tags.update(saved)
