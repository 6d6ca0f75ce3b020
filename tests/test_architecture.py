"""The one direction of knowledge (DESIGN.md §1), checked in a clean interpreter."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

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


def test_training_knows_nothing_of_the_rest() -> None:
    light = [m for m in modules_of("training") if m != "training.train"] + ["training.train"]
    loaded = top_level(imported_after(light))
    assert not loaded & {"textual", "tui", "screens", "backend"}


def test_the_tui_process_stays_light() -> None:
    """Reaching the first frame must not pay for torch, transformers or ray.train."""
    loaded = imported_after(["tui.cli", "tui.app", "tui.commands", "screens.target", "screens.plan",
                             "screens.provision", "screens.run", "backend.session", "backend.flows",
                             "backend.layers.local_ray", "backend.layers.ray_job"])
    heavy = {m for m in loaded if m.split(".")[0] in {"torch", "transformers", "ray"}}
    assert not heavy, sorted(heavy)[:10]


def test_no_screen_imports_another_and_none_needs_a_type_ignore() -> None:
    """DESIGN.md §7: the App routes on messages; screens reach it typed."""
    import ast

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
