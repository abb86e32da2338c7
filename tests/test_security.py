"""Security: who can reach the metrics, shells, run-directory files, escaping, privileges.

Each test's docstring says what it checks (collected into RELIABILITY.md).
"""

from __future__ import annotations

import ast
import html
import ipaddress
import json
import os
import re
import select
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis.verdict import PRIMARY_CLASSES
from iolens.rundir import RunDir, default_run_dir
from iolens.sinks.base import SinkError
from iolens.sinks.csvfile import CsvSink
from tests.conftest import need

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src" / "iolens"
ESC = "\x1b"


def iolens(*args: str, cwd: Path, umask: int = -1, timeout: float = 180,
           prefix: list[str] | None = None, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-m", "iolens", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          umask=umask, env=env)


# -- 1. the exporter listens on loopback unless told otherwise ----------------------------


def listening(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses (IPv4 and IPv6) process ``pid`` listens on, from /proc/net/tcp*."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", link)
        if m:
            inodes.add(m.group(1))
    out = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            next(fh)
            for line in fh:
                f = line.split()
                if f[3] != "0A" or f[9] not in inodes:  # 0A: TCP_LISTEN
                    continue
                addr_hex, port_hex = f[1].split(":")
                raw = bytes.fromhex(addr_hex)
                # each 32-bit word is in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                out.append((str(ipaddress.ip_address(raw)), int(port_hex, 16)))
    return out


def read_until(proc: subprocess.Popen[str], pattern: str, timeout: float = 60) -> str:
    """stderr of ``proc`` up to the first line matching ``pattern``."""
    assert proc.stderr is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen += line
            if re.search(pattern, line):
                return seen
    raise AssertionError(f"no line matching {pattern!r} in:\n{seen}")


@pytest.fixture
def exporter_proc() -> Iterator[Any]:
    """Starts `iolens exporter` with the given arguments; stops each at the end."""
    pytest.importorskip("prometheus_client")
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-m", "iolens", "exporter", "--interval", "0.5",
                              *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.terminate()
        p.communicate(timeout=30)


def test_exporter_listens_on_loopback_by_default_and_says_so(
        exporter_proc: Any, record_property: Any) -> None:
    """Exporter with no host given listens on 127.0.0.1 only and its start line says so.

    Exporter started with no host (a bare port): its listening socket in /proc/net/tcp
    is 127.0.0.1 only, and the start line names that address and how to listen elsewhere."""
    from iolens.cli.exporter import build_parser

    assert build_parser().parse_args([]).listen.startswith("127.0.0.1:")
    proc = exporter_proc("--listen", "0")
    text = read_until(proc, r"serving")
    m = re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics, on loopback only", text)
    assert m is not None, text
    assert "--listen 0.0.0.0:" in text and "every interface" in text
    port = int(m.group(1))
    addrs = listening(proc.pid)
    record_property("measured", f"exporter sockets in LISTEN: {addrs}")
    assert addrs == [("127.0.0.1", port)]


def test_exporter_on_every_interface_is_honoured_with_a_warning(
        exporter_proc: Any, record_property: Any) -> None:
    """Exporter with --listen 0.0.0.0 listens there and warns the metrics are open to the network.

    Exporter told --listen 0.0.0.0:0: it listens on 0.0.0.0 and its start line warns
    that the metrics are open to the network and how to keep them on this machine."""
    proc = exporter_proc("--listen", "0.0.0.0:0")
    text = read_until(proc, r"serving")
    m = re.search(r"serving http://0\.0\.0\.0:(\d+)/metrics", text)
    assert m is not None, text
    assert "warning" in text and "open to the network" in text
    assert f"--listen 127.0.0.1:{m.group(1)}" in text
    addrs = listening(proc.pid)
    record_property("measured", f"exporter sockets in LISTEN: {addrs}")
    assert addrs == [("0.0.0.0", int(m.group(1)))]


def test_run_prometheus_listens_on_loopback_and_says_so(tmp_path: Path,
                                                        record_property: Any) -> None:
    """iolens run --prometheus with no host listens on 127.0.0.1 only and says so.

    `iolens run --prometheus 0`: while the job runs the endpoint's socket is 127.0.0.1
    only, and the start line says it is loopback only and how to serve other machines."""
    pytest.importorskip("prometheus_client")
    proc = subprocess.Popen(
        [sys.executable, "-m", "iolens", "run", "--out", "run", "--no-live", "--prometheus", "0",
         "--", sys.executable, "-c", "import time; print('up', flush=True); time.sleep(3)"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text = read_until(proc, r"Prometheus metrics at")
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        addrs = listening(proc.pid)
    finally:
        proc.communicate(timeout=60)
    record_property("measured", f"iolens run sockets in LISTEN: {addrs}")
    m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics, on loopback only", text)
    assert m is not None, text
    assert "--prometheus 0.0.0.0:" in text
    assert addrs == [("127.0.0.1", int(m.group(1)))]
    assert proc.returncode == 0


# -- 2. no shell ever sees user text ------------------------------------------------------

_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "/bin/sh", "/bin/bash", "/usr/bin/env"}


def shell_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that could hand text to a shell: shell=True, os.system/popen, a subprocess call
    with a string command, an exec/spawn of a shell, a ["sh", "-c", ...] argument list."""
    found: list[tuple[int, str]] = []
    aliases: dict[str, str] = {}  # local name -> module.attr
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "subprocess", "pty",
                                                                 "asyncio", "commands"):
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def name(func: ast.expr) -> str:
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            return f"{func.value.id}.{func.attr}"
        if isinstance(func, ast.Name):
            return aliases.get(func.id, func.id)
        return ""

    def is_text(arg: ast.expr) -> bool:
        return (isinstance(arg, ast.JoinedStr)
                or (isinstance(arg, ast.Constant) and isinstance(arg.value, str))
                or (isinstance(arg, ast.BinOp) and (is_text(arg.left) or is_text(arg.right)))
                or (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute)
                    and arg.func.attr in ("format", "join")
                    and isinstance(arg.func.value, ast.Constant)))

    def shell_list(arg: ast.expr) -> bool:
        if not isinstance(arg, (ast.List, ast.Tuple)) or len(arg.elts) < 2:
            return False
        words = [e.value for e in arg.elts[:3] if isinstance(e, ast.Constant)]
        return bool(words) and str(words[0]) in _SHELLS and "-c" in words

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        n = name(node.func)
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant)
                                          and kw.value.value is False):
                found.append((node.lineno, f"{n}(shell=...)"))
        if n in ("os.system", "os.popen", "commands.getoutput", "commands.getstatusoutput",
                 "subprocess.getoutput", "subprocess.getstatusoutput",
                 "asyncio.create_subprocess_shell", "pty.spawn"):
            found.append((node.lineno, n))
        elif n.startswith("subprocess.") and node.args and (is_text(node.args[0])
                                                            or shell_list(node.args[0])):
            found.append((node.lineno, f"{n} with a shell command"))
        elif re.fullmatch(r"os\.(exec|spawn|posix_spawn)\w*", n):
            consts = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if any(str(c) in _SHELLS or c == "-c" for c in consts) or any(
                    shell_list(a) for a in node.args):
                found.append((node.lineno, f"{n} of a shell"))
    return found


def test_the_shell_check_catches_each_form() -> None:
    """The no-shell AST check flags each shell form it claims to (it can fail)."""
    bad = textwrap.dedent("""
        import os, subprocess
        from subprocess import run as r
        subprocess.run("ls " + x)
        subprocess.Popen(f"ls {x}")
        subprocess.call(x, shell=True)
        r(["sh", "-c", x])
        os.system(x)
        os.popen(x)
        os.execv("/bin/sh", ["sh", "-c", x])
        os.spawnlp(os.P_WAIT, "bash", "bash", "-c", x)
    """)
    assert [line for line, _ in shell_uses(ast.parse(bad))] == [4, 5, 6, 7, 8, 9, 10, 11]
    good = "import subprocess\nsubprocess.run(['ls', x], shell=False)\nsubprocess.Popen(cmd)\n"
    assert shell_uses(ast.parse(good)) == []


def test_no_module_runs_a_shell(record_property: Any) -> None:
    """No module under src/iolens runs a shell or passes a string command.

    Every module under src/iolens, parsed: no shell=True, os.system, os.popen, no
    subprocess call with a string command, no exec or spawn of a shell."""
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 30
    found = [f"{p.relative_to(REPO)}:{line}: {what}" for p in files
             for line, what in shell_uses(ast.parse(p.read_text(), str(p)))]
    record_property("measured", f"{len(files)} modules parsed, {len(found)} shell uses")
    assert found == []


ARGV_JOB = "import json, sys; json.dump(sys.argv[1:], open('argv.json', 'w'))\n"
HOSTILE_ARGS = ["; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "| touch PWNED",
                "&& touch PWNED", "a'b\"c", "*", "~", "$HOME", "\ntouch PWNED"]


def test_run_passes_shell_metacharacters_verbatim(tmp_path: Path) -> None:
    """Shell metacharacters in a job's arguments reach it verbatim and run nothing.

    `iolens run` of a job whose script name and arguments hold ; $() backticks | && and
    a newline: the job's argv is exactly what was given, no PWNED file appears anywhere,
    and the default run directory's name keeps only safe characters."""
    script = tmp_path / "train;touch PWNED$(id).py"
    script.write_text(ARGV_JOB)
    out = iolens("run", "--no-live", "--interval", "0.2", "--", sys.executable, str(script),
                 *HOSTILE_ARGS, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "argv.json").read_text()) == HOSTILE_ARGS
    assert list(tmp_path.rglob("PWNED*")) == []
    [run] = (tmp_path / "iolens-runs").iterdir()
    assert re.fullmatch(r"\d{8}-\d{6}-train_touch_PWNED_id_", run.name), run.name
    meta = json.loads((run / "meta.json").read_text())
    assert meta["command"] == [sys.executable, str(script), *HOSTILE_ARGS]


# -- 3. run directories: the umask, no writes through links, atomic names -------------------

TRAIN = textwrap.dedent("""
    import os, sys, torch
    from torch.utils.data import DataLoader, Dataset

    data = sys.argv[1]
    names = sorted(os.listdir(data))

    class Files(Dataset):
        def __len__(self):
            return len(names)
        def __getitem__(self, i):
            with open(os.path.join(data, names[i]), "rb") as fh:
                return torch.tensor(len(fh.read()), dtype=torch.float32)

    if __name__ == "__main__":
        plant = os.environ.get("PLANT")
        if plant:  # put links where this process's timing files will go
            timing = os.path.join(os.environ["IOLENS_RUN_DIR"], "timing")
            os.makedirs(timing, exist_ok=True)
            pid = os.getpid()
            for name in (f"{pid}.bin", f"{pid}.json", f".{pid}.json.tmp"):
                os.symlink(plant, os.path.join(timing, name))
        for epoch in range(2):
            for x in DataLoader(Files(), batch_size=4, num_workers=int(sys.argv[2])):
                pass
        print("trained", flush=True)
        sys.exit(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
""")


def make_job(folder: Path, files: int = 32) -> tuple[Path, Path]:
    """A training script and a folder of small files for it to read."""
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (data / f"{i:03d}.bin").write_bytes(os.urandom(4096))
    script = folder / "train.py"
    script.write_text(TRAIN)
    return script, data


def modes(run: Path) -> dict[str, int]:
    """Each path under ``run`` (and ``run`` itself as ".") with its permission bits."""
    out = {".": stat.S_IMODE(run.lstat().st_mode)}
    for p in sorted(run.rglob("*")):
        out[str(p.relative_to(run))] = stat.S_IMODE(p.lstat().st_mode)
    return out


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask022", "umask077"])
def test_run_files_get_the_modes_the_umask_implies(tmp_path: Path, umask: int,
                                                   record_property: Any) -> None:
    """Run directory files get exactly the modes the umask implies (022, 077).

    A real training run, its CSV and its default HTML report made under umask 022 and
    077: the run directory and every file in it get 0777/0666 less the umask, no more."""
    pytest.importorskip("torch")
    pytest.importorskip("plotly")
    script, data = make_job(tmp_path)
    out = iolens("run", "--out", "run", "--interval", "0.2", "--no-live", "--csv", "rows.csv",
                 "--", sys.executable, str(script), str(data), "1", cwd=tmp_path, umask=umask)
    assert out.returncode == 0, out.stderr
    rep = iolens("report", "run", "--format", "html", cwd=tmp_path, umask=umask)
    assert rep.returncode == 0, rep.stderr
    found = modes(tmp_path / "run")
    # (the CSV goes where --csv says, opened before the run directory exists)
    found["../rows.csv"] = stat.S_IMODE((tmp_path / "rows.csv").lstat().st_mode)
    record_property("measured", f"umask {umask:03o}: " + ", ".join(
        f"{k} {v:03o}" for k, v in found.items()))
    names = set(found)
    for want in (".", "meta.json", "records.jsonl", "../rows.csv", "report.html", "timing"):
        assert want in names, names
    assert any(re.fullmatch(r"timing/\d+\.bin", n) for n in names), names
    assert any(re.fullmatch(r"timing/\d+\.json", n) for n in names), names
    for name, mode in found.items():
        is_dir = (tmp_path / "run" / name).is_dir()
        assert mode == (0o777 if is_dir else 0o666) & ~umask, (name, oct(mode))


VICTIM_TEXT = "precious: not iolens' to write\n"


@pytest.fixture(params=["victim", "dangling"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """Where planted links point: a victim file outside the run, or nowhere (dangling)."""
    if request.param == "victim":
        victim = tmp_path / "outside" / "victim.txt"
        victim.parent.mkdir()
        victim.write_text(VICTIM_TEXT)
        os.utime(victim, (1_000_000_000, 1_000_000_000))
        yield victim
        assert victim.read_text() == VICTIM_TEXT
        assert victim.stat().st_mtime == 1_000_000_000
        assert not victim.is_symlink()
    else:
        dangling = tmp_path / "outside" / "nothing-here"
        yield dangling
        assert not dangling.exists() and not dangling.parent.exists()


def test_planted_links_in_the_run_directory_are_never_written_through(
        tmp_path: Path, target: Path, record_property: Any) -> None:
    """Symlinks planted in place of run-directory files are never written through.

    Links planted (towards a victim file, or dangling) in place of records.jsonl,
    meta.json, .meta.json.tmp, the job's timing files and report.html of an existing --out:
    the target is never written or truncated, the run records beside them, and the job
    runs and exits with its own code."""
    pytest.importorskip("torch")
    pytest.importorskip("plotly")
    script, data = make_job(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    planted = ["records.jsonl", "meta.json", ".meta.json.tmp", "report.html"]
    for name in planted:
        (run / name).symlink_to(target)
    out = iolens("run", "--out", "run", "--interval", "0.2", "--no-live", "--", sys.executable,
                 str(script), str(data), "0", "3", cwd=tmp_path,
                 env={**os.environ, "PLANT": str(target)})
    assert out.returncode == 3, out.stderr
    assert "trained" in out.stdout
    for name in ("records.jsonl", "meta.json"):
        assert (run / name).is_file() and not (run / name).is_symlink()
    lines = (run / "records.jsonl").read_text().splitlines()
    assert len(lines) >= 2 and all(json.loads(line)["seq"] >= 0 for line in lines)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["exit_code"] == 3
    timing = run / "timing"
    bins = [p for p in timing.iterdir() if p.name.endswith(".bin")]
    assert bins and all(p.is_file() and not p.is_symlink() and p.stat().st_size for p in bins)
    [status] = meta["timing"]
    assert status["installed"] is True and status["records"] > 0 and status["error"] is None
    assert (timing / f"{status['pid']}.json").is_file()
    assert not (timing / f"{status['pid']}.json").is_symlink()
    rep = iolens("report", "run", "--format", "html", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert (run / "report.html").is_file() and not (run / "report.html").is_symlink()
    assert (run / ".meta.json.tmp").is_symlink()  # left alone: never opened
    record_property("measured", f"{target.name}: {len(lines)} records, "
                                f"{status['records']} timing records beside the links")


def test_a_planted_csv_link_is_refused_before_the_job_starts(
        tmp_path: Path, target: Path) -> None:
    """A --csv path that is a symlink is refused with a clear message; its target is untouched.

    --csv naming a link (towards a victim, or dangling): the target is not written, and
    iolens says the CSV is a symbolic link and exits 2 before starting the job, as for any
    output it cannot open (NOTE [outputs fail before the job starts])."""
    (tmp_path / "rows.csv").symlink_to(target)
    marker = tmp_path / "job-ran"
    out = iolens("run", "--out", "run", "--no-live", "--csv", "rows.csv", "--", sys.executable,
                 "-c", f"open({str(marker)!r}, 'w')", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "rows.csv is a symbolic link" in out.stderr and "not started" in out.stderr
    assert not marker.exists()


def test_csv_sink_replaces_a_hard_link_and_refuses_a_fifo_nobody_reads(tmp_path: Path) -> None:
    """CSV sink replaces a hard-linked name and refuses a FIFO nobody reads, without hanging.

    CsvSink on a name hard-linked to a victim file: a new file takes the name and the
    victim keeps its bytes; on a FIFO no process reads: a SinkError at once, no hang."""
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    os.link(victim, tmp_path / "rows.csv")
    sink = CsvSink(str(tmp_path / "rows.csv"), ["sda"])
    sink.close()
    assert victim.read_text() == VICTIM_TEXT
    assert (tmp_path / "rows.csv").read_text().startswith("time,t,")
    os.mkfifo(tmp_path / "fifo.csv")
    with pytest.raises(SinkError, match="a pipe nobody reads"):
        CsvSink(str(tmp_path / "fifo.csv"), [])


def test_csv_to_a_stream_the_user_names(tmp_path: Path) -> None:
    """`--csv /dev/stdout` and a link to a pipe write the stream; no file is replaced.

    A stream named directly or through a link (as /dev/stdout is) is no file whose
    content a planted link could destroy: the rows go to it and the link stays."""
    out = iolens("run", "--out", "run", "--no-live", "--interval", "0.1", "--csv", "/dev/stdout",
                 "--", sys.executable, "-c", "import time; time.sleep(0.5)", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("time,t,elapsed_s,"), out.stdout[:200]
    assert os.path.islink("/dev/stdout")
    r, w = os.pipe()
    try:
        link = tmp_path / "rows.csv"
        link.symlink_to(f"/proc/{os.getpid()}/fd/{w}")
        sink = CsvSink(str(link), ["sda"])
        sink.close()
        assert os.read(r, 1 << 16).startswith(b"time,t,")
        assert link.is_symlink()
    finally:
        os.close(r)
        os.close(w)


def test_run_dir_replaces_a_fifo_or_hard_link_in_place_of_records(tmp_path: Path) -> None:
    """A FIFO or hard link in place of records.jsonl is replaced, never written through.

    RunDir where records.jsonl is a FIFO nobody reads, or a hard link to a victim: no
    hang, the victim keeps its bytes, and the records go to a new regular file."""
    os.mkfifo(tmp_path / "records.jsonl")
    d = RunDir(str(tmp_path))
    assert d.append({"seq": 0}) and d.write_meta({"ok": True})
    d.close()
    assert stat.S_ISREG((tmp_path / "records.jsonl").lstat().st_mode)
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    other = tmp_path / "other"
    other.mkdir()
    os.link(victim, other / "records.jsonl")
    d = RunDir(str(other))
    assert d.append({"seq": 0})
    d.close()
    assert victim.read_text() == VICTIM_TEXT
    assert (other / "records.jsonl").read_text() == '{"seq":0}\n'


def test_timing_directory_link_is_not_followed(tmp_path: Path) -> None:
    """A symlink in place of the timing directory is not followed by the training process.

    A symlink planted in place of <run>/timing (towards another folder): the training
    process writes nothing there and records why in its writer."""
    from iolens.training._hooks import TimingWriter

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "timing").symlink_to(elsewhere)
    w = TimingWriter(str(tmp_path / "timing"))
    w.buf.extend((1, 2, 3))
    w.flush()
    w.status()
    assert list(elsewhere.iterdir()) == []
    assert w.error is not None and "symbolic link" in w.error and w.dropped == 1


def test_default_run_dirs_are_created_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 record_property: Any) -> None:
    """Default run directories are created atomically: 32 racing runs get 32 folders.

    32 threads naming a default run directory in the same second: each gets its own,
    already created (mkdir that fails when taken, then the next suffix), none shared."""
    monkeypatch.setattr("iolens.rundir.time.strftime", lambda fmt: "20260101-000000")
    barrier = threading.Barrier(32)
    got: list[str] = []

    def one() -> None:
        barrier.wait()
        got.append(default_run_dir(str(tmp_path / "runs"), ["python", "train.py"]))

    threads = [threading.Thread(target=one) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    record_property("measured", f"{len(set(got))} distinct directories for 32 racing runs")
    assert len(set(got)) == 32 and all(os.path.isdir(p) for p in got)
    assert sorted(os.listdir(tmp_path / "runs"))[0] == "20260101-000000-train"
    # a name taken by a file or a dangling link is skipped too
    (tmp_path / "runs2").mkdir()
    (tmp_path / "runs2" / "20260101-000000-train").symlink_to(tmp_path / "nowhere")
    path = default_run_dir(str(tmp_path / "runs2"), ["python", "train.py"])
    assert path.endswith("-train-2") and os.path.isdir(path)
    assert not (tmp_path / "nowhere").exists()


def test_report_to_a_stream_link_writes_the_stream_and_keeps_the_link(tmp_path: Path) -> None:
    """`iolens report -o LINK` where LINK leads to a pipe (as /dev/stdout does) writes the pipe.

    Before, the report was renamed over the link: `-o /dev/stdout` as root replaced the
    machine's /dev/stdout with a file and printed nothing. A link to a regular file is
    still replaced, never written through (the planted-link test above)."""
    from tests.test_report import META, write_run
    from tests.test_verdict import SLOW_LOOP, rec

    run = write_run(tmp_path / "run", [rec(i, devices=SLOW_LOOP) for i in range(5)], META)
    (tmp_path / "stdout").symlink_to("/proc/self/fd/1")
    out = iolens("report", str(run), "-o", str(tmp_path / "stdout"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"iolens report {run}")
    assert (tmp_path / "stdout").is_symlink()


# -- 4. recorded strings are text, in the browser and in the terminal ---------------------

MARK = "document.body.dataset.pwned=1"
SCRIPT_PAYLOAD = f"<script>{MARK};document.title='PWNED'</script>"
IMG_PAYLOAD = f"<img src=x onerror=\"{MARK};document.title='PWNED'\">"


def test_hostile_strings_never_run_in_the_html_report(tmp_path: Path,
                                                      record_property: Any) -> None:
    """Script payloads in a command line, a path and a device name never run in the HTML report.

    <script> and <img onerror> payloads in a real run's command line, in the real path
    of the folder the job reads (--path), and in a device name planted in its records:
    in headless Chromium nothing runs (no marker, title unchanged, no console error) and
    each payload shows as text."""
    pytest.importorskip("torch")
    pytest.importorskip("plotly")
    from tests.test_report_html import (
        assert_rendered,
        chromium,
        open_in_chromium,
    )

    chromium()
    # "/" cannot be in a file name: the payload's "</script>" splits it into two folders
    evil_dir = tmp_path / f"<script>{MARK};document.title='PWNED'<" / "script>"
    script, data = make_job(evil_dir, files=16)
    assert SCRIPT_PAYLOAD in str(data)
    out = iolens("run", "--out", "run", "--interval", "0.2", "--no-live", "--path", str(data),
                 "--", sys.executable, str(script), str(data), "0", "0", SCRIPT_PAYLOAD,
                 IMG_PAYLOAD, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    lines = (run / "records.jsonl").read_text().splitlines()
    with open(run / "records.jsonl", "w") as fh:
        for line in lines:
            r = json.loads(line)
            some = next(iter(r["devices"].values()))
            r["devices"][SCRIPT_PAYLOAD] = some
            r["devices"][IMG_PAYLOAD] = some
            fh.write(json.dumps(r) + "\n")
    rep = iolens("report", "run", "--format", "html", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    page = (run / "report.html").read_text(encoding="utf-8")
    assert SCRIPT_PAYLOAD not in page and IMG_PAYLOAD not in page
    # the path reaches the page in the command line (its device is the current directory's)
    command = json.loads((run / "meta.json").read_text())["command"]
    assert str(data) in command and str(data) not in page
    assert html.escape(shlex.join(command)) in page
    dom, console, requests = open_in_chromium(run / "report.html", tmp_path)
    assert_rendered(dom, console, requests, page)
    assert "data-pwned" not in dom and "PWNED" not in re.findall(r"<title>(.*?)</title>",
                                                                  dom)[0]
    text = re.sub(r"<[^>]*>", "", dom.split("<body", 1)[1])  # the text nodes, roughly
    for payload in (SCRIPT_PAYLOAD, IMG_PAYLOAD, shlex.join(command)):
        assert html.escape(payload, quote=False) in text, payload
    legend = re.findall(r'<text class="legendtext"[^>]*>(.*?)</text>', dom)
    assert html.escape(SCRIPT_PAYLOAD, quote=False) in legend
    record_property("measured", f"{len(re.findall('<script', dom))} script elements in the "
                                f"DOM after load; {len(console)} console messages")


def test_the_payloads_would_run_if_not_escaped(tmp_path: Path) -> None:
    """The HTML payloads do run in Chromium when put raw, so the escaping check can fail.

    The payloads above, put raw into a page: Chromium runs them and the check sees the
    marker, so its absence in the report means they did not run."""
    from tests.test_report_html import open_in_chromium

    for i, payload in enumerate((SCRIPT_PAYLOAD, IMG_PAYLOAD)):
        page = tmp_path / f"raw{i}.html"
        page.write_text(f"<!DOCTYPE html><html><head><title>t</title></head><body>{payload}"
                        "</body></html>")
        dom, _, _ = open_in_chromium(page, tmp_path, selftest=False)
        assert 'data-pwned="1"' in dom and "<title>PWNED</title>" in dom


def test_escape_bytes_in_a_command_never_reach_the_terminal_raw(tmp_path: Path) -> None:
    """Terminal escape bytes in recorded strings are neutralised in the text report.

    An ESC (a terminal title and colour sequence) and a bidi override in a recorded
    command line and device name: the text report shows them as \\x1b and \\u202e, with no
    ESC byte in its output."""
    from tests.test_report import META, write_run
    from tests.test_verdict import SLOW_LOOP, rec

    evil = f"{ESC}]0;owned\a{ESC}[2J{ESC}[31mred\u202etxt.exe"
    records = [rec(i, wait=0.09, devices={**SLOW_LOOP, evil: SLOW_LOOP["loop0"]})
               for i in range(10)]
    run = write_run(tmp_path / "run", records, {**META, "command": ["python", evil],
                                                "devices": {evil: f"the job reads /x/{evil}"}})
    for fmt_out in (["-o", str(tmp_path / "report.txt")], []):
        out = iolens("report", str(run), *fmt_out, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        text = (tmp_path / "report.txt").read_text() if fmt_out else out.stdout
        assert ESC not in text and "\a" not in text and "\u202e" not in text
        assert "\\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred\\u202etxt.exe" in text.replace("\n", "")


# -- 5. no root needed ----------------------------------------------------------------------

NOBODY = 65534


def _closed(path: Path) -> list[Path]:
    """Folders on the way to ``path`` that uid 65534 (not their owner, not in their
    group) cannot search."""
    out = []
    for p in [*reversed(path.parents), path]:
        st = p.stat()
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            out.append(p)
    return out


def unprivileged(stage: Path) -> list[str]:
    """A command prefix that runs as uid 65534 with no capabilities.

    The interpreter, the venv and the repository must be reachable on the way.
    Where a folder above them is closed to others (a fresh clone in /root, a
    pyenv Python under /root), the prefix first makes a private mount
    namespace, still as root, in which that folder is a fresh world-searchable
    tmpfs holding bind mounts of just the folders needed (staged under
    ``stage``, a folder of root's, before the tmpfs hides them); then it drops
    to uid 65534. Nothing on disk changes and the job holds no privilege.
    """
    need(os.geteuid() == 0, "needs root to switch to an unprivileged user")
    need(shutil.which("setpriv") is not None, "needs setpriv(1) (util-linux)")
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    wanted = {Path(sys.prefix), Path(sys.base_prefix), REPO,
              Path(os.path.realpath(sys.executable)).parent}
    wanted = {p for p in wanted if not any(q in p.parents for q in wanted)}
    closed = {c for p in wanted for c in _closed(p)}
    tops = sorted(c for c in closed if not any(o in c.parents for o in closed))
    if not tops:
        return drop
    from tests.conftest import can_unshare_mounts

    need(can_unshare_mounts(), f"{[str(t) for t in tops]} are closed to uid {NOBODY}, and "
                               "no private mount namespace can open a view of them "
                               "(needs root and unshare(1))")
    q = shlex.quote
    binds = sorted(p for p in wanted if any(t in p.parents or t == p for t in tops))
    need(not any(p in tops for p in binds), f"{binds} are closed to uid {NOBODY} themselves")
    steps = []
    for i, p in enumerate(binds):
        (stage / f"view{i}").mkdir()
        steps.append(f"mount --bind {q(str(p))} {q(str(stage / f'view{i}'))}")
    steps += [f"mount -t tmpfs -o mode=755 iolens-view {q(str(t))}" for t in tops]
    for i, p in enumerate(binds):
        steps.append(f"mkdir -p {q(str(p))}")
        steps.append(f"mount --move {q(str(stage / f'view{i}'))} {q(str(p))}")
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            " && ".join(steps) + ' && exec "$@"', "sh", *drop]


@pytest.fixture
def nobody(tmp_path: Path) -> list[str]:
    """The prefix of :func:`unprivileged`, checked: it runs as 65534 with no capability
    and can import iolens and torch."""
    prefix = unprivileged(tmp_path)
    probe = subprocess.run([*prefix, sys.executable, "-c",
                            "import os, iolens, torch; print(os.getuid()); "
                            "print(open('/proc/self/status').read())"],
                           capture_output=True, text=True, check=False, cwd="/",
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    need(probe.returncode == 0, f"uid {NOBODY} cannot run iolens here: {probe.stderr[-2000:]}")
    lines = probe.stdout.splitlines()
    caps = {k: v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert lines[0] == str(NOBODY) and caps["CapEff"] == caps["CapPrm"] == "0" * 16
    return prefix


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A folder in /tmp that uid 65534 owns (tmp_path is root's own, closed to others)."""
    folder = Path(tempfile.mkdtemp(prefix="iolens-nobody-"))
    os.chown(folder, NOBODY, NOBODY)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_nobody(prefix: list[str], folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder),
           "TMPDIR": str(folder), "LANG": "C.UTF-8"}
    return iolens(*args, cwd=folder, prefix=prefix, env=env, timeout=300)


def test_run_needs_no_root(nobody: list[str], nobody_dir: Path, record_property: Any) -> None:
    """iolens run records a real training as an unprivileged user with no capabilities.

    A real DataLoader training run under `iolens run` as uid 65534 with no capabilities:
    exit 0, records carry the dataset device's disk figures and the job's CPU and I/O, and
    the report has a verdict."""
    prefix = nobody
    script, data = make_job(nobody_dir, files=64)
    for p in [nobody_dir, *nobody_dir.rglob("*")]:
        os.chown(p, NOBODY, NOBODY)
    out = as_nobody(prefix, nobody_dir, "run", "--out", "run", "--interval", "0.2", "--no-live",
                    "--path", str(data), "--", sys.executable, str(script), str(data), "2")
    assert out.returncode == 0, out.stderr
    run = nobody_dir / "run"
    assert run.stat().st_uid == NOBODY
    recs = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    meta = json.loads((run / "meta.json").read_text())
    devs = list(meta["devices"])
    assert devs and all(set(r["devices"]) >= set(devs) for r in recs[1:])
    util = [r["devices"][devs[0]]["util"] for r in recs[1:]]
    assert all(isinstance(u, (int, float)) for u in util)
    cpu = [r["job"].get("cpu_pct") for r in recs]
    reads = [r["job"].get("rchar_s") for r in recs]
    assert any(isinstance(c, (int, float)) and c > 0 for c in cpu), cpu
    assert any(isinstance(v, (int, float)) and v > 0 for v in reads), reads
    assert sum(r["train"]["batches"] for r in recs) == 32
    rep = as_nobody(prefix, nobody_dir, "report", "run", "--format", "json")
    assert rep.returncode == 0, rep.stderr
    verdict = json.loads(rep.stdout)["verdict"]
    assert verdict["class"] in PRIMARY_CLASSES
    record_property("measured", f"uid {NOBODY}, CapEff 0: {len(recs)} records on {devs}, "
                                f"job CPU max {max(c or 0 for c in cpu):.0f}%, "
                                f"verdict {verdict['class']}")


def test_doctor_as_an_ordinary_user_names_each_privilege(nobody: list[str],
                                                         nobody_dir: Path) -> None:
    """iolens doctor as an unprivileged user names the privilege each missing feature needs.

    `iolens doctor` as uid 65534 with no capabilities: recording one's own jobs is ok
    with no privilege; other users' processes, the page-cache drop and the slow-disk lab
    are missing, each saying which privilege it takes."""
    out = as_nobody(nobody, nobody_dir, "doctor", "--format", "json")
    assert out.returncode == 0, out.stderr
    found = {c["name"]: c for c in json.loads(out.stdout)}
    assert found["recording your own jobs"]["ok"] is True
    assert found["recording your own jobs"]["privilege"] == ""
    for name, privilege in (("other users' processes", "CAP_SYS_PTRACE"),
                            ("dropping the page cache", "root"), ("slow-disk lab", "root"),
                            ("ports below 1024", "CAP_NET_BIND_SERVICE")):
        assert found[name]["ok"] is False, found[name]
        assert privilege in found[name]["privilege"], found[name]
        assert str(NOBODY) in found[name]["detail"]
