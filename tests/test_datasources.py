"""Seeing the dataset however it is read (unit tests; the lab cases are in
tests/test_lab_datalibs.py): the loader's settings, a batch the dataset made itself, the
counter bytes per sample rest on, storage roles, a network store in the verdict, and a
helper's reads that are the job's, never a neighbour's."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis import rules
from iolens.analysis.pipeline import pipeline
from iolens.analysis.verdict import diagnose, net_scaling
from iolens.recorder.network import NetWatch, url_parts
from iolens.recorder.storage import StorageWatch
from iolens.rundir.timing import TimingReader, TrainingAggregator
from iolens.training import _hooks
from tests.test_verdict import dev, rec

torch = pytest.importorskip("torch")


# -- the training side -------------------------------------------------------------------


def test_a_batch_the_dataset_made_counts_its_samples() -> None:
    imgs, labels = torch.zeros(16, 3, 8, 8), torch.arange(16)
    assert _hooks.items_in((imgs, labels)) == 16  # WebDataset's .batched(16)
    assert _hooks.items_in([imgs, list(range(16))]) == 16
    assert _hooks.items_in({"x": imgs, "y": labels}) == 16
    # single samples: an image and an int, two images, a 0-d label, mismatched lengths
    assert _hooks.items_in((torch.zeros(3, 8, 8), 1)) == 1
    assert _hooks.items_in((torch.zeros(3, 8, 8), torch.zeros(3, 8, 8))) == 1
    assert _hooks.items_in((torch.zeros(3, 8), torch.tensor(2))) == 1
    assert _hooks.items_in((imgs, torch.arange(8))) == 1
    assert _hooks.items_in(torch.zeros(16, 4)) == 1 and _hooks.items_in("text") == 1


def test_loader_settings_are_what_the_loader_has() -> None:
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    ds = TensorDataset(torch.zeros(8, 2))
    s = _hooks.loader_settings(DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor=3,
                                          persistent_workers=True, pin_memory=False))
    assert s["num_workers"] == 2 and s["prefetch_factor"] == 3 and s["batch_size"] == 4
    assert s["persistent_workers"] is True and s["pin_memory"] is False
    assert s["dataset"] == "torch.utils.data.dataset.TensorDataset"
    assert s["sampler"] == "torch.utils.data.sampler.SequentialSampler"
    assert s["iterable"] is False and s["start_method"] in ("fork", "spawn", "forkserver")

    class Stream(IterableDataset[int]):
        def __iter__(self) -> Iterator[int]:
            return iter(range(3))

    s = _hooks.loader_settings(DataLoader(Stream(), batch_size=None))
    assert s["iterable"] is True and s["num_workers"] == 0 and "batch_size" not in s
    assert "start_method" not in s  # (no workers: none asked, none fixed)


def test_the_recorder_reads_loader_settings_and_urls(tmp_path: Path) -> None:
    (tmp_path / "loader-7-1.json").write_text(json.dumps(
        {"pid": 7, "tag": 1, "num_workers": 2, "nested": {"no": 1}}))
    (tmp_path / "loader-7-2.json").write_text("{torn")
    (tmp_path / "7.bin").write_bytes(b"")
    (tmp_path / "7.paths").write_text('["/data/train", 10]\n["http://127.0.0.1:9/a.tar", 1]\n'
                                      '["ftp:/no", 1]\n')
    reader = TimingReader(str(tmp_path))
    reader.poll(TrainingAggregator())
    assert list(reader.loaders.values()) == [{"pid": 7, "tag": 1, "num_workers": 2}]
    assert reader.paths == [(7, "/data/train", 10)]
    assert reader.urls == ["http://127.0.0.1:9/a.tar"]
    # the first batch's types come after the settings were read: they are read too
    (tmp_path / "loader-7-1.json").write_text(json.dumps(
        {"pid": 7, "tag": 1, "num_workers": 2, "batch_types": "list"}))
    reader.poll(TrainingAggregator())
    assert reader.loaders["loader-7-1.json"]["batch_types"] == "list"


# -- bytes per sample ----------------------------------------------------------------------


def _piped(worker_rchar: float, worker_read: float, rx: float = 0.0) -> list[dict[str, Any]]:
    out = []
    for i in range(4):
        r = rec(i, worker_rchar=worker_rchar, job_read=worker_read)
        r["train"]["pipeline"] = {"batches": 10, "samples": 100, "fetch_s": 1.0,
                                  "fetch_cpu_s": 0.1, "collate_s": 0.01, "idle_s": 0.0,
                                  "files": 0, "processes": 2}
        if rx:
            r["storage"] = {"127.0.0.1:80": {"connections": 2, "rx_bytes_s": rx}}
        out.append(r)
    return out


DISK = {"mount": "/data", "kind": "block", "role": "dataset"}


@pytest.mark.parametrize(("rchar", "read", "rx", "store", "source", "per"), [
    (6.4e6, 0.0, 0.0, DISK, "rchar", 64000),  # files read with read()
    (0.0, 6.4e6, 0.0, {**DISK, "mapped": True}, "mapped", 64000),  # LMDB: a map's faults
    (1.0e3, 6.4e6, 0.0, DISK, "read_bytes", 64000),  # read in C, readahead
    (1.0e3, 0.0, 6.4e6, {"kind": "network"}, "socket", 64000),  # HTTP read with recv()
    (0.0, 0.0, 0.0, {**DISK, "mapped": True}, "mapped", 0),  # a map in the page cache
    # no dataset on a disk: what the fetch made a device read is its own code paged in
    (1.0e3, 6.4e6, 0.0, None, "rchar", 10),
])
def test_bytes_per_sample_rest_on_the_counter_that_saw_them(
        rchar: float, read: float, rx: float, store: dict[str, Any] | None, source: str,
        per: int) -> None:
    p = pipeline(_piped(rchar, read, rx), {"storage": [store] if store else []})
    assert p is not None and p.bytes_source == source
    assert p.bytes_per_sample == pytest.approx(per)
    assert p.to_dict()["bytes_source"] == source


# -- storage -------------------------------------------------------------------------------


def test_a_folder_the_job_writes_and_reads_is_a_cache(tmp_path: Path) -> None:
    src, cache = tmp_path / "remote", Path("/dev/shm") / f"iolens-test-{os.getpid()}"
    src.mkdir()
    cache.mkdir()
    try:
        w = StorageWatch()
        w.add_all([(1, str(src), 10), (1, str(cache), 10)])
        assert [s["role"] for s in w.meta()] == ["dataset", "dataset"]
        w.note_written(str(cache))
        roles = {s["mount"]: s["role"] for s in w.meta()}
        assert roles == {"/dev/shm": "cache", w.meta()[0]["mount"]: "source"}
        assert w.meta()[0]["role"] == "source"  # where the copies come from, first
    finally:
        cache.rmdir()


def test_urls_name_peers() -> None:
    assert url_parts("http://127.0.0.1:8000/shard-000001.tar") == ("http", "127.0.0.1", 8000)
    assert url_parts("https://bucket.example/x") == ("https", "bucket.example", 443)
    assert url_parts("s3://bucket/key") == ("s3", "bucket", 443)
    assert url_parts("file:///data") is None and url_parts("http://[::1]:x/") is None


@pytest.fixture
def server() -> Iterator[tuple[int, threading.Event]]:
    """A local TCP server that sends 4 MiB to each client, then holds the connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(b"x" * (4 << 20))
                done.wait(10)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield srv.getsockname()[1], done
    finally:
        done.set()
        srv.close()


@pytest.fixture
def client(server: tuple[int, threading.Event]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child that reads 4 MiB from the server as curl would, with a URL on its command
    line, and holds the connection."""
    port, _ = server
    url = f"http://127.0.0.1:{port}/shard-000000.tar"
    code = ("import socket, sys, time; s = socket.create_connection(('127.0.0.1', "
            f"{port})); n = 0\nwhile n < 4 << 20: n += len(s.recv(1 << 16))\n"
            "print('got', flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().startswith("got")
        yield child, url
    finally:
        child.kill()
        child.wait()


def test_a_peer_is_named_by_the_url_its_client_was_given(
        client: tuple[subprocess.Popen[str], str]) -> None:
    child, url = client
    port = url_parts(url)[2]  # type: ignore[index]
    watch = NetWatch()
    (peer,) = watch.scan([child.pid])
    assert peer.name == f"http://127.0.0.1:{port}" and peer.url == url
    assert peer.server_pid == os.getpid()  # the server is on this machine: this process
    fig = watch.sample(1.0)[peer.key]
    assert fig["connections"] == 1 and fig["new_connections_s"] == 1.0
    assert fig["rx_bytes_s"] >= 4 << 20  # what recv() read: never in rchar
    assert watch.scan([child.pid]) == []  # known now: counted from the last look
    assert watch.sample(1.0)[peer.key]["rx_bytes_s"] == 0.0
    d = watch.meta()[0]
    assert d["kind"] == "network" and d["peer"] == f"127.0.0.1:{port}"
    assert d["page_cache_visible"] is False and d["server_pid"] == os.getpid()


def test_a_url_seen_after_the_first_connection_names_the_peer(
        client: tuple[subprocess.Popen[str], str]) -> None:
    child, url = client
    port = url_parts(url)[2]  # type: ignore[index]
    watch = NetWatch()
    watch._cmdlines[child.pid] = []  # (as a Python client: no URL on its command line)
    (peer,) = watch.scan([child.pid])
    assert peer.name == f"tcp://127.0.0.1:{port}"
    watch.note_url(f"http://localhost:{port}/data/0001.tar")
    assert peer.name == f"http://localhost:{port}" and peer.key == f"127.0.0.1:{port}"


# -- the verdict on a network store ------------------------------------------------------


def _network_run(*, conns: list[int], rx: list[float], server_disk: bool,
                 workers: int = 3) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    out = []
    for i, (c, b) in enumerate(zip(conns, rx, strict=True)):
        devices = {"vda": dev()}
        fig: dict[str, Any] = {"connections": c, "new_connections_s": 1.0, "rx_bytes_s": b}
        if server_disk:
            devices["loop0"] = dev(util=97, r_s=16, rkb=8192, r_await=400, aqu=6)
            fig["server_read_bytes_s"] = 8 << 20
        r = rec(i, wait=0.09, step=0.1, devices=devices, workers=workers, worker_cpu=3.0,
                worker_rchar=b, idle=90.0)
        # (3 workers, 0.3 s a batch: the 10 batches a second measured)
        r["train"]["pipeline"] = {"batches": 10, "samples": 160, "fetch_s": 3.0,
                                  "fetch_cpu_s": 0.1, "collate_s": 0.01, "idle_s": 0.1,
                                  "files": 0, "processes": workers}
        r["storage"] = {"127.0.0.1:8000": fig}
        out.append(r)
    store: dict[str, Any] = {"mount": "http://127.0.0.1:8000", "fstype": "http", "device": None,
             "kind": "network", "disks": [], "peer": "127.0.0.1:8000", "opens": 20,
             "page_cache_visible": False, "role": "dataset"}
    if server_disk:
        store.update(server_pid=4242, server="python")
    return out, {"cpus": 8, "storage": [store]}


def test_a_store_whose_disk_is_saturated_gets_no_more_workers() -> None:
    records, meta = _network_run(conns=[3] * 30, rx=[8e6] * 30, server_disk=True)
    v = diagnose(records, meta)
    assert v.cls == "storage-bound" and v.devices == ["loop0"]
    assert "over the network from http://127.0.0.1:8000" in v.evidence[0]
    assert "served by python (pid 4242)" in v.evidence[0]
    assert not any((r.change or {}).get("num_workers") and r.prediction is not None
                   and r.prediction.gain >= rules.MIN_GAIN for r in v.recommendations)
    dont = next(r for r in v.recommendations if r.action.startswith("do not add"))
    assert "loop0 is saturated" in dont.action
    assert v.recommendations[0].change == {"storage": "ram"}
    # its reads are the job's, seen one step away: no neighbour
    assert all(f.cls != "noisy-neighbor" for f in v.findings)
    assert all(f.cls != "warm-cache" for f in v.findings)  # bytes over a socket: no cache claim


def test_a_store_that_gives_no_more_to_more_connections_caps_its_throughput() -> None:
    conns = [1, 2, 3] * 10
    records, meta = _network_run(conns=conns, rx=[8e6] * 30, server_disk=False)
    v = diagnose(records, meta)
    assert v.cls == "storage-bound"
    assert any("caps the throughput" in e for e in v.evidence), v.evidence
    assert any(r.action.startswith("do not add DataLoader workers") for r in v.recommendations)


def test_a_store_that_answers_slowly_gets_more_requests_in_flight() -> None:
    conns = [1, 2, 3] * 10
    records, meta = _network_run(conns=conns, rx=[c * 2.5e6 for c in conns],
                                 server_disk=False)
    v = diagnose(records, meta)
    assert any("answers slowly" in e for e in v.evidence), v.evidence
    more = next(r for r in v.recommendations if (r.change or {}).get("num_workers"))
    assert more.action.startswith("raise num_workers") and more.prediction is not None


@pytest.mark.parametrize(("conns", "rx", "says"), [
    ([1, 2] * 5, [4e6, 4.2e6] * 5, "capped"),
    ([1, 2] * 5, [4e6, 7.6e6] * 5, "latency"),
    ([1, 2] * 5, [4e6, 5.6e6] * 5, None),  # in between: not told
    ([2] * 10, [4e6] * 10, None),  # one level of connections: not told
    ([1, 3, 3, 3, 0, 0], [4e6, 4e6, 4e6, 4e6, 0, 0], None),  # a level seen once
])
def test_net_scaling(conns: list[int], rx: list[float], says: str | None) -> None:
    assert net_scaling(zip(map(float, conns), rx, strict=True)) == says


def test_advice_asks_for_no_setting_the_loader_has() -> None:
    records = [rec(i, wait=0.05, step=0.1, epoch_start=3.0 if i % 10 == 0 else None)
               for i in range(30)]
    for r in records:
        r["train"]["data_wait"]["p95_s"] = 0.2  # bursts
    asked = diagnose(records, {"cpus": 8})
    texts = [r.action for r in asked.recommendations] + [
        r.action for f in asked.findings for r in f.recommendations]
    assert any("persistent_workers=True" in t for t in texts), texts
    loaders = [{"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4}]
    v = diagnose(records, {"cpus": 8, "loaders": loaders})
    texts = [r.action for r in v.recommendations] + [
        r.action for f in v.findings for r in f.recommendations]
    assert not any("persistent_workers=True" in t for t in texts), texts
    assert any("from 4 to 8" in t for t in texts), texts


def test_an_epoch_start_that_waits_for_a_cache_copy_says_so() -> None:
    records = [rec(i, wait=0.01, epoch_start=2.0 if i == 0 else None, worker_rchar=8e6)
               for i in range(30)]
    for r in records:
        r["job"]["roles"]["worker"]["wchar_s"] = 4e6
    plain = diagnose(records, {"cpus": 8})
    assert not [f for f in plain.findings if f.cls == "epoch-start-stall"]  # one start: none
    storage = [{"mount": "/mnt/remote", "kind": "block", "role": "source"},
               {"mount": "/dev/shm", "kind": "tmpfs", "role": "cache"}]
    (f,) = [f for f in diagnose(records, {"cpus": 8, "storage": storage}).findings
            if f.cls == "epoch-start-stall"]
    assert "the job copies the data into a cache on /dev/shm from /mnt/remote: 114 MB" in (
        f.evidence[1]), f.evidence
    assert f.recommendations[0].action.startswith("fill the cache before training")


def test_a_batch_names_the_types_it_holds() -> None:
    import numpy as np

    assert _hooks.leaf_types((torch.zeros(2), torch.zeros(2))) == {"torch.Tensor"}
    assert _hooks.leaf_types({"x": np.zeros(2), "names": ["a", "b"]}) == {
        "numpy.ndarray", "list"}
    assert _hooks.leaf_types([torch.zeros(1), [torch.zeros(1)], {"k": 3}]) == {
        "torch.Tensor", "builtins.int"}
    # how many tensors: each is a shared-memory handle of its own on its way to the loop
    assert _hooks.batch_shape((torch.zeros(2), torch.zeros(2))) == (2, 2, 16)
    fields = {f"f{k}": torch.zeros(3) for k in range(16)}
    assert _hooks.batch_shape({**fields, "names": ["ab"], "ids": [torch.zeros(1)]}) == (
        18, 17, 16 * 12 + 2 + 4)
    assert _hooks.batch_shape([np.zeros(2), 3]) == (2, 0, 16)
    assert _hooks.batch_shape([b"x" * 8] * 4) == (1, 0, 32)  # (a list of bytes: pickled whole)
    # default_collate keeps a batch's bytes as a tuple of them
    assert _hooks.leaf_types([(b"x" * 8,) * 4, torch.zeros(4)]) == {"tuple", "torch.Tensor"}
    assert _hooks.batch_shape([(b"x" * 8,) * 4, torch.zeros(4)]) == (2, 1, 32 + 16)
    # a tensor's subclass (torchvision's tv_tensors, a Parameter) moves as a tensor does
    image = torch.zeros(4).as_subclass(type("Image", (torch.Tensor,), {}))
    assert _hooks.leaf_types((image, torch.nn.Parameter(torch.zeros(2)))) == {"torch.Tensor"}
    assert _hooks.batch_shape({"image": image, "label": torch.zeros(1)}) == (2, 2, 20)


def test_a_batch_of_samples_kept_apart_is_told_from_one_collated() -> None:
    """NOTE [samples kept apart]: a batch that is its batch_size samples, alike in their
    leaves' shapes and types, counts the fields the default collate_fn would stack."""
    import numpy as np

    fields = _hooks.stackable_fields
    assert fields([np.zeros(4)] * 8, 8) == 1
    assert fields([(np.zeros(4), 3)] * 8, 8) == 2  # (an array and a label)
    assert fields(tuple({"x": np.zeros((2, 2)), "w": 0.5} for _ in range(4)), 4) == 2
    assert fields([torch.zeros(3)] * 2, 2) == 1
    # not samples kept apart, or not alike: no count
    assert fields([np.zeros(4)] * 8, 4) is None  # (not batch_size of them)
    assert fields([np.zeros(4)] * 7 + [np.zeros(5)], 8) is None  # (shapes differ)
    assert fields([np.zeros(4)] * 7 + [np.zeros(4, dtype=np.uint8)], 8) is None
    assert fields([b"x" * 8] * 4, 4) is None  # (bytes: the default collate keeps them)
    assert fields([(np.zeros(4), "a.jpg")] * 4, 4) is None
    assert fields([{"x": np.zeros(2)}, {"y": np.zeros(2)}], 2) is None  # (other keys)
    assert fields(np.zeros((8, 4)), 8) is None  # (collated already)
    assert fields([np.zeros(2)] * 2, None) is None and fields([np.zeros(2)], 1) is None
    assert fields([[np.zeros(1)] * 600] * 2, 2) is None  # (past the leaves counted)
