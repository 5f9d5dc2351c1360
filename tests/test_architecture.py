"""The package's import graph, read with ``ast`` (imports inside functions counted): no cycle, and
every import points down the layers that docs/architecture.md describes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "avatar_render"

# Rooms by layer, lowest first: a module may import its own room and any room of a lower layer.
LAYERS = (
    ("errors",),  # the core: the user-facing error type,
    ("files",),  # the files a render reads (checked before they are opened) and writes (only its own)
    ("backends",),  # the registry: each backend and SR mode declared once, its code imported when asked for
    ("config", "telemetry", "progress"),  # the typed config, the render's measurements, progress lines
    ("distributed",),  # a leaf the api calls: meshes, launches, sharding
    ("pipeline",),  # the tiers: Module, Stage, Pipeline, the chunk plan and the rolling state
    ("models", "io", "face"),  # networks and checkpoints; media in and out; the face
    ("preview", "infinitetalk"),  # the backends' stages
    ("job",),  # one render: set-up, chunk loop, output, journal, resume, stops
    ("api",),  # the library entry point
    ("metrics", "doctor", "batch"),  # tools built on the api and the rooms below
    ("bench", "tables"),
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


# Rooms that must not know some lower rooms although the layers allow it: a network does not know how it is
# split over processes or streamed (the backend asks ``distributed`` for that and applies it from outside);
# the tools above the api reach a render only through the api, never through ``job``'s internals.
UNKNOWN = {"models": ("distributed",), **{tool: ("job",) for tool in ("metrics", "doctor", "batch", "bench", "cli")}}


def test_rooms_import_nothing_they_must_not_know():
    g = graph()
    seen = [f"{a} -> {b}" for a, targets in sorted(g.items()) for b in sorted(targets)
            if room(b) in UNKNOWN.get(room(a), ())]
    assert not seen, "imports the design keeps out: " + ", ".join(seen)


def test_the_checks_see_a_cycle_an_upward_import_and_a_room_knowing_too_much(tmp_path, monkeypatch):
    """The checks above can fail: a made-up package with each fault."""
    fake = tmp_path / "avatar_render"
    (fake / "io").mkdir(parents=True)
    (fake / "io" / "__init__.py").write_text("")
    (fake / "io" / "a.py").write_text("def f():\n    from avatar_render.io.b import g\n")
    (fake / "io" / "b.py").write_text("from avatar_render.io import a\nfrom avatar_render.api import render\n")
    (fake / "api.py").write_text("")
    (fake / "models").mkdir()
    (fake / "models" / "net.py").write_text("from avatar_render.distributed.device_mesh import Mesh\n")
    (fake / "distributed").mkdir()
    (fake / "distributed" / "device_mesh.py").write_text("")
    (fake / "job").mkdir()
    (fake / "job" / "stop.py").write_text("")
    (fake / "batch").mkdir()
    (fake / "batch" / "pool.py").write_text("def f():\n    from avatar_render.job.stop import StopNow\n")
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
        test_rooms_import_nothing_they_must_not_know()
    except AssertionError as e:
        assert "avatar_render.models.net -> avatar_render.distributed.device_mesh" in str(e)
        assert "avatar_render.batch.pool -> avatar_render.job.stop" in str(e)
    else:
        raise AssertionError("the model importing distributed and the batch importing job were not seen")
    try:
        test_the_package_has_no_import_cycle()
    except AssertionError as e:
        assert "avatar_render.io.a -> avatar_render.io.b -> avatar_render.io.a" in str(e)
    else:
        raise AssertionError("the cycle was not seen")


# Calls that write, create, rename or remove a file system entry. Only the ``files`` room makes them
# (docs/architecture.md): everything else writes through its functions, which know the rules.
_WRITES_OS = {"replace", "rename", "renames", "remove", "unlink", "rmdir", "removedirs", "mkdir", "makedirs", "open",
              "link", "symlink", "mkfifo", "mknod", "truncate", "chmod", "chown", "utime"}
_WRITES_MODULES = {"shutil": {"rmtree", "move", "copy", "copy2", "copyfile", "copytree", "copymode", "copystat"},
                   "tempfile": {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryFile", "TemporaryDirectory",
                                "SpooledTemporaryFile"},
                   "cv2": {"imwrite"}, "np": {"save", "savez", "savetxt"}, "numpy": {"save", "savez", "savetxt"},
                   "torch": {"save"}, "sf": {"write"}, "soundfile": {"write"}}
_WRITES_METHODS = {"write_text", "write_bytes", "unlink", "rmdir", "mkdir", "touch", "rename", "symlink_to",
                   "hardlink_to", "savefig", "save", "save_file", "tofile", "chmod"}


def _mode(call: ast.Call, position: int) -> str:
    node = call.args[position] if len(call.args) > position else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


_FILES_OPENERS = {"create_new", "open_own", "fresh_file"}  # files.write's functions that give an open file
# calls that write into their first argument
_INTO_TARGET = {".save()", ".savefig()", "wave.open(..., write)", "av.open(..., write)"}


def _memory_or_own_files(tree: ast.AST) -> set[str]:
    """Names bound to an in-memory buffer (``io.BytesIO()``) or to a file that files.write opened
    (``with create_new(p) as f``): writing into them is no write of the caller's own."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            f = node.value.func
            if isinstance(f, ast.Attribute) and f.attr == "BytesIO":
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call):
            f = node.context_expr.func
            if isinstance(f, ast.Name) and f.id in _FILES_OPENERS and isinstance(node.optional_vars, ast.Name):
                names.add(node.optional_vars.id)
    return names


def file_writes(path: Path) -> list[str]:
    """``file:line call`` for every call in ``path`` that writes to the file system by itself."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    safe = _memory_or_own_files(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        what = None
        if isinstance(f, ast.Name) and f.id == "open" and set(_mode(node, 1)) & set("wax+"):
            what = "open(..., write)"
        elif isinstance(f, ast.Attribute):
            owner = f.value.id if isinstance(f.value, ast.Name) else None
            if owner == "os" and f.attr in _WRITES_OS:
                what = f"os.{f.attr}"
            elif owner in _WRITES_MODULES and f.attr in _WRITES_MODULES[owner]:
                what = f"{owner}.{f.attr}"
            elif owner in ("av", "wave") and f.attr == "open" and set(_mode(node, 1)) & set("wax+"):
                what = f"{owner}.open(..., write)"
            elif owner in ("os", "shutil", "tempfile"):
                pass
            elif f.attr in _WRITES_METHODS:
                what = f".{f.attr}()"
            elif f.attr == "replace" and len(node.args) == 1 and not node.keywords:  # Path.replace(target)
                what = ".replace(target)"
            elif f.attr == "open" and set(_mode(node, 0)) & set("wax+"):  # Path.open("w")
                what = ".open(write)"
        if what in _INTO_TARGET and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in safe:
            what = None
        if what:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {what}")
    return found


# The only calls outside ``files/`` the scan finds and accepts, each for its reason.
NOT_FILE_WRITES = {
    ("avatar_render/io/live/wire.py", "av.open(..., write)"): "a pipe into ffmpeg (SRT)",
    ("avatar_render/io/live/rtmp_child.py", "av.open(..., write)"): "a network stream (RTMP)",
}


def test_only_the_files_room_writes_files():
    """Every file the package writes goes through ``avatar_render/files/`` (create new, replace only what
    is ours, never through a link, remove only what it made)."""
    writes = [w for p in sorted(PACKAGE.rglob("*.py")) if "files" not in p.relative_to(PACKAGE).parts[:1]
              for w in file_writes(p)]
    accepted = {(w.split(":")[0], w.split(" ", 1)[1]) for w in writes} & set(NOT_FILE_WRITES)
    writes = [w for w in writes if (w.split(":")[0], w.split(" ", 1)[1]) not in NOT_FILE_WRITES]
    assert not writes, "writes outside avatar_render/files/: " + "; ".join(writes)
    assert accepted == set(NOT_FILE_WRITES), f"accepted writes no longer there: {set(NOT_FILE_WRITES) - accepted}"


def test_the_write_scan_sees_each_kind_of_write(tmp_path):
    """The scan above can fail: a module with one write of each kind, and harmless look-alikes."""
    module = tmp_path / "m.py"
    module.write_text(
        "import os, shutil, tempfile\n"
        "open(p, 'w'); open(p, mode='ab'); p.write_text('x'); p.write_bytes(b''); os.replace(a, b); p.replace(q)\n"
        "p.unlink(); shutil.rmtree(d); tempfile.mkdtemp(); p.mkdir(); fig.savefig(p); image.save(p)\n"
        "av.open(p, 'w'); wave.open(p, 'wb'); p.open('w'); os.open(p, 0)\n"
        "open(p); open(p, 'rb'); s.replace('a', 'b'); dataclasses.replace(x, y=1); av.open(p); os.path.join(a)\n"
        "buf = io.BytesIO(); fig.savefig(buf); image.save(buf)\n"
        "with create_new(p) as f, wave.open(f, 'wb') as w: pass\n")
    found = [w.split(" ", 1)[1] for w in _scan_outside(module, tmp_path)]
    assert found == ["open(..., write)", "open(..., write)", ".write_text()", ".write_bytes()", "os.replace",
                     ".replace(target)", ".unlink()", "shutil.rmtree", "tempfile.mkdtemp", ".mkdir()", ".savefig()",
                     ".save()", "av.open(..., write)", "wave.open(..., write)", ".open(write)", "os.open"], found


def _scan_outside(module: Path, root: Path) -> list[str]:
    global PACKAGE
    saved, PACKAGE = PACKAGE, root
    try:
        return sorted(file_writes(module), key=lambda w: (int(w.split(":")[1].split(" ")[0]), 0))
    finally:
        PACKAGE = saved


def _registered_names() -> set[str]:
    from avatar_render.backends import BACKENDS

    return set(BACKENDS)


def name_compares(path: Path, names: set[str]) -> list[str]:
    """``file:line`` for each place in ``path`` that asks a backend's name instead of the registry: a
    comparison with a backend's name (``cfg.backend == "preview"``, ``in ("preview", ...)``), a table keyed
    by one (``{"infinitetalk": 1}``), or an SR mode compared by name (``m.sr == "none"``)."""
    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    def sr(node: ast.AST) -> bool:
        return getattr(node, "attr", None) == "sr" or getattr(node, "id", None) == "sr"

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        sides = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        keys = node.keys if isinstance(node, ast.Dict) else []
        if any(named(s) for s in sides) or any(k is not None and named(k) for k in keys) or (
                any(sr(s) for s in sides) and any(isinstance(s, (ast.Constant, ast.Tuple, ast.List, ast.Set))
                                                  for s in sides)):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_only_the_registry_knows_the_backends_by_name():
    """A backend is asked what it needs (``backends.backend(name)``), never recognised by its name: adding
    one is its room and one registration in ``avatar_render/backends.py``."""
    names = _registered_names()
    seen = [f for p in sorted(PACKAGE.rglob("*.py")) if p.name != "backends.py" or p.parent != PACKAGE
            for f in name_compares(p, names)]
    assert not seen, "backend or SR mode names compared outside avatar_render/backends.py: " + ", ".join(seen)


def test_the_name_scan_sees_each_kind_of_name_compare(tmp_path):
    """The scan above can fail: each way of recognising a backend by name, and look-alikes it leaves."""
    module = tmp_path / "m.py"
    module.write_text(
        "a = cfg.backend == 'preview'\nb = cfg.backend in ('preview', 'other')\nc = {'infinitetalk': 1}\n"
        "d = m.sr != 'none'\ne = 'swiftvr' == sr\n"
        "f = backend(cfg.backend).gpu\ng = cfg.backend == own.name\nh = {'x': 'preview'}\n"
        "i = m.sr_fidelity == 'vae2x'\nbackend: str = 'preview'\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        found = name_compares(module, {"preview", "infinitetalk"})
    finally:
        PACKAGE = saved
    assert [f.rsplit("/", 1)[-1] for f in found] == ["m.py:1", "m.py:2", "m.py:3", "m.py:4", "m.py:5"], found


# The maps of the rooms in the docs are read from LAYERS above, the one source of truth: the diagram of
# docs/architecture.md (one layer a line, top first) and the README's list (each bullet's rooms before its colon).
ROOT = PACKAGE.parent
_ROOM_WORD = re.compile(r"[a-z_]+")


def package_rooms(package: Path) -> set[str]:
    return {p.stem if p.is_file() else p.name for p in package.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and any(p.glob("*.py")))}


def diagram_layers(text: str) -> list[tuple[str, ...]]:
    """The layers of the first code block, top first: each line's rooms are its words before the
    description (columns two spaces apart); a line that starts with spaces continues the one above."""
    block = text.split("```", 2)[1].split("\n", 1)[1]
    layers: list[tuple[str, ...]] = []
    for line in block.splitlines():
        fields = re.split(r"\s{2,}", line.strip())
        rooms = tuple(f for f in fields[:-1] if _ROOM_WORD.fullmatch(f))
        if line.startswith(" ") and layers:
            layers[-1] += rooms
        elif rooms:
            layers.append(rooms)
    return layers


def readme_rooms(text: str) -> list[tuple[str, ...]]:
    """The rooms of each bullet of the README's package list: the `names` before the first colon."""
    section = text.split("The package, from the bottom layer up", 1)[1].split(":\n", 1)[1].strip().split("\n\n", 1)[0]
    bullets = [b for b in re.split(r"\n(?=\* )", section) if b.startswith("* ")]
    return [tuple(n.rstrip("/").removesuffix(".py") for n in re.findall(r"`([^`]+)`", b.split(": ", 1)[0]))
            for b in bullets]


def map_faults(layers: tuple[tuple[str, ...], ...], rooms: set[str], diagram: list[tuple[str, ...]],
               readme: list[tuple[str, ...]]) -> list[str]:
    shown = tuple(t for t in (tuple(r for r in layer if r != "__main__") for layer in layers) if t)
    faults = [f"LAYERS names {r}, which the package does not have" for layer in layers for r in layer
              if r not in rooms]
    if tuple(reversed(diagram)) != shown:
        faults.append(f"docs/architecture.md's diagram {list(reversed(diagram))} is not LAYERS {list(shown)}")
    rank = {r: i for i, layer in enumerate(shown) for r in layer}
    named = [r for bullet in readme for r in bullet]
    faults += [f"the README names {r}, which is no room" for r in named if r not in rank]
    faults += [f"the README leaves out {r}" for r in sorted(set(rank) - set(named))]
    ranks = [rank[r] for r in named if r in rank]
    if ranks != sorted(ranks):
        faults.append(f"the README's list is not from the bottom layer up: {named}")
    return faults


def test_the_docs_map_the_rooms_the_layers_have():
    faults = map_faults(LAYERS, package_rooms(PACKAGE), diagram_layers((ROOT / "docs" / "architecture.md").read_text()),
                        readme_rooms((ROOT / "README.md").read_text()))
    assert not faults, "; ".join(faults)


def test_the_map_check_sees_a_room_missing_or_made_up():
    """The check above can fail: maps that name a room the package lacks, miss one, or mix the order."""
    layers = (("errors",), ("io", "face"), ("cli",), ("__main__",))
    rooms = {"errors", "io", "face", "cli", "__main__"}
    diagram = diagram_layers("x\n```\ncli     the app\nio   face   media; the face\nerrors    the error\n```\n")
    readme = readme_rooms("The package, from the bottom layer up (each):\n\n* `errors.py`: e.\n* `io/`, `face/`: m.\n"
                          "* `cli.py`: c.\n\nNext.")
    assert map_faults(layers, rooms, diagram, readme) == []
    assert map_faults(layers, rooms - {"face"}, diagram, readme) == [
        "LAYERS names face, which the package does not have"]
    assert "is not LAYERS" in map_faults(layers, rooms, diagram[:1] + diagram[2:], readme)[0]
    assert map_faults(layers, rooms, diagram, readme[:1] + [("io",), ("cli", "web")]) == [
        "the README names web, which is no room", "the README leaves out face"]
    assert "not from the bottom layer up" in map_faults(layers, rooms, diagram, readme[::-1])[0]


def exception_faults(path: Path, *, errors_module: bool) -> list[str]:
    """``file:line Name`` for each exception class in ``path`` off the rule of errors.py: an error's name ends
    in ``Error`` and it lives in errors.py (nothing else does); any other exception class is a control-flow
    signal that derives from ``Exception`` or ``BaseException`` only."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
        exception = node.name.endswith("Error") or any(b.endswith(("Error", "Exception")) for b in bases)
        where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
        if errors_module and not node.name.endswith("Error"):
            found.append(where)
        elif not errors_module and exception and (
                node.name.endswith("Error") or any(b not in ("Exception", "BaseException") for b in bases)):
            found.append(where)
    return found


def test_errors_live_in_errors_py_and_signals_are_not_errors():
    faults = [f for p in sorted(PACKAGE.rglob("*.py"))
              for f in exception_faults(p, errors_module=p == PACKAGE / "errors.py")]
    assert not faults, "exception classes off the rule of avatar_render/errors.py: " + ", ".join(faults)


def test_the_exception_scan_sees_an_error_outside_errors_py(tmp_path):
    """The check above can fail: an error kind defined elsewhere, a signal named as an error, a signal
    deriving from an error, and errors.py holding a class not named as an error."""
    module = tmp_path / "m.py"
    module.write_text("class CannotResume(AvatarRenderError): pass\nclass StageFailed(RuntimeError): pass\n"
                      "class DecodeError(Exception): pass\nclass StopNow(BaseException): pass\n"
                      "class Aborted(Exception): pass\nclass Item: pass\nclass Sub(Item): pass\n")
    (tmp_path / "errors.py").write_text("class AvatarRenderError(Exception): pass\nclass Stop(Exception): pass\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "pkg"
    try:
        assert [f.split(" ")[1] for f in exception_faults(module, errors_module=False)] == [
            "CannotResume", "StageFailed", "DecodeError"]
        assert [f.split(" ")[1] for f in exception_faults(tmp_path / "errors.py", errors_module=True)] == ["Stop"]
    finally:
        PACKAGE = saved


def path_changes(path: Path) -> list[str]:
    """Where ``path`` changes ``sys.path`` (to import a script, or a sibling of one): 'file:line'."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.name}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in ("insert", "append", "extend")
            and isinstance(node.value, ast.Attribute) and node.value.attr == "path"
            and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys"]


def test_no_script_or_test_changes_sys_path():
    """Nothing imports a script: a script imports the package (installed) or a sibling in its own folder,
    which Python finds by itself; tests read data files, not scripts."""
    files = sorted((ROOT / "scripts").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))
    found = [f for p in files if p.name != "test_architecture.py" for f in path_changes(p)]
    assert not found, "sys.path changed in: " + ", ".join(found)


def test_the_sys_path_scan_sees_an_insert(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nsys.path.insert(0, 'x')\nsys.path.append('y')\nsys.argv.append('z')\n")
    assert path_changes(script) == ["s.py:2", "s.py:3"]
