"""The package's shape: imports go one way along the pipeline, and importing tvmrnn changes nothing
in the process."""
from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tvmrnn"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """The tvmrnn modules a file imports, anywhere in it (inside functions too; not those for annotations)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _walk_runtime(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # `from . import kernels` imports a module
                candidate = f"{module}.{alias.name}"
                found.add(candidate if _exists(candidate) else module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] == "tvmrnn" and _exists(m)} - {name}


def _walk_runtime(tree):
    """Every node but those under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _exists(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    graph = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}
    # importing a.b.c runs a/__init__ and a/b/__init__ first: a module depends on its packages
    for name in list(graph):
        parts = name.split(".")
        for i in range(1, len(parts)):
            graph[name].add(".".join(parts[:i]))
    for name, deps in graph.items():
        deps.discard(name)
    return graph


def test_no_import_circles():
    graph = _graph()
    # the top-level package and the subpackages' __init__ re-export their contents: an edge into
    # a package means "its __init__", which may import its own submodules
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if m.startswith(d + "."):  # a module's own enclosing package, already being imported
                continue
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_build_path_does_not_import_the_tuner():
    """``build`` reads records (tune.records) but never loads the tuning loop or its spaces."""
    code = ("import sys, tvmrnn; tvmrnn.build('gru', input_size=3, hidden_size=4, batch_size=2); "
            "print([m for m in ('tvmrnn.tune.tuner', 'tvmrnn.tune.spaces', 'tvmrnn.tune.tasks') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_import_changes_no_environment_variable():
    code = ("import os, json; before = dict(os.environ); import tvmrnn, tvmrnn.torch; "
            "print(json.dumps(sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))))")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         cwd=PACKAGE.parent).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []
