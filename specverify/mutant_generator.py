"""Mutants made mechanically from the AST of `specverify/` (issue 24): the unbiased half of the
zoo. The hand-written zoo (`tests/mutants/*.toml`) holds the bugs we thought of; these are the
small slips a mutation-testing tool makes everywhere, by standard operators:

- relational: `<` / `<=`, `>` / `>=`, `==` / `!=`, `is` / `is not`, `in` / `not in`;
- arithmetic: `+` / `-`, `*` / `/`, `//` / `/` (binary and augmented);
- constant: 0 / 1, n / n + 1 and n - 1, -1 / 0, a float bound times (1 + 1e-9) or (1 - 1e-9),
  `True` / `False`;
- index: `[-1]` / `[0]`;
- boolean: `and` / `or`, one operand of an `and` / `or` dropped, `not` removed;
- swap-args: a call's two adjacent positional arguments of the same kind (two names, two
  constants of one type) swapped;
- remove-statement: an assignment, an augmented (in-place) update, an in-place method call
  (`x.copy_(...)`), a `raise` replaced by `pass`;
- return-constant: `return EXPR` as `return None`.

Each site becomes an ordinary zoo record (file, exact target text found once, replacement), so the
harness of `specverify/mutants.py` plants and runs it unchanged. A target is the source lines the
mutated node spans, widened line by line until it occurs once in its file. Docstrings, string
constants, f-strings, annotations, imports and decorators are never mutated.

Sampling is seeded: `sample(sites, per_module, seed)` draws per module (the first component of the
path under `specverify/`) with `random.Random(seed)`, so a seed names the same mutants everywhere;
`sample_files(sites, files, per_file, seed)` draws per file instead (a campaign over one change's files).
A mutant's id (`gen-...-<crc>`) hashes its file, target and replacement: the triage file
(`tests/mutants/equivalents.toml`) refers to mutants by it.
"""

from __future__ import annotations

import ast
import dataclasses
import random
import zlib
from pathlib import Path

# The modules the generator mutates, by the first component of their path under specverify/;
# the harness, the generator, the command line and the conformance package (test machinery
# shipped to users, with its own meta tests) stay out.
MODULES = ("ops", "kernels", "engine", "models", "protocol", "golden", "matrix", "spec", "dtypes", "platform",
           "validation")

SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
         ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
         ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div}
FLOAT_NUDGE = 1e-9


@dataclasses.dataclass(frozen=True)
class Site:
    """One generated mutant: in `file`, `target` (found once) becomes `replacement`."""

    file: str            # relative to the repository root
    line: int            # the mutated node's first line
    operator: str        # relational, arithmetic, constant, index, boolean, not, swap-args, ...
    target: str
    replacement: str

    @property
    def module(self) -> str:
        return module_of(self.file)

    @property
    def ident(self) -> str:
        """A stable id: the module, file stem, line, operator and a hash of the edit."""
        crc = zlib.crc32(f"{self.file}\0{self.target}\0{self.replacement}".encode("utf-8"))
        stem = Path(self.file).stem.replace("_", "-").lower()
        return f"gen-{self.module}-{stem}-l{self.line}-{self.operator}-{crc:08x}"


def module_of(rel: str) -> str:
    """"specverify/engine/prefill.py" -> "engine"; "specverify/ops.py" -> "ops"."""
    parts = Path(rel).parts
    return Path(parts[1]).stem if len(parts) > 1 else Path(rel).stem


def source_files(root: Path) -> list[str]:
    """The files of the mutated modules, sorted (relative to root)."""
    pkg = root / "specverify"
    out = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if module_of(rel) in MODULES and "__pycache__" not in rel:
            out.append(rel)
    return out


# ----------------------------------------------------------------------------------------------
# finding the sites of one file


class _Finder(ast.NodeVisitor):
    """Collects (node, operator, replacement source of the node) over one module."""

    def __init__(self):
        self.edits: list[tuple[ast.AST, str, str]] = []
        self._skip_depth = 0

    # never mutated: docstrings and other strings, annotations, imports, decorators, f-strings
    def _visit_skipping(self, node):
        self._skip_depth += 1
        self.generic_visit(node)
        self._skip_depth -= 1

    visit_JoinedStr = _visit_skipping
    visit_Import = _visit_skipping
    visit_ImportFrom = _visit_skipping

    def visit_FunctionDef(self, node):
        for d in node.decorator_list:
            self._visit_skipping(d)
        self._args(node.args)
        if node.returns is not None:
            self._visit_skipping(node.returns)
        self._body(node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        for d in node.decorator_list:
            self._visit_skipping(d)
        for b in node.bases + [k.value for k in node.keywords]:
            self.visit(b)
        self._body(node.body)

    def _args(self, args: ast.arguments):
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None and a.annotation is not None:
                self._visit_skipping(a.annotation)
        for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(d)

    def _body(self, body):
        start = 1 if body and _is_docstring(body[0]) else 0
        for stmt in body[start:]:
            self.visit(stmt)

    def visit_Module(self, node):
        self._body(node.body)

    def visit_AnnAssign(self, node):
        self._visit_skipping(node.annotation)
        if node.value is not None:
            self.visit(node.value)
            self._add(node, "remove-statement", "pass")

    def _add(self, node, operator: str, replacement: str):
        if not self._skip_depth:
            self.edits.append((node, operator, replacement))

    # -- operators -----------------------------------------------------------------------------
    def visit_Compare(self, node):
        for i, op in enumerate(node.ops):
            if type(op) in SWAPS:
                ops = list(node.ops)
                ops[i] = SWAPS[type(op)]()
                self._add(node, "relational", ast.unparse(ast.Compare(node.left, ops, node.comparators)))
        self.generic_visit(node)

    def visit_BinOp(self, node):
        if type(node.op) in SWAPS:
            self._add(node, "arithmetic", ast.unparse(ast.BinOp(node.left, SWAPS[type(node.op)](), node.right)))
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        if type(node.op) in SWAPS:
            self._add(node, "arithmetic", ast.unparse(ast.AugAssign(node.target, SWAPS[type(node.op)](), node.value)))
        self._add(node, "remove-statement", "pass")
        self.generic_visit(node)

    def visit_Assign(self, node):
        self._add(node, "remove-statement", "pass")
        self.generic_visit(node)

    def visit_Raise(self, node):
        self._add(node, "remove-statement", "pass")
        self.generic_visit(node)

    def visit_Expr(self, node):
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr.endswith("_") \
                and not call.func.attr.startswith("_"):
            self._add(node, "remove-statement", "pass")      # an in-place update: x.copy_(y), t.add_(1)
        self.generic_visit(node)

    def visit_Return(self, node):
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            self._add(node, "return-constant", "return None")
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self._add(node, "boolean", ast.unparse(ast.BoolOp(other, node.values)))
        for i in range(len(node.values)):
            rest = node.values[:i] + node.values[i + 1:]
            kept = rest[0] if len(rest) == 1 else ast.BoolOp(node.op, rest)
            self._add(node, "boolean", f"({ast.unparse(kept)})")
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        if isinstance(node.op, ast.Not):
            self._add(node, "not", f"({ast.unparse(node.operand)})")
        elif isinstance(node.op, ast.USub) and _int_constant(node.operand) == 1:
            self._add(node, "constant", "0")
            return                                           # the 1 inside is not mutated again
        self.generic_visit(node)

    def visit_Subscript(self, node):
        index = node.slice
        if _int_constant(index) == 0:
            self._add(index, "index", "-1")
        elif isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and _int_constant(index.operand) == 1:
            self._add(index, "index", "0")
            self.visit(node.value)
            return
        self.generic_visit(node)

    def visit_Constant(self, node):
        v = node.value
        if isinstance(v, bool):
            self._add(node, "constant", repr(not v))
        elif isinstance(v, int):
            for w in ({0: (1,), 1: (0,)}.get(v) or (v + 1, v - 1)):
                self._add(node, "constant", repr(w))
        elif isinstance(v, float) and v != 0.0 and v == v and abs(v) != float("inf"):
            for factor in (1 + FLOAT_NUDGE, 1 - FLOAT_NUDGE):
                w = v * factor
                if w != v:
                    self._add(node, "constant", repr(w))

    def visit_Call(self, node):
        args = node.args
        for i in range(len(args) - 1):
            a, b = args[i], args[i + 1]
            same = ((isinstance(a, ast.Name) and isinstance(b, ast.Name) and a.id != b.id)
                    or (isinstance(a, ast.Constant) and isinstance(b, ast.Constant)
                        and type(a.value) is type(b.value) and a.value != b.value))
            if same and not any(isinstance(x, ast.Starred) for x in args):
                swapped = list(args)
                swapped[i], swapped[i + 1] = b, a
                self._add(node, "swap-args", ast.unparse(ast.Call(node.func, swapped, node.keywords)))
        self.generic_visit(node)


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _int_constant(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    return None


def sites_of(root: Path, rel: str) -> list[Site]:
    """Every mutant site of one file, in source order (targets unique in the file; each mutated
    file still compiles)."""
    text = (root / rel).read_text(encoding="utf-8")
    tree = ast.parse(text)
    finder = _Finder()
    finder.visit(tree)
    lines = text.splitlines(keepends=True)
    units = _top_level_spans(tree)
    out, seen = [], set()
    for node, operator, new in finder.edits:
        site = _site(rel, text, lines, units, node, operator, new)
        if site is None or (site.target, site.replacement) in seen:
            continue
        seen.add((site.target, site.replacement))
        out.append(site)
    return out


def _top_level_spans(tree: ast.Module) -> list[tuple[int, int]]:
    """The 0-based first and last line of each top-level statement, its decorators included."""
    spans = []
    for stmt in tree.body:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", ())])
        spans.append((first - 1, stmt.end_lineno - 1))
    return spans


def _compiles(rel: str, lines: list[str], units: list[tuple[int, int]], before: int, after: int, target: str,
              mutated: str) -> bool:
    """Whether the file compiles with `target` (its lines before..after) replaced by `mutated`.
    A syntax error an edit makes stays inside the top-level statements its lines touch (a function
    or class is a whole unit for every check the compiler makes: `return` outside a function,
    `nonlocal`, `await`), so only they are compiled, with any lines between them: compiling the
    whole file for every site made listing the sites a compile of the tree per site."""
    touched = [(a, b) for a, b in units if a <= after and b >= before]
    first = min([before] + [a for a, _ in touched])
    last = max([after] + [b for _, b in touched])
    unit = "".join(lines[first:last + 1])
    try:
        compile(unit.replace(target, mutated, 1), rel, "exec")
    except SyntaxError:
        return False
    return True


def _site(rel: str, text: str, lines: list[str], units: list[tuple[int, int]], node, operator: str,
          new: str) -> Site | None:
    first, last = node.lineno - 1, node.end_lineno - 1
    block = "".join(lines[first:last + 1]).encode("utf-8")
    start = node.col_offset
    end = len("".join(lines[first:last]).encode("utf-8")) + node.end_col_offset
    if operator == "remove-statement" or operator == "return-constant":
        if node.col_offset != len(lines[first]) - len(lines[first].lstrip()):
            return None                                      # a statement sharing its line (a; b)
    mutated = (block[:start] + new.encode("utf-8") + block[end:]).decode("utf-8")
    target = block.decode("utf-8")
    if mutated == target:
        return None
    before, after = first, last
    while text.count(target.rstrip("\n")) != 1:             # widen until it occurs once (as stored)
        if before == 0 and after == len(lines) - 1 or after - before > 8:
            return None
        if before > 0:
            before -= 1
            target, mutated = lines[before] + target, lines[before] + mutated
        if text.count(target.rstrip("\n")) != 1 and after < len(lines) - 1:
            after += 1
            target, mutated = target + lines[after], mutated + lines[after]
    if "'''" in target or "'''" in mutated or target.endswith("\\\n"):
        return None                                          # not expressible as a toml literal string
    if not _compiles(rel, lines, units, before, after, target, mutated):
        return None
    return Site(rel, node.lineno, operator, target.rstrip("\n"), mutated.rstrip("\n"))


def all_sites(root: Path) -> list[Site]:
    return [s for rel in source_files(root) for s in sites_of(root, rel)]


def sample(sites: list[Site], per_module: int, seed: int) -> list[Site]:
    """`per_module` sites of each module (all of a smaller one), drawn with random.Random(seed)
    in module order; the result is sorted by file and line."""
    return _draw(sites, MODULES, lambda s: s.module, per_module, seed)


def sample_files(sites: list[Site], files: list[str], per_file: int, seed: int) -> list[Site]:
    """`per_file` sites of each of `files` (all of a smaller one), drawn with random.Random(seed)
    in the order of `files`: a campaign over the files one change touched. The result is sorted
    by file and line."""
    return _draw(sites, list(dict.fromkeys(files)), lambda s: s.file, per_file, seed)


def _draw(sites: list[Site], groups, group_of, per_group: int, seed: int) -> list[Site]:
    rng = random.Random(seed)
    chosen = []
    for group in groups:
        pool = [s for s in sites if group_of(s) == group]
        chosen += pool if len(pool) <= per_group else rng.sample(pool, per_group)
    return sorted(chosen, key=lambda s: (s.file, s.line, s.ident))
