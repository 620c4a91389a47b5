#!/usr/bin/env python3
"""Fails on an import cycle among the modules of a Python package.

    python3 scripts/check_py_imports.py python/ubep

Reads every .py file of the package with ``ast`` (nothing is imported or run) and follows
every import of a module of the same package: at the top of a file and inside functions alike
(a late import still ties the two modules together). ``from . import _ext`` of a name that
is no .py file (a compiled extension) is no edge. Prints "OK" and exits 0 when the graph
has no cycle; otherwise prints each cycle found, as "a -> b -> a", and exits 1.
"""
import ast
import os
import sys


def module_names(package_dir):
    """{module name: path} of the package's .py files (``pkg``, ``pkg.mod``)."""
    package = os.path.basename(os.path.normpath(package_dir))
    names = {}
    for root, _, files in os.walk(package_dir):
        rel = os.path.relpath(root, package_dir)
        parts = [package] + ([] if rel == "." else rel.split(os.sep))
        for f in files:
            if f.endswith(".py"):
                mod = parts if f == "__init__.py" else parts + [f[:-3]]
                names[".".join(mod)] = os.path.join(root, f)
    return names


def imported(module, path, known):
    """The modules of the package that ``module`` (a file at ``path``) imports."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # "from pkg import mod" imports pkg.mod when it is a .py module; a name that is not
            # one is a name of pkg, or a compiled module (the extension): "from pkg import
            # name" still runs pkg (an edge), "from . import _ext" ties to no .py file.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else
                       (None if node.level and not node.module else base)
                       for a in node.names]
        else:
            continue
        for t in filter(None, targets):
            while t and t not in known:  # "import pkg.mod.name" -> the module that exists
                t = t.rpartition(".")[0]
            # Importing the package itself ("import pkg") from one of its modules runs its
            # __init__: an edge like any other.
            if t and t != module:
                found.add(t)
    return found


def cycles(graph):
    """Every elementary cycle found by a depth-first search (each once, by its first node)."""
    out, seen = [], set()
    state = {}  # module -> 1 (on the path) or 2 (done)
    path = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cyc = path[path.index(n):] + [n]
                key = frozenset(cyc)
                if key not in seen:
                    seen.add(key)
                    out.append(cyc)
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return out


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        sys.exit(f"usage: {argv[0]} PACKAGE_DIR (a folder of .py files), got {argv[1:]}")
    known = module_names(argv[1])
    if not known:
        sys.exit(f"{argv[1]}: no .py files")
    graph = {m: imported(m, p, known) for m, p in known.items()}
    found = cycles(graph)
    if found:
        for c in found:
            print("import cycle: " + " -> ".join(c))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
