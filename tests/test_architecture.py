"""The package's import graph, read with ``ast`` (imports inside functions counted): no cycle, and
every import points down the layers that docs/architecture.md describes."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "avatar_render"

# Rooms by layer, lowest first: a module may import its own room and any room of a lower layer.
LAYERS = (
    ("errors",),  # the core: the user-facing error type,
    ("files",),  # the files a render reads (checked before they are opened) and writes (only its own)
    ("config", "telemetry"),  # the typed config, the render's measurements
    ("distributed",),  # a leaf the api calls: meshes, launches, sharding
    ("pipeline",),  # the tiers: Module, Stage, Pipeline, the chunk plan and the rolling state
    ("models", "io", "face"),  # networks and checkpoints; media in and out; the face
    ("preview", "infinitetalk"),  # the backends' stages
    ("job",),  # one render: set-up, chunk loop, output, journal, resume, stops
    ("api",),  # the library entry point
    ("metrics", "doctor", "batch"),  # tools built on the api and the rooms below
    ("bench",),
    ("cli",),
    ("__main__",),
)
RANK = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every avatar_render module ``path`` imports, wherever the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("avatar_render")}
        elif (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("avatar_render")
              and not node.level):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports(path) if m in modules and m != name} for name, path in modules.items()}


def room(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


def test_the_package_has_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_imports_point_down_the_layers():
    g = graph()
    rooms = {room(m) for m in g} - {"__init__"}
    assert rooms <= set(RANK), f"rooms without a layer: {sorted(rooms - set(RANK))}"
    upward = [f"{a} -> {b}" for a, targets in sorted(g.items()) for b in sorted(targets)
              if room(a) != "__init__" and room(b) != room(a) and RANK[room(b)] >= RANK[room(a)]]
    assert not upward, "imports that do not point down: " + ", ".join(upward)


def test_the_check_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The two checks above can fail: a made-up package with both faults."""
    fake = tmp_path / "avatar_render"
    (fake / "io").mkdir(parents=True)
    (fake / "io" / "__init__.py").write_text("")
    (fake / "io" / "a.py").write_text("def f():\n    from avatar_render.io.b import g\n")
    (fake / "io" / "b.py").write_text("from avatar_render.io import a\nfrom avatar_render.api import render\n")
    (fake / "api.py").write_text("")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", fake)
    g = graph()
    assert "avatar_render.io.a" in g["avatar_render.io.b"] and "avatar_render.io.b" in g["avatar_render.io.a"]
    try:
        test_imports_point_down_the_layers()
    except AssertionError as e:
        assert "avatar_render.io.b -> avatar_render.api" in str(e)
    else:
        raise AssertionError("the upward import was not seen")
    try:
        test_the_package_has_no_import_cycle()
    except AssertionError as e:
        assert "avatar_render.io.a -> avatar_render.io.b -> avatar_render.io.a" in str(e)
    else:
        raise AssertionError("the cycle was not seen")
