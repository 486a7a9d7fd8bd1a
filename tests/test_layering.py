"""The layers import only downward (docs/architecture.md): core <- models <- engines <- replicas <- iobench <- planner
<- engine_bridge <- fleet. Every import is walked, including those inside functions."""

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
