"""The layers import only downward (docs/architecture.md): core <- models <- engines <- replicas <- iobench <- planner
<- engine_bridge <- fleet, and no module imports itself through others (no import circles). Every import is walked,
including those inside functions."""

import ast
import os

import pytest

LAYERS = ("core", "models", "engines", "replicas", "iobench", "planner", "engine_bridge", "fleet")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_files(package, root):
    for dirpath, _, files in os.walk(os.path.join(root, package)):
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def imported_layers(path, root):
    """(line, layer) for every import in the file that names one of the layers."""
    rel = os.path.relpath(path, root)
    parts = rel[:-3].split(os.sep)
    package = parts[:-1]
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in LAYERS:
                yield node.lineno, top


def upward_imports(package, root=ROOT):
    rank = LAYERS.index(package)
    return [f"{os.path.relpath(path, root)}:{line} imports {layer}"
            for path in package_files(package, root)
            for line, layer in imported_layers(path, root)
            if LAYERS.index(layer) > rank]


@pytest.mark.parametrize("package", LAYERS)
def test_no_layer_imports_a_layer_above_it(package):
    assert upward_imports(package) == []


def test_the_walk_sees_imports_inside_functions(tmp_path):
    """The check itself can fail: a function-level upward import in core is reported."""
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "bad.py").write_text("import os\n\n\ndef f():\n    from planner.plan import Plan\n    from . import fine\n")
    (pkg / "sub").mkdir()
    (pkg / "sub" / "worse.py").write_text("from ...engine_bridge import cli\n")
    assert sorted(upward_imports("core", str(tmp_path))) == ["core/bad.py:5 imports planner",
                                                              "core/sub/worse.py:1 imports engine_bridge"]


# ---------------------------------------------------------------------------------------------
# No import circles between modules (docs/architecture.md): a module that needs another at call time
# only is still a circle when the other needs it; the walk counts every import, those inside
# functions included.

def module_files(root=ROOT):
    """{dotted module name: (path, its package as a list)} for every .py file of the layers
    (a package's __init__.py is the package itself)."""
    out = {}
    for package in LAYERS:
        for path in package_files(package, root):
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
                out[".".join(parts)] = (path, parts)
            else:
                out[".".join(parts)] = (path, parts[:-1])
    return out


def imported_modules(path, package, modules):
    """The modules of `modules` a file imports: `from P import M` names module P.M where that is a
    module, else P (the nearest enclosing module for a dotted name)."""
    def nearest(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(nearest(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else nearest(base))
    return found - {""}


def import_circles(root=ROOT):
    """Every set of modules that import each other, directly or through others (the strongly
    connected components of the import graph with more than one module), each sorted."""
    modules = module_files(root)
    graph = {m: imported_modules(path, package, modules) - {m} for m, (path, package) in modules.items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):                       # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circles)


def test_no_module_imports_itself_through_others():
    assert import_circles() == []


def test_the_circle_walk_sees_imports_inside_functions(tmp_path):
    """The check itself can fail: a circle closed by an import at call time is reported, through
    a package's __init__ and a relative import, and a one-way import is not."""
    pkg = tmp_path / "engines" / "toy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .reads import pattern\n")
    (pkg / "reads.py").write_text("def pattern():\n    from engines.toy import NAME\n    return NAME\n")
    (pkg / "facts.py").write_text("NAME = 'toy'\n")
    (pkg / "log.py").write_text("from .facts import NAME\n")
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "a.py").write_text("import core.b\n")
    (tmp_path / "core" / "b.py").write_text("def f():\n    from . import a\n")
    assert import_circles(str(tmp_path)) == [["core.a", "core.b"], ["engines.toy", "engines.toy.reads"]]
