"""The house drawing of docs/architecture.md §2 holds: every import inside diffattn goes from a package to one in a
layer below it (or within its own package), so there are no import cycles between packages and no arrow running
back up; and no module imports another package's private (underscore) names. Read from the source with ``ast``."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "diffattn"

# docs/architecture.md §2, lowest first; packages in one layer may import each other only as the table there says
LAYERS = [
    {"ops"},
    {"lambdas", "config", "files", "cards", "hf_auto", "paper_claim", "cuda_graphs", "environment"},
    {"data"},
    {"models"},
    {"adapters"},
    {"eval", "bench"},
    {"train"},
    {"experiments"},
    {"quickstart", "cli", "console", "__main__"},
]
# the table's arrows inside one layer
WITHIN_LAYER = {
    ("config", "files"),
    ("bench", "eval"),
    ("cli", "quickstart"),
    ("console", "cli"),
    ("__main__", "console"),
}
DEFERRED_UP = {("hf_auto", "models")}  # inside a function only (docs/architecture.md §2: no cycle at import)
LAYER = {package: i for i, layer in enumerate(LAYERS) for package in layer}


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once for every test of this file."""
    return ast.parse(path.read_text())


def _package(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path):
    """(imported diffattn package, names, whether inside a function) of every diffattn import in ``path``."""
    tree = _tree(path)
    depth = len(path.relative_to(SRC).parts) - 1  # package depth of the module
    functions = {
        id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(f)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = list(path.relative_to(SRC).parts[:depth])[: max(depth - node.level + 1, 0)]
                target = [*parts, *(node.module.split(".") if node.module else [])]
                if node.level > depth + 1 or not target:
                    target = [alias.name for alias in node.names][:1]
            elif node.module and node.module.split(".")[0] == "diffattn":
                target = node.module.split(".")[1:] or [alias.name for alias in node.names][:1]
            else:
                continue
            names = [alias.name for alias in node.names]
            yield target[0].removesuffix(".py"), names, id(node) in functions
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "diffattn" and len(parts) > 1:
                    yield parts[1], [], id(node) in functions


@functools.cache  # two tests read it
def _violations():
    up, private = [], []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent == SRC and path.name == "__init__.py":
            continue  # the package's lazy public names: it names everything by design
        own = _package(path)
        for target, names, deferred in _imports(path):
            if target == own or target not in LAYER:
                continue
            allowed = LAYER[target] < LAYER[own] or (own, target) in WITHIN_LAYER
            allowed |= deferred and (own, target) in DEFERRED_UP
            if not allowed:
                up.append(f"{path.relative_to(SRC)} imports {target}")
            private += [f"{path.relative_to(SRC)} imports {target}.{n}" for n in names if n.startswith("_")]
    return up, private


def test_every_import_goes_down_the_layers():
    up, _ = _violations()
    assert not up, "imports running back up (docs/architecture.md §2):\n" + "\n".join(up)


def test_no_module_imports_another_packages_private_names():
    _, private = _violations()
    assert not private, "\n".join(private)


def test_every_package_has_a_layer():
    packages = {_package(p) for p in SRC.rglob("*.py") if p.parent != SRC or p.name != "__init__.py"}
    assert packages <= set(LAYER), sorted(packages - set(LAYER))


def _module_graph() -> dict[str, set[str]]:
    """Module → the diffattn modules it imports anywhere in its source (deferred imports inside functions too)."""
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_between_modules_even_through_deferred_imports():
    # a deferred import inside a function hides a circle from Python, not from the reader; hf_auto ↔ models was the
    # last (issue 35 §7): save_readme lives in cards.py, the registration in models/auto.py, hf_auto is the hook only
    circles = _circles(_module_graph())
    assert circles == [], circles
    assert not any("diffattn.adapters.registry" in c for c in circles)  # AnnealedOptions: a leaf module now


def _top_level_imports(path: Path, name: str, package: str) -> set[str]:
    """Every module ``path`` imports when it is imported: its body's imports, in ``try`` and ``if`` blocks too, but
    not inside functions or classes, nor under ``if TYPE_CHECKING`` (annotations only)."""

    def body_imports(statements):
        for node in statements:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from body_imports(node.orelse)
            elif isinstance(node, ast.If | ast.Try):
                for block in (node.body, node.orelse, getattr(node, "finalbody", []), *(
                        h.body for h in getattr(node, "handlers", []))):  # fmt: skip
                    yield from body_imports(block)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                yield target
                yield from (f"{target}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)

    return set(body_imports(_tree(path).body))


def test_the_commands_flags_are_built_without_importing_transformers():
    """``diffattn eval --help`` builds its flags from the suite table (``diffattn.eval.suite``), ``diffattn pretrain
    --help`` from the architecture table, the backends and the compile modes, ``diffattn adapt --help`` from the
    method registry and the table of offline models: whatever those import when they are imported stays clear of
    transformers, whose import (with diffattn's models, which it registers) took over 5 s of the 9.7 s that eval's
    help took (2026-12-02; now about 2-3 s, torch's import; pretrain's 5.0 s → 1.4 s, adapt's 4.4 s → 2.1 s). The run
    configs too (``diffattn.train.config``, ``.adapt_config``, the ``diffattn.train`` package's lazy names): pretrain
    and adapt validate the flags before they import the trainer, so a bad flag is answered in about 2 s, not 7-8 s
    (2026-12-03)."""
    modules = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    roots = ["diffattn.eval.suite", "diffattn.models.architectures", "diffattn.ops", "diffattn.cuda_graphs"]
    roots += ["diffattn.adapters", "diffattn.models.pretrained", "diffattn.train.config", "diffattn.train.adapt_config"]
    seen, todo, external = set(), list(roots), {}
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        path = modules[name]
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        parents = [".".join(name.split(".")[:i]) for i in range(2, len(name.split(".")))]
        for target in [*_top_level_imports(path, name, package), *parents]:
            if target.split(".")[0] == "diffattn":
                todo.append(target)
            else:
                external.setdefault(target.split(".")[0], set()).add(name)
    assert {"diffattn.eval.niah.claims", "diffattn.models", "diffattn.ops.routes", "diffattn.adapters.dex"} <= seen
    assert "torch" in external
    assert "transformers" not in external, f"imported at the top of {sorted(external['transformers'])}"
