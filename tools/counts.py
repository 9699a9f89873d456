"""Counts of duplication in minidist/, measured from the source (ast), each against its target.

    python tools/counts.py          prints the table; exits 1 if a count exceeds its target
    python tools/counts.py --static  the counts read from the source only (no cluster runs)

Each check is a function of the parsed tree returning the places it found (printed with -v); the count is
their number. Add a check with one function and one line in CHECKS.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from counts_front_door import (  # noqa: E402
    loose_root_modules,
    model_splitters,
    near_copy_pairs,
    shims_and_aliases,
)

ROOT = Path(__file__).resolve().parent.parent


def sources(root: Path = ROOT) -> dict[Path, ast.Module]:
    """{path relative to root: its parsed source} for every .py file under root/minidist."""
    return {path.relative_to(root): ast.parse(path.read_text(), str(path))
            for path in sorted((root / "minidist").rglob("*.py"))}


def where(path: Path, node: ast.AST) -> str:
    name = getattr(node, "name", "")
    return f"{path}:{node.lineno}" + (f" {name}" if name else "")


def tops(trees):
    """(path, top-level class or function) for every file."""
    for path, tree in trees.items():
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                yield path, node


def attributes(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def gpt_chains(trees) -> list[str]:
    """Definitions that run a GPT's input themselves (call ``x.tok_emb.forward`` or ``x.tok_emb(...)``, or
    index ``x.tok_emb.weight.data``): each is the start of its own forward/backward chain."""
    def embeds(n) -> bool:
        if isinstance(n, ast.Call):
            f = n.func
            return getattr(f, "attr", "") == "tok_emb" or \
                getattr(f, "attr", "") == "forward" and getattr(f.value, "attr", "") == "tok_emb"
        return isinstance(n, ast.Subscript) and ast.unparse(n.value).endswith("tok_emb.weight.data")

    return [where(path, top) for path, top in tops(trees) if any(embeds(n) for n in ast.walk(top))]


def blocks_by_hand(trees) -> list[str]:
    """Classes wiring a transformer block's residuals themselves (they use self.ln1 and self.ln2)."""
    found = []
    for path, top in tops(trees):
        own = {n.attr for n in ast.walk(top) if isinstance(n, ast.Attribute)
               and isinstance(n.value, ast.Name) and n.value.id == "self"}
        if isinstance(top, ast.ClassDef) and {"ln1", "ln2"} <= own:
            found.append(where(path, top))
    return found


def grid_arithmetic(trees) -> list[str]:
    """Definitions mapping ranks to coordinates: divmod of a rank, a split colour computed from
    coordinates, or a method named coords / stride that multiplies or divides (not one that delegates)."""
    found = []
    for path, top in tops(trees):
        for n in ast.walk(top):
            divmod_rank = isinstance(n, ast.Call) and getattr(n.func, "id", "") == "divmod" and \
                "rank" in ast.unparse(n.args[0])
            colour = n.args[0] if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "split" and \
                n.args else next((k.value for k in getattr(n, "keywords", []) if k.arg == "color"), None)
            named = isinstance(n, ast.FunctionDef) and n.name in ("coords", "stride") and any(
                isinstance(op, (ast.Mult, ast.FloorDiv, ast.Mod)) for op in ast.walk(n))
            if divmod_rank or isinstance(colour, ast.BinOp) or named:
                found.append(where(path, top))
                break
    return found


def pipeline_executors(trees) -> list[str]:
    """Classes in parallel/pipeline/ with a train_step (an executor of a schedule); a subclass of Pipeline
    (PipeDream: the executor with a schedule and attachments of its own) runs Pipeline's loop, not one."""
    return [where(path, top) for path, top in tops(trees) if "pipeline" in path.parts
            and isinstance(top, ast.ClassDef)
            and not any(getattr(base, "id", "") == "Pipeline" for base in top.bases)
            and any(isinstance(f, ast.FunctionDef) and f.name == "train_step" for f in top.body)]


def copy_then_sum(trees) -> list[str]:
    """``<x>.grad.copy()`` in parallel/: a gradient kept aside to sum a replica's afterwards."""
    return [where(path, n) for path, tree in trees.items() if "parallel" in path.parts
            for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "copy" and getattr(n.func.value, "attr", "") == "grad"]


def hand_rolled_allreduces(trees) -> list[str]:
    """Calls of data/buckets.allreduce_gradients outside data/: a strategy summing gradients by hand."""
    return [where(path, n) for path, tree in trees.items() if "data" not in path.parts
            for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", "")) == "allreduce_gradients"]


def memory_trackers(trees) -> list[str]:
    """Modules keeping memory books: one defining a Memory* class (a ledger, its recorder), or a ``memory``
    attribute or property that is a list of (time, bytes) samples of its own, not the one MemoryLedger."""
    def books(n) -> bool:
        if isinstance(n, ast.ClassDef):
            return "Memory" in n.name
        if isinstance(n, ast.FunctionDef):
            return n.name == "memory" and "list" in ast.unparse(n.returns or n)
        if not isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            return False
        targets = n.targets if isinstance(n, ast.Assign) else [n.target]
        kind = ast.unparse(n.annotation) if isinstance(n, ast.AnnAssign) else ""
        return any(getattr(t, "attr", "") == "memory" for t in targets) and (
            kind.startswith("list") or isinstance(n.value, (ast.List, ast.ListComp)))

    return [where(path, next(n for n in ast.walk(tree) if books(n))) for path, tree in trees.items()
            if any(books(n) for n in ast.walk(tree))]


def clock_calls(trees) -> list[tuple[Path, ast.Call]]:
    """Calls ``<x>.compute(...)`` / ``<x>.elapse(...)`` (a communicator's clock charged) outside cluster/."""
    return [(path, n) for path, tree in trees.items() if path.parts[1] != "cluster" for n in ast.walk(tree)
            if isinstance(n, ast.Call) and getattr(n.func, "attr", "") in ("compute", "elapse")]


def compute_charge_apis(trees) -> list[str]:
    """Modules outside cluster/ that charge the simulated clock themselves (the one API: sim/compute.py)."""
    return sorted({str(path) for path, _ in clock_calls(trees)})


def strategy_clock_calls(trees) -> list[str]:
    """Direct clock charges in parallel/ (a strategy charges through minidist.sim.compute)."""
    return [where(path, n) for path, n in clock_calls(trees) if "parallel" in path.parts]


def module_of(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, tree: ast.Module, modules: set[str]) -> set[str]:
    """The minidist modules ``path`` imports, at any depth (lazy imports inside functions too)."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                anchor = package.split(".")[:len(package.split(".")) - n.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from package import submodule` imports the submodule's file
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in n.names}
    return {m for m in out if m in modules}


def import_cycles(trees) -> list[str]:
    """Cycles of file-level imports in minidist/ (strongly connected groups of more than one file)."""
    modules = {module_of(p): p for p in trees}
    graph = {m: imports(p, trees[p], set(modules)) - {m} for m, p in modules.items()}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(m):                                   # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        on.add(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group = []
            while not group or group[-1] != m:
                group.append(stack.pop())
                on.discard(group[-1])
            if len(group) > 1:
                cycles.append(" <-> ".join(sorted(group)))

    sys.setrecursionlimit(10000)
    for m in sorted(graph):
        if m not in index:
            visit(m)
    return cycles


STRATEGIES = ("asynchronous", "compression", "context", "data", "expert", "pipeline", "rnn", "spatial",
              "tensor")


def folder_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "parallel" and parts[2] in STRATEGIES else None


def strategy_imports(trees) -> list[str]:
    """Pairs of strategy folders of parallel/ where one imports the other (the design allows them to meet
    only through the mesh, nn and the runner)."""
    modules = {module_of(p): p for p in trees}
    pairs = set()
    for m, p in modules.items():
        for n in imports(p, trees[p], set(modules)):
            a, b = folder_of(m), folder_of(n)
            if a and b and a != b:
                pairs.add(f"{a} -> {b}")
    return sorted(pairs)


def folder_cycles(trees) -> list[str]:
    """Pairs of strategy folders that import each other (tensor <-> context)."""
    pairs = set(strategy_imports(trees))
    edges = [pair.split(" -> ") for pair in pairs]
    return sorted(f"{a} <-> {b}" for a, b in edges if a < b and f"{b} -> {a}" in pairs)


COLLECTIVES = ("naive", "parameter_server", "ring", "tree", "recursive_doubling", "rabenseifner", "pairwise",
               "alltoall")


def collective_costs(trees) -> list[str]:
    """Files that compute a collective's time from α and β, for the collective written in most files: a
    function doing arithmetic on alpha/beta (or calling its file's function that does) that names it
    (``_ring``, ``ring_allreduce…``, "ring" not as an argument or a default) or walks a schedule's ``.steps``
    (every collective whose rounds a ``_<name>`` builds)."""
    def ab(n) -> bool:
        return getattr(n, "id", getattr(n, "attr", "")) in ("alpha", "beta")

    built = {name for _, tree in trees.items() for f in ast.walk(tree)
             if isinstance(f, ast.FunctionDef) for name in COLLECTIVES if f.name == f"_{name}"}
    places = {name: set() for name in COLLECTIVES}
    for path, tree in trees.items():
        functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
        pricers = {f.name for f in functions if any(isinstance(n, ast.BinOp) and (ab(n.left) or ab(n.right))
                                                    for n in ast.walk(f))}
        while True:                                  # and the functions calling them, by name
            calls = {f.name for f in functions if any(isinstance(n, ast.Call) and getattr(n.func, "id", "")
                                                      in pricers for n in ast.walk(f))}
            if calls <= pricers:
                break
            pricers |= calls
        for f in (f for f in functions if f.name in pricers):
            arguments = {id(a) for c in ast.walk(f) if isinstance(c, ast.Call)
                         for a in c.args + [k.value for k in c.keywords]}
            arguments |= {id(d) for d in f.args.defaults + f.args.kw_defaults}
            named = {n.value for n in ast.walk(f) if isinstance(n, ast.Constant) and id(n) not in arguments}
            walks = any(isinstance(n, ast.Attribute) and n.attr == "steps" for n in ast.walk(f))
            for name in COLLECTIVES:
                if name in named or f.name == f"_{name}" or f"{name}_allreduce" in f.name or \
                        walks and name in built:
                    places[name].add(str(path))
    worst = max(COLLECTIVES, key=lambda name: len(places[name]))
    return [f"{worst}: {place}" for place in sorted(places[worst])]


def classroom_files(trees) -> list[str]:
    """Files of the classroom inside minidist/ (they belong in minidist_course/): an ``exercises`` folder,
    the book, or a module that reads the solution markers (a string holding "BEGIN SOLUTION")."""
    return [str(path) for path, tree in trees.items()
            if "exercises" in path.parts or path.name.startswith("book")
            or any(isinstance(n, ast.Constant) and "BEGIN SOLUTION" in str(n.value) for n in ast.walk(tree))]


def copies_to_price(trees) -> list[str]:
    """Definitions in parallel/ or plan/ that keep a deep copy of (part of) the model only to price a split
    one: a ``deepcopy`` call and a lambda that counts FLOPs (calls ``flops`` or ``count``) in the same
    top-level definition. A split module prices itself (its own ``flops``)."""
    def counts_flops(n) -> bool:
        called = {getattr(c.func, "attr", getattr(c.func, "id", ""))
                  for c in ast.walk(n) if isinstance(c, ast.Call)}
        return isinstance(n, ast.Lambda) and bool(called & {"flops", "count"})

    return [where(path, top) for path, top in tops(trees) if path.parts[1:2] in (("parallel",), ("plan",))
            and "deepcopy" in attributes(top) | {getattr(n, "id", "") for n in ast.walk(top)}
            and any(counts_flops(n) for n in ast.walk(top))]


def lines(under: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in under.rglob("*.py"))


# (name, measure, target): a count above its target fails; target None: printed only
CHECKS = [
    ("GPT forward/backward chains", gpt_chains, 1),
    ("transformer blocks wired by hand", blocks_by_hand, 1),
    ("rank <-> coordinate arithmetic sites", grid_arithmetic, 1),
    ("pipeline executors", pipeline_executors, 1),
    ("copy-then-sum gradient sites", copy_then_sum, 0),
    ("hand-rolled data-axis allreduces", hand_rolled_allreduces, 0),
    ("memory trackers", memory_trackers, 1),
    ("file-level import cycles", import_cycles, 0),
    ("strategy folders importing each other", folder_cycles, 0),
    ("imports between strategy folders", strategy_imports, None),
    ("places a collective's cost is written", collective_costs, 1),
    ("classroom files inside minidist/", classroom_files, 0),
    ("compute charge APIs", compute_charge_apis, 1),
    ("direct clock calls in strategies", strategy_clock_calls, 0),
    ("model copies kept to price a split one", copies_to_price, 0),
    ("functions that split a model for a mesh", model_splitters, 1),
    ("near-copy pairs named in issue 53", near_copy_pairs, 0),
    ("shims and aliases", shims_and_aliases, 0),
    ("modules loose at minidist/'s root", loose_root_modules, 2),
]


PARALLEL_LINES = 7539      # issue 53: 8,700 -> 7,400, every chapter kept; a ratchet since (+12: issue 58's
                           # argument checks at the call, in sync, pipedream, weight_stash and mesh; +127:
                           # issue 57's new strategy, parallel/data/delayed.py, and its hooks)


def counts(root: Path = ROOT) -> dict[str, list[str]]:
    """{check's name: the places it found} for the tree at root."""
    trees = sources(root)
    return {name: measure(trees) for name, measure, _ in CHECKS}


def main(argv: list[str], root: Path | None = None) -> int:
    root = ROOT if root is None else root
    trees, verbose, failed = sources(root), "-v" in argv, 0
    print(f"{'check':40} {'count':>5} {'target':>6}")
    for name, measure, target in CHECKS:
        found = measure(trees)
        over = target is not None and len(found) > target
        failed += over
        print(f"{name:40} {len(found):5d} {'-' if target is None else target:>6}{'  OVER' if over else ''}")
        for place in found if verbose or over else []:
            print(f"    {place}")
    parallel_lines = lines(root / "minidist" / "parallel")
    over = parallel_lines > PARALLEL_LINES
    failed += over
    flag = "  OVER" if over else ""
    print(f"{'lines of minidist/parallel/':40} {parallel_lines:5d} {PARALLEL_LINES:>6}{flag}")
    classroom = sum(len((root / path).read_text().splitlines()) for path in classroom_files(trees))
    print(f"{'lines of the classroom inside minidist/':40} {classroom:5d}")
    if root == ROOT and "--static" not in argv:     # measured by running the package (tools/*.py)
        for name, found, target in runtime_counts():
            over = len(found) > target
            failed += over
            print(f"{name:40} {len(found):5d} {target:>6}{'  OVER' if over else ''}")
            for place in found if verbose or over else []:
                print(f"    {place}")
    return 1 if failed else 0


STEP_FILES_TARGET = 8      # issue 53: files of parallel/ and the step runner a data × tensor step adds


def runtime_counts() -> list[tuple[str, list[str], int]]:
    """Counts measured by tracing steps on the simulated cluster: (name, the places found, target).

    Trainer engines: for each pipeline size, the executors beyond the first that parallelize's layouts
    ran (tools/engines.py; target 0: one engine per pipeline size). Step files: the files under
    minidist/parallel/ and the step runner that the second step of a data 2 × tensor 2 GPT enters and one
    process's step does not (tools/step_files.py, the path lessons/ONE_GRADIENT.md walks)."""
    import engines
    import step_files

    extra = [f"pipeline size {size}: {', '.join(sorted(names))}"
             for size, names in sorted(engines.engines().items()) if len(names) > 1]
    one = step_files.one_process_files()
    path = [p for p in step_files.files_entered(data=2, tensor=2) if step_files.part(p, one) == "path"
            and (p.startswith("minidist/parallel/") or p == "minidist/nn/runner.py")]
    return [("extra Trainer engines per pipeline size", extra, 0),
            ("parallel/ files a data×tensor step adds", path, STEP_FILES_TARGET)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
