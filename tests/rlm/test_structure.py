"""The library's shape: no import cycles, and nothing of the service imported (it installs and runs alone)."""

from __future__ import annotations

from tests.import_graph import cycles, module_graph

from .conftest import REPO_ROOT

SERVICE_ROOMS = ("app", "workers", "ledger", "core", "specialists", "specs", "bench", "tests")


def test_no_module_of_rlm_is_part_of_an_import_cycle() -> None:
    graph = module_graph(REPO_ROOT, ["library/rlmfamily"])
    assert "rlmfamily.session" in graph and "rlmfamily.a2a.run" in graph, "the graph reads the library's modules"
    assert cycles(graph) == []


def test_rlm_imports_nothing_of_the_service() -> None:
    graph = module_graph(REPO_ROOT, ["library/rlmfamily"])
    upward = {
        module: sorted(target for target in targets if target.split(".")[0] in SERVICE_ROOMS)
        for module, targets in graph.items()
    }
    assert {module: targets for module, targets in upward.items() if targets} == {}


def test_the_checker_finds_a_cycle_through_a_lazy_import(tmp_path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "seam.py").write_text("def defaults():\n    from pkg.impl import Impl\n    return [Impl]\n")
    (package / "impl.py").write_text("from pkg import seam\n\nclass Impl: ...\n")
    (package / "alone.py").write_text("from . import alone\n")
    graph = module_graph(tmp_path, ["pkg"])
    assert graph["pkg.impl"] == {"pkg.seam"}
    assert cycles(graph) == [["pkg.alone"], ["pkg.impl", "pkg.seam"]]
