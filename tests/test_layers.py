"""The package's layers: data flows one way, from the kernel's counters up to the reports
and the command line, and so do the imports.

Every import of every module (at its top or inside a function) is read from its source: a
module imports only from its own layer or one below, and no chain of imports leads back
to where it started.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parent.parent / "src"

LAYERS: list[set[str]] = [
    {"_errors", "_version"},
    {"sources"},                   # readers of /proc, /sys, NVML; the counters they give
    {"core"},                      # pure: rates, device selection, words
    {"rundir"},                    # the run directory
    {"training", "_bootstrap"},    # inside the job: timing hooks, --set, autotune's side
    {"recorder"},                  # the sampler loop
    {"analysis"},                  # pure: the model, the verdict, compare
    {"report"},                    # the report object, text and HTML
    {"sinks", "live"},             # outputs while recording; the live view
    {"loaderbench", "pack", "data"},
    {"job"},                       # iolens run, monitor()'s sidecar
    {"api", "_seed", "integrations", "demo"},
    {"", "cli", "__main__"},       # ("": the package's own __init__)
]
"""Lowest first: the part of the package under src/iolens (its first name) in each."""


def _modules(src: Path = SRC) -> dict[str, Path]:
    """Each module of the iolens package under ``src`` -> its file."""
    out = {}
    for path in (src / "iolens").rglob("*.py"):
        name = ".".join(path.relative_to(src).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The iolens modules ``name`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{up}.{base}" if base else up
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n in modules and n != name)
    return found


def _layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    for i, layer in enumerate(LAYERS):
        if part in layer:
            return i
    raise AssertionError(f"{module}: its part {part!r} is in no layer of LAYERS")


def upward(modules: dict[str, Path]) -> list[str]:
    """Each import of a module from a higher layer than its own, in words."""
    return [f"{m} (layer {_layer(m)}) imports {i} (layer {_layer(i)})"
            for m, path in sorted(modules.items()) for i in sorted(_imports(m, path, modules))
            if _layer(i) > _layer(m)]


def cycle(modules: dict[str, Path]) -> list[str] | None:
    """A chain of imports that comes back to where it began, or None."""
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    done: set[str] = set()

    def visit(m: str, trail: list[str]) -> list[str] | None:
        if m in trail:
            return [*trail[trail.index(m):], m]
        if m in done:
            return None
        for n in sorted(graph[m]):
            found = visit(n, [*trail, m])
            if found is not None:
                return found
        done.add(m)
        return None

    for m in sorted(graph):
        found = visit(m, [])
        if found is not None:
            return found
    return None


def test_every_import_goes_down_the_layers_or_stays_in_its_own() -> None:
    up = upward(_modules())
    assert not up, "\n".join(up)


def test_no_chain_of_imports_comes_back_to_where_it_began() -> None:
    found = cycle(_modules())
    assert found is None, "an import cycle: " + " -> ".join(found or [])


def test_an_import_up_and_a_cycle_are_seen(tmp_path: Path) -> None:
    """The checks themselves, on a made package: a reader that imports the command line
    (inside a function), which imports it back (relatively)."""
    pkg = tmp_path / "iolens"
    for part in ("sources", "cli"):
        (pkg / part).mkdir(parents=True)
        (pkg / part / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "sources" / "a.py").write_text("def f():\n    from iolens.cli import b\n")
    (pkg / "cli" / "b.py").write_text("from ..sources import a\n")
    modules = _modules(tmp_path)
    assert upward(modules) == ["iolens.sources.a (layer 1) imports iolens.cli (layer 12)",
                               "iolens.sources.a (layer 1) imports iolens.cli.b (layer 12)"]
    assert cycle(modules) == ["iolens.cli.b", "iolens.sources.a", "iolens.cli.b"]
    (pkg / "sources" / "a.py").write_text("")
    assert upward(modules) == [] and cycle(modules) is None


def test_the_verdicts_modules_import_only_those_below_them() -> None:
    """The order iolens/analysis/verdict/__init__.py gives its modules, highest first, is
    the order of their imports; and none of them is over 500 lines."""
    import re

    package = SRC / "iolens" / "analysis" / "verdict"
    order = re.findall(r"^- ``(\w+)``:", (package / "__init__.py").read_text(), re.M)
    assert sorted(order) == sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    modules = _modules()
    for i, m in enumerate(order):
        name = f"iolens.analysis.verdict.{m}"
        wrong = [x for x in _imports(name, modules[name], modules)
                 if x.startswith("iolens.analysis.verdict.")
                 and x.rsplit(".", 1)[1] not in order[i + 1:]]
        assert not wrong, f"{m} imports {wrong}, which are not below it"
        lines = len(modules[name].read_text().splitlines())
        assert lines <= 500, f"{m}.py: {lines} lines"


def test_no_module_of_the_analysis_is_over_500_lines() -> None:
    """The decisions live in small modules: none in iolens/analysis is over 500 lines."""
    long = {str(p.relative_to(SRC)): n for p in (SRC / "iolens" / "analysis").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_the_reports_path_enters_each_analysis_module_once(tmp_path: Path) -> None:
    """`iolens report` of a recorded run, traced: the modules of iolens.analysis that code
    outside it calls (directly, or through the standard library: a cached property),
    in the order it calls them. The run is read (rundata: its records and its columns),
    judged (verdict), and reported from its columns: no module is entered twice."""
    import sys

    from iolens.cli import main

    fixture = Path(__file__).parent / "fixtures" / "runs" / "request-capped-disk"
    entered: list[str] = []

    def trace(frame: Any, event: str, _: Any) -> None:
        callee = frame.f_globals.get("__name__", "")
        if event != "call" or not callee.startswith("iolens.analysis."):
            return
        f = frame.f_back
        while f is not None and not f.f_globals.get("__name__", "").startswith("iolens"):
            f = f.f_back
        caller = f.f_globals.get("__name__", "") if f is not None else ""
        if caller and not caller.startswith("iolens.analysis") and frame.f_code.co_name != (
                "<module>"):
            module = callee.split(".")[2]
            if not entered or entered[-1] != module:
                entered.append(module)

    main(["report", str(fixture), "--format", "json", "-o", str(tmp_path / "r.json")])  # (imports)
    sys.setprofile(trace)
    try:
        assert main(["report", str(fixture), "--format", "json",
                     "-o", str(tmp_path / "r.json")]) == 0
    finally:
        sys.setprofile(None)
    assert entered[0] == "rundata" and "verdict" in entered, entered
    assert len(entered) == len(set(entered)), f"a module entered again: {entered}"
