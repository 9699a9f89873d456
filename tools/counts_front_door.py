"""Counts of issue 53 (parallelize is the front door), measured from the source (ast) like tools/counts.py.

Each check is a function of the parsed tree {path relative to the root: ast.Module} for the files under
minidist/, returning the places it found; counts.py lists them in CHECKS with their targets.
"""

from __future__ import annotations

import ast
from pathlib import Path

TRANSFORMS = {"tensor_parallel", "context_parallel", "expert_parallel"}


def _where(path: Path, node: ast.AST) -> str:
    name = getattr(node, "name", "")
    return f"{path}:{node.lineno}" + (f" {name}" if name else "")


def _definitions(tree: ast.Module):
    """Every function and method definition of a module (nested ones included)."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _called(node: ast.AST) -> set[str]:
    """Names of the functions a definition calls: f(...) and x.f(...)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            out.add(getattr(n.func, "id", getattr(n.func, "attr", "")))
    return out


def model_splitters(trees) -> list[str]:
    """Definitions outside the transforms' own folders that apply a transform (tensor_parallel,
    context_parallel, expert_parallel) to a model: each is a way of splitting a GPT for a mesh."""
    found = []
    for path, tree in trees.items():
        if path.parts[:2] != ("minidist", "parallel") or path.parts[2] in ("tensor", "context", "expert"):
            continue
        found += [_where(path, d) for d in _definitions(tree) if _called(d) & TRANSFORMS]
    return found


# The near-copies issue 53 names, as (file, name) pairs: a pair counts while both halves exist.
NEAR_COPIES = [
    (("parallel/data", "sum_partial"), ("collectives/partial.py", "sum_partial_gradients")),
    (("parallel", "LossShare"), ("parallel", "ShardWeightedLoss")),
    (("parallel/tensor", "MegatronMLP"), ("parallel/tensor", "TensorParallelMLP")),
    (("parallel", "switch_units"), ("parallel", "split_gpt")),
]


def _defines(trees, under: str, name: str) -> str | None:
    for path, tree in trees.items():
        if not path.as_posix().startswith("minidist/" + under):
            continue
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name:
                return _where(path, n)
    return None


def near_copy_pairs(trees) -> list[str]:
    """The near-copy pairs of issue 53 whose two halves both still exist."""
    found = []
    for (under_a, a), (under_b, b) in NEAR_COPIES:
        one, other = _defines(trees, under_a, a), _defines(trees, under_b, b)
        if one and other:
            found.append(f"{one} ~ {other}")
    return found


def shims_and_aliases(trees) -> list[str]:
    """Second names for one thing in minidist/: an import of a minidist name under another name
    (``from .x import A as B``), a module-level rebinding of a class or function (``B = A``), a function
    named like a class (CamelCase: a constructor in disguise), and a module that only re-exports. A private
    name (``as _x``) and the command line's names for what it dispatches to are not second names."""
    found = []
    for path, tree in trees.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("minidist")) \
                    and path.name != "__main__.py":       # (the command line names what it dispatches to)
                found += [f"{path}:{n.lineno} {a.name} as {a.asname}" for a in n.names
                          if a.asname and a.asname != a.name and not a.asname.startswith("_")]
        for n in tree.body:
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id[:1].isupper() \
                    and all(isinstance(t, ast.Name) and t.id != n.value.id for t in n.targets):
                found.append(f"{path}:{n.lineno} {ast.unparse(n)}")
            if isinstance(n, ast.FunctionDef) and n.name[:1].isupper():
                found.append(_where(path, n))
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        reexport = body and all(isinstance(n, (ast.Import, ast.ImportFrom)) or
                                isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__"
                                for n in body)
        if reexport and path.name != "__init__.py":
            found.append(f"{path}: only re-exports")
    return found


def loose_root_modules(trees) -> list[str]:
    """Modules directly under minidist/ (a package's root should hold only __init__ and __main__)."""
    return [str(path) for path in trees if len(path.parts) == 2 and path.parts[0] == "minidist"]
