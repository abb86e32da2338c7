"""The package's layers: data flows one way, from the kernel's counters up to the reports
and the command line, and so do the imports.

Every import of every module (at its top or inside a function) is read from its source: a
module imports only from its own layer or one below, and no chain of imports leads back
to where it started.
"""

from __future__ import annotations

import ast
from pathlib import Path

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


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "iolens").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
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


def test_every_import_goes_down_the_layers_or_stays_in_its_own() -> None:
    modules = _modules()
    up = [f"{m} (layer {_layer(m)}) imports {i} (layer {_layer(i)})"
          for m, path in sorted(modules.items()) for i in sorted(_imports(m, path, modules))
          if _layer(i) > _layer(m)]
    assert not up, "\n".join(up)


def test_no_chain_of_imports_comes_back_to_where_it_began() -> None:
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    done: set[str] = set()

    def visit(m: str, trail: list[str]) -> None:
        if m in trail:
            raise AssertionError("an import cycle: " + " -> ".join(
                [*trail[trail.index(m):], m]))
        if m in done:
            return
        for n in sorted(graph[m]):
            visit(n, [*trail, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_a_cycle_and_an_import_up_are_seen(tmp_path: Path) -> None:
    """The checks themselves, on a made package: an upward import and a cycle."""
    pkg = tmp_path / "iolens"
    (pkg / "sources").mkdir(parents=True)
    (pkg / "cli").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sources" / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "sources" / "a.py").write_text("def f():\n    from iolens.cli import b\n")
    (pkg / "cli" / "b.py").write_text("from ..sources import a\n")
    modules = {".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(
        ".__init__"): p for p in pkg.rglob("*.py")}
    assert _imports("iolens.sources.a", modules["iolens.sources.a"], modules) == {
        "iolens.cli", "iolens.cli.b"}
    assert _imports("iolens.cli.b", modules["iolens.cli.b"], modules) == {
        "iolens.sources", "iolens.sources.a"}
    assert _layer("iolens.cli.b") > _layer("iolens.sources.a")
