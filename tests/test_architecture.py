"""The layout keeps its promises: the import graph of the four packages is acyclic, no module
imports a private name from outside its own package, the torch twin never imports the NumPy
twin (nor the NumPy twin torch), the contract package imports neither, and the command line's
help never imports torch. Read from the source (ASTs) and from fresh interpreters."""
import ast
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

PACKAGES = ("ref_common", "ref_numpy", "ref_torch", "crosscheck")


def modules():
    """{dotted module name: path} for every module of the four packages."""
    out = {}
    for pkg in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].split(os.sep)
                    if rel[-1] == "__init__":
                        rel = rel[:-1]
                    out[".".join(rel)] = os.path.join(folder, f)
    return out


MODULES = modules()


def package_of(name):
    """The package a module belongs to: itself for a package's __init__, else its parent."""
    return name if os.path.basename(MODULES[name]) == "__init__.py" else name.rpartition(".")[0]


def imports(name):
    """(imported module, imported name or None, line) for every import in module `name`,
    function-level imports included; relative imports resolved."""
    tree = ast.parse(open(MODULES[name], encoding="utf-8").read())
    pkg = package_of(name)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:
                found.append((mod, a.name, node.lineno))
    return found


def edges():
    """Module → the project modules it imports (a name imported from a package that is itself
    a module counts as importing that module)."""
    graph = {}
    for name in MODULES:
        targets = set()
        for mod, attr, _ in imports(name):
            if attr is not None and f"{mod}.{attr}" in MODULES:
                targets.add(f"{mod}.{attr}")
            elif mod in MODULES:
                targets.add(mod)
        graph[name] = targets - {name}
    return graph


def test_the_module_graph_has_no_cycle():
    graph = edges()
    state = {}

    def visit(node, path):
        if state.get(node) == "done":
            return
        if state.get(node) == "open":
            cycle = path[path.index(node):] + [node]
            raise AssertionError("import cycle: " + " → ".join(cycle))
        state[node] = "open"
        for nxt in sorted(graph[node]):
            visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        visit(node, [node])


def private_imports(name):
    """The imports of module `name` that reach a private name (a `_module` or an `_attribute`)
    outside the package `name` belongs to. Within one package, its private helpers are shared."""
    own = package_of(name)
    bad = []
    for mod, attr, line in imports(name):
        if not mod or mod.split(".")[0] not in PACKAGES:
            continue
        target = f"{mod}.{attr}" if attr and f"{mod}.{attr}" in MODULES else mod
        parts = target.split(".") + ([attr] if attr and target == mod else [])
        if not any(p.startswith("_") and not p.startswith("__") for p in parts):
            continue
        home = package_of(target) if target in MODULES else target
        if home != own:
            bad.append(f"{name}:{line} imports {mod}{'.' + attr if attr else ''}")
    return bad


def test_no_module_imports_a_private_name_from_outside_its_package():
    assert [b for name in MODULES for b in private_imports(name)] == []


def test_the_private_name_rule_sees_a_violation(monkeypatch, tmp_path):
    """The rule itself: a module of crosscheck.audit importing a private function of
    crosscheck.check.stages, or the NumPy twin's private module from crosscheck, is flagged."""
    src = tmp_path / "spy.py"
    src.write_text("from ..check.stages import _valid\nfrom ref_numpy import _arrays\n"
                   "from . import calls\n")
    monkeypatch.setitem(MODULES, "crosscheck.audit.spy", str(src))
    assert [b.split(" imports ")[1] for b in private_imports("crosscheck.audit.spy")] == \
        ["crosscheck.check.stages._valid", "ref_numpy._arrays"]


@pytest.mark.parametrize("package, forbidden", [
    ("ref_torch", ("ref_numpy", "numpy", "crosscheck")),
    ("ref_numpy", ("ref_torch", "torch", "crosscheck")),
    ("ref_common", ("ref_numpy", "ref_torch", "numpy", "torch", "crosscheck", "scipy")),
])
def test_each_twin_stands_alone_on_the_contract(package, forbidden):
    for name in MODULES:
        if name.split(".")[0] != package:
            continue
        for mod, _, line in imports(name):
            assert (mod or "").split(".")[0] not in forbidden, f"{name}:{line} imports {mod}"


def _modules_loaded_by(argv):
    code = ("import runpy, sys\nsys.argv = ['crosscheck'] + %r\ntry:\n"
            "    runpy.run_module('crosscheck', run_name='__main__')\nexcept SystemExit:\n"
            "    pass\nprint(sorted(sys.modules))" % (argv,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    return out.stdout, set(ast.literal_eval(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv, says", [(["--help"], "usage:"), (["audit", "--help"], "usage:"),
                                        (["explain", "--help"], "usage:"),
                                        (["trainer", "--help"], "usage:"),
                                        (["--version"], "rl-crosscheck 0.")])
def test_help_and_version_are_printed_without_importing_torch(argv, says):
    text, loaded = _modules_loaded_by(argv)
    assert says in text
    assert "torch" not in loaded and "numpy" not in loaded, sorted(m for m in loaded
                                                                   if m.split(".")[0] in
                                                                   ("torch", "numpy"))


@pytest.mark.parametrize("argv, says", [(["--list"], "optimal_token_baseline_advantages"),
                                        (["audit", "--list-profiles"], "verl (volcengine/verl")])
def test_listing_the_registry_and_the_profiles_needs_numpy_but_not_torch(argv, says):
    text, loaded = _modules_loaded_by(argv)
    assert says in text
    assert "torch" not in loaded and "ref_torch" not in loaded


def test_importing_crosscheck_does_not_import_torch():
    code = "import sys, crosscheck; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_the_package_exposes_the_registry_lazily_by_name():
    import crosscheck
    from crosscheck.check import registry
    assert crosscheck.REGISTRY is registry.REGISTRY
    assert crosscheck.build is registry.build and crosscheck.Entry is registry.Entry
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        crosscheck.nonsense
