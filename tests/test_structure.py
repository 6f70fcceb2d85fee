"""The package's import structure, read from the source: its modules import each other at their top, in layers,
without cycles. The few imports deferred into a function on purpose are listed below, each with why."""

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Lower layers first: a module imports only modules of its own layer or of lower ones.
LAYERS = ["(root)", "errors", "atomic", "presets", "models", "config", "recipes", "data", "privacy", "engine",
          "methods", "audits", "bench", "release", "cli", "__main__"]

# (file, function): why its import of the package's own modules stays inside the function
DEFERRED = {
    ("privdistill/__init__.py", "load"): "release imports torch, and this package for __version__",
    ("privdistill/models/registry.py", "_ensure_loaded"): "the lazy model registry: the model modules import it",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    """The package's modules an import statement loads (`from pkg import submodule`: the submodule)."""
    if isinstance(node, ast.Import):
        sources = [alias.name for alias in node.names]
        return [s for s in sources if s in MODULES]
    if node.level:
        package = name if is_package else name.rpartition(".")[0]
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    found = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
    return [t for t in found if t in MODULES]


def _imports() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """(module -> the modules it imports at its top, [(file, function, statement)] of imports inside functions)."""
    graph, local = {}, []
    for name, path in MODULES.items():
        tree, top = ast.parse(path.read_text()), set()

        def visit(node, scope, type_checking):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(child, scope or child.name, type_checking)
                elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    visit(ast.Module(body=child.body, type_ignores=[]), scope, True)
                    visit(ast.Module(body=child.orelse, type_ignores=[]), scope, type_checking)
                elif isinstance(child, (ast.Import, ast.ImportFrom)):
                    targets = _targets(child, name, path.name == "__init__.py")
                    if targets and not type_checking:
                        if scope:
                            local.append((str(path.relative_to(SRC)), scope, ast.unparse(child)))
                        else:
                            top.update(t for t in targets if t != name)
                else:
                    visit(child, scope, type_checking)

        visit(tree, None, False)
        graph[name] = top
    return graph, local


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1] if len(parts) > 1 else "(root)")


def test_modules_import_each_other_at_their_top():
    _, local = _imports()
    unexpected = [f"{file}: {function}: {statement}" for file, function, statement in local
                  if (file, function) not in DEFERRED]
    assert not unexpected, "import these at the top of the module (or say here why not):\n" + "\n".join(unexpected)


def test_no_import_cycles():
    graph, _ = _imports()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def connect(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    assert not cycles, f"import cycles: {cycles}"


def test_lower_layers_do_not_import_higher_ones():
    graph, _ = _imports()
    upward = [f"{a} -> {b}" for a, targets in sorted(graph.items()) for b in sorted(targets) if _layer(b) > _layer(a)]
    assert not upward, f"lower layers importing higher ones ({' < '.join(LAYERS)}):\n" + "\n".join(upward)


def test_importing_the_package_first_shortens_openmp_s_spin_wait_unless_the_user_set_one():
    """privdistill/__init__.py: a short libgomp spin (a run beside another process would otherwise crawl)."""
    code = "import os, privdistill; print(os.environ.get('GOMP_SPINCOUNT'))"
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}

    def spin(extra: dict) -> str:
        return subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert spin({}) == "10000"
    assert spin({"GOMP_SPINCOUNT": "5"}) == "5" and spin({"OMP_WAIT_POLICY": "ACTIVE"}) == "None"
