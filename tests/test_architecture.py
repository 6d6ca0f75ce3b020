"""The one direction of knowledge (DESIGN.md §1), checked in a clean interpreter."""

from __future__ import annotations

import ast
import json
import pkgutil
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def modules_of(package: str) -> list[str]:
    pkg_dir = REPO / package
    names = [package]
    for info in pkgutil.walk_packages([str(pkg_dir)], prefix=f"{package}."):
        names.append(info.name)
    return names


def imported_after(modules: list[str]) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return set(json.loads(out.stdout))


def top_level(mods: set[str]) -> set[str]:
    return {m.split(".")[0] for m in mods}


def test_backend_never_imports_the_ui() -> None:
    loaded = top_level(imported_after(modules_of("backend")))
    assert not loaded & {"textual", "tui", "screens"}, loaded & {"textual", "tui", "screens"}


def test_targets_keep_textual_in_their_panels() -> None:
    """A target's package serves the CLI too: only its first-screen panel (and the aws matrix it shows) is Textual."""
    loaded = top_level(imported_after([m for m in modules_of("targets") if not m.endswith(UI_PARTS)]))
    assert not loaded & {"textual", "tui", "screens"}, loaded & {"textual", "tui", "screens"}


@pytest.mark.slow
def test_training_knows_nothing_of_the_rest() -> None:
    light = [m for m in modules_of("training") if m != "training.train"] + ["training.train"]
    loaded = top_level(imported_after(light))
    assert not loaded & {"textual", "tui", "screens", "backend"}


def test_the_tui_process_stays_light() -> None:
    """Reaching the first frame must not pay for torch, transformers or ray.train."""
    loaded = imported_after(["tui.cli", "tui.app", "tui.commands", "screens.target", "screens.plan",
                             "screens.provision", "screens.run", "backend.session", "backend.flows",
                             "targets.local.layer", "backend.layers.ray_job"])
    heavy = {m for m in loaded if m.split(".")[0] in {"torch", "transformers", "ray"}}
    assert not heavy, sorted(heavy)[:10]


def test_no_screen_imports_another_and_none_needs_a_type_ignore() -> None:
    """DESIGN.md §7: the App routes on messages; screens reach it typed."""
    for path in sorted((REPO / "screens").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                assert not name.startswith("screens"), f"{path.name} imports {name}"
    for folder in ("tui", "screens"):
        for path in (REPO / folder).glob("*.py"):
            assert "# type: ignore" not in path.read_text(), f"{folder}/{path.name} has a type: ignore"


# --- the import graph (issue 24, item 3) ---------------------------------------------------------------------
GRAPH_PACKAGES = ("backend", "targets", "tui", "screens", "training")


@dataclass(frozen=True)
class Import:
    """One import statement of ours: where it is, what it names, and whether it runs inside a function."""

    module: str
    path: Path
    line: int
    end_line: int
    targets: tuple[str, ...]
    in_function: bool
    type_checking: bool


def module_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for package in GRAPH_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path, known: set[str]) -> tuple[str, ...]:
    """The modules of ours an import statement loads: `from a.b import c` is a.b.c when that is a module, else a.b."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the importing module's package
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    return tuple(sorted({n for n in names if n in known}))


def imports_of_ours() -> list[Import]:
    files = module_files()
    known = set(files)
    found: list[Import] = []
    for module, path in files.items():
        def visit(node: ast.AST, in_function: bool, type_checking: bool, module: str = module,
                  path: Path = path) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _type_checking(child.test):
                    for part in child.body:
                        visit_statement(part, in_function, True, module, path)
                    for part in child.orelse:
                        visit_statement(part, in_function, type_checking, module, path)
                else:
                    visit_statement(child, in_function, type_checking, module, path)

        def visit_statement(node: ast.AST, in_function: bool, type_checking: bool, module: str,
                            path: Path) -> None:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(Import(module, path, node.lineno, node.end_lineno or node.lineno,
                                    _targets(node, module, path, known),
                                    in_function, type_checking))
                return
            visit(node, in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda),
                  type_checking, module, path)

        visit(ast.parse(path.read_text()), False, False)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports: function-level imports count, and so do TYPE_CHECKING ones
    (issue 38: a type named across a cycle ties the two modules all the same)."""
    graph: dict[str, set[str]] = {module: set() for module in module_files()}
    for imp in imports_of_ours():
        graph[imp.module].update(t for t in imp.targets if t != imp.module)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that reach each other through imports (Tarjan's strongly connected components
    of two or more modules): each cycle lies inside one group, and every module of a group is on one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                connect(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group: list[str] = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return sorted(groups)


def test_the_import_graph_has_no_cycle() -> None:
    """Issues 24 and 38: no two modules import each other, by any path; a function-level import is an import, and
    so is one under TYPE_CHECKING.
    The message lists each group of modules in a cycle with the imports that hold it together."""
    cycles = import_cycles(import_graph())
    lines = []
    for group in cycles:
        lines.append("cycle: " + " · ".join(group))
        lines += [f"    {imp.path.relative_to(REPO)}:{imp.line} imports {target}"
                  + (" (in a function)" if imp.in_function else "")
                  + (" (for types)" if imp.type_checking else "")
                  for imp in imports_of_ours() if imp.module in group
                  for target in imp.targets if target in group and target != imp.module]
    assert not cycles, "import cycles:\n" + "\n".join(lines)


# Issue 38: imports point one way. Each package may import those after it in its row, never one before it
# or beside it: a target's package builds on backend (the aws target on the kube target's kube layer),
# and backend names the built-in targets only as data (backend.targets.BUILTIN, imported by importlib).
# TYPE_CHECKING imports count too: a type named across the line is a dependency all the same.
LOWER: dict[str, tuple[str, ...]] = {
    "backend": ("training",),
    "targets.local": ("backend", "training"),
    "targets.kube": ("backend", "training"),
    "targets.aws": ("targets.kube", "backend", "training"),
}


def _package_of(module: str) -> str:
    for package in sorted(LOWER, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    return module.split(".")[0]


# A target's part of the first screen is a Textual widget: it builds on tui's panel contract, and only
# screens load it (test_targets_keep_textual_in_their_panels).
UI_PARTS = (".panel", ".matrix", ".quota_modal")


def backwards_imports(imports: list[Import]) -> list[str]:
    """``path:line imports module`` for each import from a package in LOWER of one it may not import."""
    found = []
    for imp in imports:
        home = _package_of(imp.module)
        if home not in LOWER:
            continue
        allowed = (home, *LOWER[home], *(("tui",) if imp.module.endswith(UI_PARTS) else ()))
        for target in imp.targets:
            if _package_of(target) not in allowed and target.split(".")[0] in GRAPH_PACKAGES:
                found.append(f"{imp.path.relative_to(REPO)}:{imp.line} imports {target}")
    return found


def test_imports_point_one_way() -> None:
    found = backwards_imports(imports_of_ours())
    assert not found, f"{len(found)} imports against the direction (issue 38):\n" + "\n".join(found)


def test_the_direction_check_sees_a_backwards_import() -> None:
    cases = {("backend.session", "targets.aws.infra.api"): True,
             ("targets.kube.cluster_api", "targets.aws.infra"): True,
             ("targets.local.layer", "targets.kube.pods"): True,
             ("backend.config", "tui.app"): True,
             ("targets.kube.layer", "tui.checks"): True,
             ("targets.aws.infra.layer", "targets.kube.manifests"): False,
             ("tui.cli", "targets.kube"): False,
             ("targets.kube.layer", "backend.targets"): False,
             ("targets.kube.panel", "tui.checks"): False}
    for (module, target), backwards in cases.items():
        found = backwards_imports([Import(module, REPO / "x.py", 1, 1, (target,), True, True)])
        assert bool(found) is backwards, (module, target)


def test_the_cycle_finder_finds_cycles() -> None:
    """The checker itself: a cycle through three modules and one through two, each reported once; a module
    importing itself (harmless, and what `from package import name` inside a package's __init__ reads as) is none."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"g"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []



LAZY = "# lazy:"


def _lazy_reason(imp: Import, lines: list[str]) -> str:
    """The reason a function-level import gives: `# lazy: <why>` on the line above it or at its end."""
    for text in (lines[imp.line - 2], lines[imp.line - 1]):
        if LAZY in text:
            return text.split(LAZY, 1)[1].strip()
    return ""


def test_every_function_level_import_says_why_it_is_lazy() -> None:
    """Issue 24 item 3: an import inside a function hides a dependency; it stays only where the first frame (or a
    process that must stay light) needs it, and says so in a `# lazy: <reason>` comment. training/ runs in the
    cluster's image and imports torch where it is used: it is not held to this. Imports right below one another
    share the reason above the first."""
    unexplained = []
    explained_until: dict[Path, int] = {}  # the last line of a run of lazy imports under one reason
    for imp in sorted(imports_of_ours(), key=lambda i: (str(i.path), i.line)):
        if imp.in_function and imp.module.split(".")[0] in ("backend", "targets", "tui", "screens"):
            lines = imp.path.read_text().splitlines()
            above = explained_until.get(imp.path)
            if _lazy_reason(imp, lines) or (above is not None and not "".join(lines[above:imp.line - 1]).strip()):
                explained_until[imp.path] = imp.end_line  # the next import right below shares the reason
            else:
                unexplained.append(f"{imp.path.relative_to(REPO)}:{imp.line}: {lines[imp.line - 1].strip()}")
    assert not unexplained, f"{len(unexplained)} function-level imports without a `{LAZY} <reason>`:\n" + \
        "\n".join(unexplained)


# What holds a connection, a pool or threads: a client of AWS, Kubernetes or Ray, a session of
# boto3, the worker pool they run on. A cache of one at module level outlives every session.
CLIENTISH = ("Api", "Client", "Session", "Pool", "Jobs", "Resource")


def _clientish(text: str) -> bool:
    return any(re.search(rf"[A-Za-z_]*{word}\b", text) for word in CLIENTISH)


def module_level_client_caches(source: str) -> list[str]:
    """Module-level mutable containers holding clients, and functools caches of functions returning one."""
    found: list[str] = []
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            note = ast.unparse(node.annotation)
            mutable = note.split("[")[0].split(".")[-1].lower() in {"dict", "list", "set", "defaultdict",
                                                                    "ordereddict", "weakvaluedictionary"}
            if mutable and _clientish(note):
                found.append(f"{node.target.id}: {note} (line {node.lineno})")
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Dict, ast.List, ast.Set, ast.Call)):
            for target in node.targets:
                if isinstance(target, ast.Name) and any(w in target.id.lower() for w in ("api", "client", "eks")):
                    if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) not in (
                            "dict", "list", "set", "collections.defaultdict", "defaultdict"):
                        continue
                    found.append(f"{target.id} = {ast.unparse(node.value)[:40]} (line {node.lineno})")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            cached = [d for d in node.decorator_list
                      if ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1]
                      in {"cache", "lru_cache", "cached"}]
            returns = ast.unparse(node.returns) if node.returns is not None else "?"
            if cached and (returns == "?" or _clientish(returns)):
                found.append(f"@{ast.unparse(cached[0])} {node.name}() -> {returns} (line {node.lineno})")
    return found


def test_the_client_cache_scan_finds_what_it_looks_for() -> None:
    """The scan below can fail: each shape of a module-level client cache is found, data caches are not."""
    source = (
        "import functools\n"
        "_APIS: dict[tuple[str, str], AwsApi] = {}\n"
        "_EKS = {}\n"
        "CLIENTS: list['KubeApi'] = []\n"
        "PRICES: dict[str, float] = {}\n"
        "@functools.lru_cache(maxsize=2)\n"
        "def jobs(address: str) -> RayJobs: ...\n"
        "@functools.cache\n"
        "def partition(region: str) -> Partition: ...\n"
    )
    found = module_level_client_caches(source)
    names = [f.split(":")[0].split(" ")[0] for f in found]
    assert names == ["_APIS", "_EKS", "CLIENTS", "@functools.lru_cache(maxsize=2)"]


def test_no_module_level_client_cache_in_backend_or_a_target() -> None:
    """Clients belong to the session (issue 24 item 4): made when first needed, closed when it ends.
    A module-level cache outlives every session, leaks its threads and must be cleared by tests."""
    found = {str(path.relative_to(REPO)): hits for folder in ("backend", "targets")
             for path in sorted((REPO / folder).rglob("*.py"))
             if (hits := module_level_client_caches(path.read_text()))}
    assert not found, found
# The names of the built-in targets: generic code may carry them as data (a default, a help text),
# never compare a value against them. Spelled here, not imported: the test must not trust the product.
TARGET_NAMES = frozenset({"local", "kube", "aws"})
# Generic code (issue 24): what serves every target. A target's own code lives in its targets/ package
# (issue 38): its layers, its read-only cloud code, its panel.
GENERIC = ("backend/*.py", "backend/telemetry/*.py", "backend/layers/base.py",
           "backend/layers/ray_job.py", "tui/*.py", "screens/*.py")


def _names_a_target(node: object) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in TARGET_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_target(e) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set"):
        return any(_names_a_target(a) for a in node.args)
    return False


def target_branches(source: str, filename: str = "<src>") -> list[str]:
    """``file:line: code`` of each comparison (==, !=, in, not in, is) or ``case`` against a target's name."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    hits: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            ops_ok = all(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn | ast.Is | ast.IsNot)
                         for op in node.ops)
            if ops_ok and any(_names_a_target(side) for side in (node.left, *node.comparators)):
                hits.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and _names_a_target(node.value):
            hits.append(node.lineno)
    return [f"{filename}:{line}: {lines[line - 1].strip()}" for line in sorted(hits)]


def test_the_branch_finder_sees_every_spelling() -> None:
    """The finder itself: spacing, quotes, order, tuples, sets and match all count; data does not."""
    branchy = ['if config.target=="local": pass', "if 'aws' != t: pass", 'x = target in ("aws", "kube")',
               'x = cfg.target not in {"local"}', 'x = "kube" if  target  ==  "kube"  else 1',
               'match config.target:\n    case "aws":\n        pass']
    for src in branchy:
        assert target_branches(src), src
    for src in ['DEFAULT = "local"', 'x = {"local": 1}', 'x = name == "localhost"', 'x = t == other.target']:
        assert not target_branches(src), src


def test_generic_code_has_no_branch_on_a_target_name() -> None:
    """Issue 24: a target is one folder; generic code asks the target, never tests its name."""
    found: list[str] = []
    for pattern in GENERIC:
        for path in sorted(REPO.glob(pattern)):
            found += target_branches(path.read_text(), str(path.relative_to(REPO)))
    assert not found, f"{len(found)} branches on a target name:\n" + "\n".join(found)


def test_the_lazy_rule_reads_a_reason_above_or_beside_an_import() -> None:
    """The checker itself: a reason on the line above or at the end counts; an import without one does not."""
    lines = ["def f() -> None:", "    # lazy: boto3 only on the aws target", "    import boto3",
             "def g() -> None:", "    import yaml  # lazy: yaml only for manifests",
             "def h() -> None:", "    import json"]

    def at(line: int) -> Import:
        return Import("m", Path("m.py"), line, line, (), True, False)

    assert _lazy_reason(at(3), lines) == "boto3 only on the aws target"
    assert _lazy_reason(at(5), lines) == "yaml only for manifests"
    assert _lazy_reason(at(7), lines) == ""


def test_no_module_under_backend_is_named_for_a_target() -> None:
    """Issue 38: a target's code is in its folder. What every target shares (the boto3 loader s3:// storage
    uses, the ray-job layer) has a name of its own; a module named for a target belongs to the target."""
    words = {*TARGET_NAMES - {"local"}, "k8s", "kubernetes", "eks", "ec2"}  # "local" also means this disk
    named = [str(path.relative_to(REPO)) for path in sorted((REPO / "backend").rglob("*.py"))
             if any(word in part for part in path.relative_to(REPO / "backend").parts for word in words)]
    assert not named, named


# The built-in targets' own layers (the shared ray-job layer is generic), spelled here as above.
TARGET_LAYERS = frozenset({"local-ray", "kube", "kubernetes", "aws", "aws-access"})


def keyed_by_target_layer(source: str, filename: str = "<src>") -> list[str]:
    """``file:line: code`` of each dict literal with a key naming a target's own layer."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    hits = sorted({node.lineno for node in ast.walk(tree) if isinstance(node, ast.Dict)
                   and any(isinstance(k, ast.Constant) and k.value in TARGET_LAYERS for k in node.keys)})
    return [f"{filename}:{line}: {lines[line - 1].strip()}" for line in hits]


def test_the_front_end_keeps_no_table_by_a_targets_layer() -> None:
    """Issue 38: the plan's heading of a layer ("Kubernetes objects") came from a table in tui/ keyed by
    each target's layer names; a fourth target's layers went without one. A layer says its own title."""
    assert keyed_by_target_layer('T = {"aws": "AWS infrastructure", "ray-job": "Ray job"}')
    assert not keyed_by_target_layer('T = {"ray-job": "Ray job"}')
    found: list[str] = []
    for pattern in ("tui/*.py", "screens/*.py"):
        for path in sorted(REPO.glob(pattern)):
            found += keyed_by_target_layer(path.read_text(), str(path.relative_to(REPO)))
    assert not found, "\n".join(found)


def test_the_front_end_tells_no_user_to_pass_a_built_in_target() -> None:
    """Issue 38: the App's words when `m` found nowhere to move the machines named the aws target's AZs and
    `rtui check --target aws` for every target. What a target's situation asks of the user is the target's."""
    pattern = re.compile(r"--target[ =](?:" + "|".join(sorted(TARGET_NAMES)) + r")\b")
    assert pattern.search("`rtui check --target aws --all-regions` shows other regions")
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
             for glob in ("tui/*.py", "screens/*.py") for path in sorted(REPO.glob(glob))
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)
