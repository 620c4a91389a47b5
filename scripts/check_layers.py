#!/usr/bin/env python3
"""Checks ubep's layering (docs/ARCHITECTURE.md, "Layering rules"). Python 3 standard library only.

It fails (exit status 1, one line per finding: file:line, what, the rule) on
  1. an #include that the rules table in docs/ARCHITECTURE.md does not allow: the table is read
     from the document, so the document is the one source of the rules;
  2. a cycle in the folder graph of src/ (one node per folder, an edge per #include between two);
  3. an import cycle among the modules of python/ubep (module- and function-level imports alike);
  4. a function in src/ whose body (the lines between its braces) is over MAX_BODY_LINES lines;
  5. a C++ file in src/ or include/ of MAX_FILE_LINES lines or more.
Findings listed in KNOWN_VIOLATIONS below are reported as allowed and do not fail the check.

  scripts/check_layers.py              check the repository this script lives in
  scripts/check_layers.py --root DIR   check another tree
  scripts/check_layers.py --self-test  show that each check fails on a synthetic bad tree
  scripts/check_layers.py --functions  list every function in src/ with its body length
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_BODY_LINES = 80
MAX_FILE_LINES = 500  # the style guide: files under 500 lines (C++ and Python sources)
DOC = "docs/ARCHITECTURE.md"
RULES_HEADING = "## Layering rules"
CXX_SUFFIXES = {".h", ".hpp", ".cuh", ".inl", ".c", ".cc", ".cpp", ".cu"}
# Where C++ files are looked for (their layers come from the rules table).
CXX_DIRS = ["include", "src", "tests", "tools", "sim", "python/src", "examples"]
# Where a quoted #include is looked up after the including file's own folder (the build's
# include directories: CMakeLists.txt's target_include_directories).
INCLUDE_ROOTS = ["src", "include", ".", "tests", "tools", "tests/elastic"]
PYTHON_PACKAGE = "python/ubep"

# ---------------------------------------------------------------------------------------------
# KNOWN_VIOLATIONS: what the code breaks today, allowed until its owner clears it (issue 27).
# Remove an entry together with the violation; the check says when an entry is no longer needed.
# Nothing may be added here without a reason and an owner.
KNOWN_VIOLATIONS = {
    # (including file, included file), both relative to the repository root.
    "includes": {},
    # frozenset of the modules in one import cycle (a strongly connected component).
    "python_cycles": {
    },
    # (file, function) -> (body lines today, why). A listed function may shrink, not grow.
    "long_functions": {
    },
}
# ---------------------------------------------------------------------------------------------


@dataclass
class Finding:
    where: str  # file:line
    what: str
    rule: str
    allowed: str = ""  # why it is allowed (KNOWN_VIOLATIONS), or "" when it fails the check

    def line(self) -> str:
        tag = "allowed (KNOWN_VIOLATIONS)" if self.allowed else "error"
        return f"{self.where}: {tag}: {self.what} -- {self.rule}"


@dataclass
class Layer:
    name: str
    paths: list[str]
    may_include: set[str]  # layer names; "*" is any layer
    line: int  # the table row's line in the document


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def error(self, where: str, what: str, rule: str, allowed: str = "") -> None:
        self.findings.append(Finding(where, what, rule, allowed))

    def failed(self) -> list[Finding]:
        return [f for f in self.findings if not f.allowed]


# --- the rules table ---------------------------------------------------------------------------

def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def ticked(text: str) -> list[str]:
    """The `code` spans of a cell (other words in it are commentary)."""
    return re.findall(r"`([^`]+)`", text)


def read_rules(root: Path, report: Report) -> list[Layer]:
    doc = root / DOC
    lines = doc.read_text(encoding="utf-8").splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == RULES_HEADING)
    except StopIteration:
        raise SystemExit(f"{DOC}: no '{RULES_HEADING}' section: the rules table lives there")
    layers: list[Layer] = []
    header = None
    for i in range(start + 1, len(lines)):
        l = lines[i]
        if l.startswith("## "):
            break
        if not l.lstrip().startswith("|"):
            if layers:
                break  # the first table of the section is the rules table
            continue
        row = cells(l)
        if header is None:
            header = [c.lower() for c in row]
            continue
        if set(l.replace("|", "").strip()) <= set("-: "):
            continue
        col = dict(zip(header, row))
        name = col.get("layer", "").strip("` *")
        paths = [p.rstrip("/") for p in ticked(col.get("paths", ""))]
        may = set(ticked(col.get("may include", "")))
        if not name or not paths:
            raise SystemExit(f"{DOC}:{i + 1}: a rules row needs a layer and its paths")
        may.add(name)
        layers.append(Layer(name, paths, may, i + 1))
    if not layers:
        raise SystemExit(f"{DOC}:{start + 1}: the '{RULES_HEADING}' section has no table")
    names = {l.name for l in layers}
    for l in layers:
        for m in l.may_include - names - {"*"}:
            raise SystemExit(f"{DOC}:{l.line}: layer '{l.name}' may include unknown layer '{m}'")
    # The rules themselves must be a hierarchy: no two layers may include each other.
    graph = {l.name: {m for m in l.may_include if m not in ("*", l.name)} for l in layers}
    for cyc in cycles(graph):
        report.error(f"{DOC}:{layers[0].line}",
                     "the rules table allows a cycle: " + " -> ".join(cyc),
                     "layers include downwards only")
    return layers


def layer_of(rel: str, layers: list[Layer]) -> Layer | None:
    """The layer whose path is the longest prefix (by path components) of rel."""
    best, best_len = None, -1
    for l in layers:
        for p in l.paths:
            if (rel == p or rel.startswith(p + "/")) and len(p) > best_len:
                best, best_len = l, len(p)
    return best


# --- graphs -------------------------------------------------------------------------------------

def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) per strongly connected component with a cycle (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[set[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # iterative, so deep graphs cannot overflow Python's stack
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]; counter[0] += 1
                    stack.append(nxt); on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    w = stack.pop(); on.discard(w); comp.add(w)
                    if w == node:
                        break
                if len(comp) > 1 or node in graph.get(node, ()):
                    sccs.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for comp in sccs:
        out.append(cycle_in(graph, comp))
    return out


def cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest cycle through the smallest node of a strongly connected component."""
    start = min(comp)
    prev = {start: None}
    queue = [start]
    for v in queue:
        for w in sorted(graph.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in comp and w not in prev:
                prev[w] = v
                queue.append(w)
    return [start, start]


# --- C++: includes ------------------------------------------------------------------------------

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
BLOCK_COMMENT_RE = re.compile(r"/\*.*?\*/", re.S)


def cxx_files(root: Path) -> list[str]:
    out = []
    for d in CXX_DIRS:
        base = root / d
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(n for n in dirnames if not n.startswith((".", "build")))
            for n in sorted(filenames):
                if Path(n).suffix in CXX_SUFFIXES:
                    out.append((Path(dirpath) / n).relative_to(root).as_posix())
    return out


def resolve(root: Path, rel: str, name: str, quoted: bool) -> str | None:
    here = [str(Path(rel).parent)] if quoted else []
    for base in here + INCLUDE_ROOTS:
        cand = os.path.normpath(os.path.join(base, name))
        if not cand.startswith("..") and (root / cand).is_file():
            return Path(cand).as_posix()
    return None


def check_includes(root: Path, layers: list[Layer], report: Report,
                   allowed: dict[tuple[str, str], str]) -> dict[str, set[str]]:
    """Checks every include against the rules; returns the folder graph of src/."""
    folders: dict[str, set[str]] = {}
    edge_at: dict[tuple[str, str], str] = {}
    used: set[tuple[str, str]] = set()
    for rel in cxx_files(root):
        src_layer = layer_of(rel, layers)
        if src_layer is None:
            report.error(rel, f"{rel} is in no layer", f"add its folder to the table in {DOC}")
        try:
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        # Block comments go (their line breaks stay, so line numbers do not move).
        text = BLOCK_COMMENT_RE.sub(lambda c: "\n" * c.group(0).count("\n"), text)
        for n, line in enumerate(text.splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            target = resolve(root, rel, m.group(2), m.group(1) == '"')
            if target is None:
                continue  # a system or third-party header
            dst_layer = layer_of(target, layers)
            where = f"{rel}:{n}"
            if src_layer is None:
                pass  # reported once above
            elif dst_layer is None:
                report.error(where, f'#include "{m.group(2)}" ({target}) is in no layer',
                             f"add its folder to the table in {DOC}")
            elif dst_layer.name not in src_layer.may_include and "*" not in src_layer.may_include:
                why = allowed.get((rel, target), "")
                if why:
                    used.add((rel, target))
                report.error(where,
                             f'#include "{m.group(2)}": {src_layer.name} -> {dst_layer.name}',
                             f"layer '{src_layer.name}' may include only: "
                             + ", ".join(sorted(src_layer.may_include))
                             + f" ({DOC}:{src_layer.line})", why)
            if rel.startswith("src/") and target.startswith("src/"):
                a, b = str(Path(rel).parent), str(Path(target).parent)
                if a != b:
                    folders.setdefault(a, set()).add(b)
                    edge_at.setdefault((a, b), where)
                folders.setdefault(b, set())
    for key in set(allowed) - used:
        report.notes.append(f"KNOWN_VIOLATIONS includes {key}: no longer happens; remove the entry")
    for cyc in cycles(folders):
        steps = [f"{a} -> {b} ({edge_at[(a, b)]})" for a, b in zip(cyc, cyc[1:])]
        report.error(edge_at[(cyc[0], cyc[1])], "folder cycle in src/: " + "; ".join(steps),
                     "the folder graph of src/ has no cycle")
    return folders


# --- C++: function lengths ------------------------------------------------------------------------

TOKEN_RE = re.compile(r"""
    (?P<nl>\n)
  | (?P<ws>[ \t\r\f\v]+)
  | (?P<lc>//[^\n]*)
  | (?P<bc>/\*.*?\*/)
  | (?P<raw>\bu8?R"(?P<delim>[^(\s]{0,16})\(|\b[LUu]?R"(?P<delim2>[^(\s]{0,16})\()
  | (?P<str>(?:u8|[LUu])?"(?:\\.|[^"\\\n])*")
  | (?P<chr>(?:u8|[LUu])?'(?:\\.|[^'\\\n])*')
  | (?P<num>\.?[0-9](?:[eEpP][+-]|[0-9A-Za-z_.'])*)
  | (?P<id>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op>::|->|<<=|>>=|==|!=|<=|>=|&&|\|\||\+\+|--|[-+*/%^&|<>!=]=?|.)
""", re.X | re.S)


def tokens(text: str) -> list[tuple[str, int]]:
    """(token, line) pairs with comments, strings, characters and preprocessor lines removed
    (strings become the token '""'). Line numbers count from 1."""
    out: list[tuple[str, int]] = []
    line = 1
    pos = 0
    at_line_start = True
    n = len(text)
    while pos < n:
        if at_line_start:
            # A preprocessor directive (with its continuation lines) is skipped whole.
            m = DIRECTIVE_RE.match(text, pos)
            if m:
                end = pos
                while True:
                    e = text.find("\n", end)
                    if e < 0:
                        e = n
                        break
                    # a comment that opens on the directive's line may run on
                    seg = text[end:e]
                    if "/*" in seg and "*/" not in seg[seg.rfind("/*"):]:
                        c = text.find("*/", end + seg.rfind("/*"))
                        end = n if c < 0 else c + 2
                        continue
                    if e > 0 and text[e - 1] == "\\":
                        end = e + 1
                        continue
                    break
                line += text.count("\n", pos, e)
                pos = e
                continue
        m = TOKEN_RE.match(text, pos)
        kind = m.lastgroup
        tok = m.group(0)
        if kind == "raw":  # R"delim( ... )delim": skipped to its end, across lines
            delim = m.group("delim") if m.group("delim") is not None else m.group("delim2")
            close = text.find(")" + delim + '"', m.end())
            end = n if close < 0 else close + len(delim) + 2
            out.append(('""', line))
            line += text.count("\n", pos, end)
            pos = end
            at_line_start = False
            continue
        if kind == "nl":
            line += 1
            at_line_start = True
        elif kind in ("ws", "lc"):
            pass
        elif kind == "bc":
            line += tok.count("\n")
        elif kind == "str":
            out.append(('""', line))
            at_line_start = False
        elif kind == "chr":
            out.append(("''", line))
            at_line_start = False
        else:
            out.append((tok, line))
            at_line_start = False
        pos = m.end()
    return out


DIRECTIVE_RE = re.compile(r"[ \t]*#")
NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof",
                 "decltype", "static_assert", "alignas", "noexcept", "requires", "throw"}
CLASS_KEYS = {"class", "struct", "union", "enum"}


@dataclass
class Function:
    name: str
    line: int  # the line of its opening brace
    body: int  # lines strictly between its braces


def strip_template(head: list[str]) -> list[str]:
    while head and head[0] == "template":
        depth, i = 0, 1
        while i < len(head):
            if head[i] == "<":
                depth += 1
            elif head[i] == ">":
                depth -= 1
                if depth == 0:
                    break
            elif head[i] == ">>":
                depth -= 2
                if depth <= 0:
                    break
            i += 1
        head = head[i + 1:]
    return head


ATTRIBUTES = {"__attribute__", "__declspec", "alignas", "__launch_bounds__"}


def strip_attributes(head: list[str]) -> list[str]:
    """Drops __attribute__((...)), alignas(...), __launch_bounds__(...) and [[...]]."""
    out: list[str] = []
    i = 0
    while i < len(head):
        t = head[i]
        if t in ATTRIBUTES and i + 1 < len(head) and head[i + 1] == "(":
            i = (matching(head, i + 1) or len(head)) + 1
            continue
        if t == "[" and i + 1 < len(head) and head[i + 1] == "[":
            depth = 0
            while i < len(head):
                depth += {"[": 1, "]": -1}.get(head[i], 0)
                i += 1
                if depth == 0:
                    break
            continue
        out.append(t)
        i += 1
    return out


def classify(head: list[str]) -> tuple[str, str]:
    """What a '{' at namespace or class scope opens, from the tokens since the last ';', '{' or
    '}' at that scope: ('namespace' | 'class' | 'function' | 'init' | 'other', function name)."""
    h = strip_attributes(strip_template(head))
    if "namespace" in h or (len(h) >= 2 and h[0] == "extern" and h[1] == '""'):
        return "namespace", ""
    depth = 0
    first_paren = -1
    class_at = -1
    eq_at = -1
    for i, t in enumerate(h):
        if t in ("(", "["):
            if t == "(" and depth == 0 and first_paren < 0:
                first_paren = i
            depth += 1
        elif t in (")", "]"):
            depth -= 1
        elif depth == 0 and t in CLASS_KEYS and first_paren < 0:
            class_at = i
        elif depth == 0 and t == "=" and (i == 0 or h[i - 1] != "operator") and first_paren < 0:
            eq_at = i
    if depth != 0:
        return "other", ""  # a brace inside parentheses: an argument, not a body
    if eq_at >= 0:
        return "other", ""  # an initializer (a lambda or a braced list) at namespace scope
    if class_at >= 0:
        return "class", ""
    if first_paren <= 0:
        return "other", ""
    # The parameter list: after 'operator()' it is the second parenthesis.
    p = first_paren
    if h[p - 1] == "operator" and p + 2 < len(h) and h[p + 1] == ")":
        p += 2
    j = p - 1
    if h[j] == ")" and j >= 2 and h[j - 1] == "(" and h[j - 2] == "operator":
        name, j = ["operator()"], j - 3
    elif j >= 1 and h[j - 1] == "operator":
        name, j = ["operator" + h[j]], j - 2
    elif re.match(r"[A-Za-z_]", h[j]) and h[j] not in NOT_FUNCTIONS:
        name, j = [h[j]], j - 1
    else:
        return "other", ""  # e.g. a lambda's '[](...)' or a call's result
    if j >= 0 and h[j] == "~":
        name, j = ["~"] + name, j - 1
    while j >= 1 and h[j] == "::" and re.match(r"[A-Za-z_]", h[j - 1]):
        name, j = [h[j - 1], "::"] + name, j - 2
    # A constructor's initializer list: ') : member(...), member{...} {'. Inside it the body's
    # brace always follows ')' or '}'; any other '{' is a member's braced initializer.
    close = matching(h, p)
    tail = h[close + 1:] if close is not None else []
    if ":" in tail and tail[-1] not in (")", "}"):
        return "init", ""
    return "function", "".join(name)


def matching(h: list[str], p: int) -> int | None:
    depth = 0
    for i in range(p, len(h)):
        if h[i] == "(":
            depth += 1
        elif h[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def functions(text: str) -> tuple[list[Function], str]:
    """Every function definition at namespace or class scope (lambdas and local classes count as
    part of the function they are in). Returns (functions, problem: '' when the braces match)."""
    toks = tokens(text)
    found: list[Function] = []
    scopes: list[str] = ["namespace"]  # the kind of each open brace at namespace/class level
    head: list[str] = []
    i = 0
    while i < len(toks):
        t, ln = toks[i]
        if t == "{":
            kind, name = classify(head)
            if kind in ("namespace", "class"):
                scopes.append(kind)
                head = []
                i += 1
                continue
            # skip to the matching brace
            depth, j = 0, i
            while j < len(toks):
                if toks[j][0] == "{":
                    depth += 1
                elif toks[j][0] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            if j >= len(toks):
                return found, f"line {ln}: unmatched '{{'"
            if kind == "function":
                found.append(Function(name, ln, toks[j][1] - ln - 1))
                head = []
            else:  # a member's braced initializer or an initializer: the head goes on
                head = head + ["{", "}"]
            i = j + 1
            continue
        if t == "}":
            if len(scopes) == 1:
                return found, f"line {ln}: unmatched '}}'"
            scopes.pop()
            head = []
        elif t == ";":
            head = []
        elif t == ":" and head and head[-1] in ("public", "private", "protected"):
            head = []
        else:
            head.append(t)
        i += 1
    if len(scopes) != 1:
        return found, "unclosed '{' at end of file"
    return found, ""


def check_functions(root: Path, report: Report,
                    allowed: dict[tuple[str, str], tuple[int, str]], listing: bool = False) -> None:
    used = set()
    for rel in cxx_files(root):
        if not rel.startswith("src/"):
            continue
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        found, problem = functions(text)
        if problem:
            report.error(rel, f"cannot match braces ({problem})",
                         "the function-length scanner reads every file in src/")
        for f in found:
            if listing:
                print(f"{f.body:5d}  {rel}:{f.line}  {f.name}")
            if f.body <= MAX_BODY_LINES:
                continue
            where = f"{rel}:{f.line}"
            key = (rel, f.name)
            limit, why = allowed.get(key, (0, ""))
            if why:
                used.add(key)
                if f.body > limit:
                    report.error(where, f"{f.name} has {f.body} body lines, more than the "
                                 f"{limit} it is allowed in KNOWN_VIOLATIONS",
                                 "an allowed function may shrink, not grow")
                    continue
            report.error(where, f"function {f.name} has {f.body} body lines",
                         f"functions in src/ have at most {MAX_BODY_LINES} (split it)", why)
    for rel in cxx_files(root):
        if rel.startswith(("src/", "include/")):
            n = (root / rel).read_text(encoding="utf-8", errors="replace").count("\n")
            if n >= MAX_FILE_LINES:
                report.error(rel, f"{n} lines", f"files are under {MAX_FILE_LINES} lines (split it)")
    for key in set(allowed) - used:
        report.notes.append(f"KNOWN_VIOLATIONS long_functions {key}: no longer over "
                            f"{MAX_BODY_LINES} lines; remove the entry")


# --- Python: import cycles ------------------------------------------------------------------------

def top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def check_python(root: Path, report: Report, allowed: dict[frozenset, str]) -> None:
    pkg_dir = root / PYTHON_PACKAGE
    if not pkg_dir.is_dir():
        return
    pkg = pkg_dir.name
    modules: dict[str, Path] = {}
    for p in sorted(pkg_dir.rglob("*.py")):
        parts = list(p.relative_to(pkg_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join([pkg] + parts)] = p
    graph: dict[str, set[str]] = {m: set() for m in modules}
    packages: dict[str, set[str]] = {}  # package -> the names its __init__.py binds at top level
    for mod, path in modules.items():
        if path.name == "__init__.py":
            try:
                packages[mod] = top_level_names(ast.parse(path.read_text(encoding="utf-8")))
            except SyntaxError:
                packages[mod] = set()
    edge_at: dict[tuple[str, str], str] = {}

    def add(src: str, dst: str, where: str) -> None:
        if dst in modules and dst != src:
            graph[src].add(dst)
            edge_at.setdefault((src, dst), where)

    for mod, path in modules.items():
        rel = path.relative_to(root).as_posix()
        is_pkg = path.name == "__init__.py"
        package = mod if is_pkg else mod.rpartition(".")[0]
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        except SyntaxError as e:
            report.error(f"{rel}:{e.lineno}", "cannot parse", "python/ubep must parse")
            continue
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    add(mod, a.name, where)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    if sub in modules:
                        add(mod, sub, where)  # 'from pkg import submodule'
                    elif target not in packages or a.name in packages[target]:
                        add(mod, target, where)  # a name the module (or package) defines
                    # else a submodule that is no .py file (the C++ extension, ubep._ubep)
    for cyc in cycles(graph):
        comp = frozenset(cyc)
        why = allowed.get(comp, "")
        steps = [f"{a} -> {b} ({edge_at[(a, b)]})" for a, b in zip(cyc, cyc[1:])]
        report.error(edge_at[(cyc[0], cyc[1])], "import cycle in python/ubep: " + "; ".join(steps),
                     "modules of python/ubep import each other in one direction only", why)
    found = {frozenset(c) for c in cycles(graph)}
    for comp in set(allowed) - found:
        report.notes.append(f"KNOWN_VIOLATIONS python_cycles {sorted(comp)}: gone; "
                            "remove the entry")


# --- the check ------------------------------------------------------------------------------------

def check(root: Path, known: dict, listing: bool = False) -> Report:
    report = Report()
    layers = read_rules(root, report)
    check_includes(root, layers, report, known["includes"])
    check_python(root, report, known["python_cycles"])
    check_functions(root, report, known["long_functions"], listing)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--functions", action="store_true",
                    help="list every function in src/ and its body length")
    ap.add_argument("--quiet", action="store_true", help="print only what fails")
    args = ap.parse_args()
    if args.self_test:
        return self_test(args.root)
    report = check(args.root, KNOWN_VIOLATIONS, args.functions)
    for f in report.findings:
        if not f.allowed or not args.quiet:
            print(f.line() + (f"  [{f.allowed}]" if f.allowed and not args.quiet else ""))
    for n in report.notes:
        print("note: " + n)
    bad = report.failed()
    if bad:
        print(f"check_layers: {len(bad)} violation(s); the rules: {DOC}, '{RULES_HEADING}'")
        return 1
    print(f"check_layers: ok ({len(report.findings)} known violation(s) allowed, listed in "
          "scripts/check_layers.py KNOWN_VIOLATIONS)")
    return 0


# --- self-test ------------------------------------------------------------------------------------

def self_test(root: Path) -> int:
    """Builds a small tree that breaks every rule once, checks each break is caught (and nothing
    else is), then that the same tree passes once each break is allow-listed."""
    failures = []

    def expect(cond: bool, what: str) -> None:
        if not cond:
            failures.append(what)

    def lines(n: int) -> str:
        return "\n".join(f"    x += {i};" for i in range(n))
    files = {
        # the real rules table, so the self-test also reads the document's table
        DOC: (root / DOC).read_text(encoding="utf-8"),
        "src/ep/engine.hpp": "#pragma once\nint ep_thing();\n",
        "src/protocol/wire.hpp": "#pragma once\n#include <vector>\n",
        # a lower layer including a higher one (backend -> ep), inside a comment too (ignored)
        "src/backend/data_path.hpp": '#pragma once\n#include "protocol/wire.hpp"\n'
                                     '/* #include "ep/engine.hpp" */\n#include "ep/engine.hpp"\n'
                                     '/*\n#include "ep/engine.hpp"\n*/\n',
        # a folder cycle inside one layer
        "src/transport/remote.hpp": '#pragma once\n#include "transport/mpi/mpi.hpp"\n',
        "src/transport/mpi/mpi.hpp": '#pragma once\n#include "transport/remote.hpp"\n',
        # the function scanner: 81 body lines fail, 80 pass; braces in strings, comments, raw
        # strings and character literals, an initializer list with braces, a lambda and a class
        "src/core/long.cpp": (
            'namespace ubep {\nnamespace {\n'
            'struct S {\n  int a{1};\n  int x = 0;\n'
            '  S() : a{2}, x(0) {\n' + lines(MAX_BODY_LINES + 1) + '\n  }\n};\n'
            '}  // namespace\n'
            'int too_long(int x) {\n' + lines(MAX_BODY_LINES + 1) + '\n  return x;\n}\n'
            'int just_fits(int x) {\n' + lines(MAX_BODY_LINES - 1) + '\n  return x;\n}\n'
            'static const char* k = "{{{"; // }}}\n'
            'const char* r = R"d(}})d"; char c = \'{\';\n'
            'auto lam = [](int v) { return v; };\n'
            'int ok(int x) { auto f = [&] { return x; }; /* } */ return f(); }\n'
            '}  // namespace ubep\n'),
        # a two-module Python import cycle, one side inside a function
        "python/ubep/__init__.py": "from . import a\n",
        "python/ubep/a.py": "from .b import thing\n",
        "python/ubep/b.py": "thing = 1\ndef f():\n    from . import a\n    return a\n",
        "python/ubep/c.py": "import ubep.a\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for rel, text in files.items():
            (t / rel).parent.mkdir(parents=True, exist_ok=True)
            (t / rel).write_text(text, encoding="utf-8")
        none = {"includes": {}, "python_cycles": {}, "long_functions": {}}
        rep = check(t, none)
        found_lines = [f.line() for f in rep.failed()]
        expect(any("src/backend/data_path.hpp:4:" in l and "backend -> ep" in l
                   for l in found_lines), "the backend -> ep include is caught at data_path.hpp:4")
        expect(not any(f"data_path.hpp:{n}:" in l for l in found_lines for n in (3, 6)),
               "an include in a comment is not read")
        expect(any("folder cycle" in l and "src/transport" in l and "src/transport/mpi" in l
                   for l in found_lines),
               "the src/transport <-> src/transport/mpi folder cycle is caught")
        expect(any("import cycle" in l and "ubep.a" in l and "ubep.b" in l for l in found_lines),
               "the ubep.a <-> ubep.b import cycle is caught")
        expect(any("function too_long has 82 body lines" in l for l in found_lines),
               "the 82-line function too_long is caught")
        expect(any("function S has 81 body lines" in l for l in found_lines),
               "the 81-line constructor with a braced initializer list is caught")
        expect(not any("just_fits" in l for l in found_lines), "an 80-line function passes")
        expect(len(found_lines) == 5,
               f"exactly 5 violations (got {len(found_lines)}: {found_lines})")
        found, problem = functions(files["src/core/long.cpp"])
        names = [f.name for f in found]
        expect(problem == "", f"the scanner matches every brace ({problem})")
        expect(names == ["S", "too_long", "just_fits", "ok"], f"the functions found: {names}")
        # allow-listed, the same tree passes; a listed function that grows fails again
        known = {
            "includes": {("src/backend/data_path.hpp", "src/ep/engine.hpp"): "self-test"},
            "python_cycles": {frozenset({"ubep.a", "ubep.b"}): "self-test"},
            "long_functions": {("src/core/long.cpp", "too_long"): (MAX_BODY_LINES + 2, "self-test"),
                               ("src/core/long.cpp", "S"): (MAX_BODY_LINES + 1, "self-test")},
        }
        rep = check(t, known)
        left = [f.line() for f in rep.failed()]
        expect(left == [l for l in found_lines if "folder cycle" in l],
               f"allow-listed findings pass, the rest still fails (left: {left})")
        known["long_functions"][("src/core/long.cpp", "too_long")] = (MAX_BODY_LINES + 1, "grew")
        rep = check(t, known)
        expect(any("more than the" in f.line() for f in rep.failed()),
               "an allow-listed function that grows fails")
    for f in failures:
        print("self-test FAILED: " + f)
    if not failures:
        print("check_layers self-test: ok (a bad include, a folder cycle, a Python import cycle and "
              "an 81+-line function are each caught)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
