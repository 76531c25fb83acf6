"""The package's folders are floors and imports point down only (the README's "Development" section).

Every import of every module is read from its syntax tree, the lazy ones inside functions included
(they are dependencies too, only deferred), so the check needs none of the optional packages.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pointpillars_trt"

# Lowest first. A module may import its own floor and the floors below; reference and kernels share a
# rank but never import each other (the oracle must stay independent of the code it checks).
FLOORS: dict[str, tuple[int, tuple[str, ...]]] = {
    "leaves": (0, ("errors", "config", "config_yaml", "points", "file_reads", "file_writes", "strict_json",
                   "kernel_limits", "stop_signals", "point_layout", "intensities")),
    "contracts": (1, ("graph_io", "graph_wire", "anchors", "model_dir", "pcd", "pointcloud_io", "kitti", "detections",
                      "frame_findings", "camera_fov", "staging", "shared_staging", "sweeps")),
    "reference": (2, ("reference",)),
    "kernels": (2, ("kernels",)),
    "runtime": (3, ("runtime",)),
    "convert": (4, ("convert",)),
    "pipelines": (5, ("gpu_pipeline", "cpu_detector", "device_points", "baselines")),
    "detector": (6, ("detector", "runtime_options", "devices")),
    "apps": (7, ("apps",)),
    "entry": (8, ("__init__", "__main__")),
}


def module_name(path: Path) -> str:
    parts = list(path.with_suffix("").relative_to(PACKAGE.parent).parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor_of(module: str) -> str:
    first = module.split(".")[1] if "." in module else "__init__"
    for floor, (_, names) in FLOORS.items():
        if first in names:
            return floor
    raise AssertionError(f"{module}: on no floor; add it to FLOORS and to the README's layout")


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (relative imports resolved, ``from x import y`` counted
    as an import of ``x.y`` when that is a module)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [target, *(f"{target}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found.update(name for name in names if name in files and name != module)
        graph[module] = found
    return graph


GRAPH = import_graph()


def test_the_reader_sees_the_arrows_that_exist() -> None:
    """The checker itself: it finds a lazy import and a relative one (else every other check passes vacuously)."""
    assert "pointpillars_trt.runtime.cudnn" in GRAPH["pointpillars_trt.runtime.availability"]  # lazy, relative
    assert "pointpillars_trt.kernels.neck_head" in GRAPH["pointpillars_trt.runtime.cudnn"]  # lazy, two dots
    assert "pointpillars_trt.runtime" in GRAPH["pointpillars_trt.gpu_pipeline"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down_only(module: str) -> None:
    floor = floor_of(module)
    rank = FLOORS[floor][0]
    for target in sorted(GRAPH[module]):
        other = floor_of(target)
        if other == floor:
            continue
        assert FLOORS[other][0] < rank, f"{module} ({floor}) imports {target} ({other}): an arrow up or sideways"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_library() -> None:
    library = {m: {t for t in ts if floor_of(t) != "apps"} for m, ts in GRAPH.items() if floor_of(m) != "apps"}
    assert find_cycle(library) is None


def test_no_import_cycle_in_apps() -> None:
    """infer, Triton and Ray all sit on the streaming frame runner (apps/frames.py), not on each other."""
    apps = {m for m in GRAPH if floor_of(m) == "apps"}
    cycle = find_cycle({m: {t for t in ts if t in apps} for m, ts in GRAPH.items() if m in apps})
    assert cycle is None, " -> ".join(cycle or [])


def test_the_named_arrows_are_absent() -> None:
    """Four arrows the floors forbid by name: kernels -> engines, engines -> the pipeline, the library -> apps,
    oracle -> GPU code."""
    def edges(src: tuple[str, ...], dst: tuple[str, ...]) -> list[tuple[str, str]]:
        return [(m, t) for m, ts in GRAPH.items() for t in ts if floor_of(m) in src and floor_of(t) in dst]

    library = tuple(f for f in FLOORS if f not in ("apps", "entry"))
    assert not edges(("kernels",), ("runtime",))
    assert not edges(("runtime",), ("pipelines", "detector"))
    assert not edges(library, ("apps",))
    assert not edges(("reference",), ("kernels", "runtime"))


def test_the_readme_layout_names_every_module() -> None:
    """Each module file of the package is named in the README's layout (a module added without a line there
    leaves the next engineer a map with a hole in it): a module as ``name.py`` (a folder's in that folder's
    lines), a module two folders down by its folder's name there."""
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("\n## Development"):]
    layout = layout[: layout.index("\n```", layout.index("```") + 3)]
    blocks = _folder_blocks(layout)
    missing = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                     if path.name not in ("__init__.py", "__main__.py") and not _named_in(path, layout, blocks))
    assert not missing, f"add these to the README's layout: {missing}"


def _folder_blocks(layout: str) -> dict[str, str]:
    """The layout's lines of each folder (``  kernels/  ...`` and the deeper-indented lines after it)."""
    blocks: dict[str, str] = {}
    folder = None
    for line in layout.splitlines():
        entry = re.match(r"  (\w+)/\s", line)
        if entry:
            folder = entry.group(1)
        elif re.match(r"  \S", line):  # a top-level entry: no folder's lines
            folder = None
        if folder is not None:
            blocks[folder] = blocks.get(folder, "") + line + "\n"
    return blocks


def _named_in(module: Path, layout: str, blocks: dict[str, str]) -> bool:
    parts = module.relative_to(PACKAGE).parts
    if len(parts) == 1:
        return re.search(rf"(?<![\w.]){re.escape(module.name)}(?!\w)", layout) is not None
    name = module.name if len(parts) == 2 else f"{parts[1]}/"
    return re.search(rf"(?<![\w.]){re.escape(name)}", blocks.get(parts[0], "")) is not None


def test_the_package_lists_its_public_names_and_not_its_helpers() -> None:
    """``dir(pointpillars_trt)`` (what completion shows) holds the public API, each name importable, and none of
    the names the package module uses to load it lazily."""
    import pointpillars_trt

    names = dir(pointpillars_trt)
    assert set(pointpillars_trt.__all__) <= set(names) and "__version__" in names
    assert not {"TYPE_CHECKING", "importlib", "annotations"} & set(names)
    assert all(getattr(pointpillars_trt, name) is not None for name in pointpillars_trt.__all__)


USER_SCRIPT = '''
from __future__ import annotations
from collections.abc import Callable, Generator
from typing import assert_type

import numpy as np

from pointpillars_trt import Detections, FrameResult, FrameStats, PointPillars, PointPillarsError, Thresholds
from pointpillars_trt.apps.serve.client import RemoteDetector
from pointpillars_trt.pointcloud_io import read_points


def run(checkpoint: str, frame: str) -> list[str]:
    with PointPillars.from_checkpoint(checkpoint, device="cpu") as detector:
        assert_type(detector, PointPillars)
        points = read_points(frame)
        assert_type(points, np.ndarray)
        found = detector(points, thresholds=Thresholds(score_threshold=0.5))
        assert_type(found, Detections)
        assert_type(found.stats, FrameStats)
        assert_type(found.names, list[str])
        pred_dict = found.to_pcdet_dict()
        assert_type(pred_dict, dict[str, np.ndarray])
        assert_type(Detections.from_pcdet_dict(pred_dict, found.class_names), Detections)
        assert_type(detector.detect_batch([points]), list[Detections])
        assert_type(detector.submit_batch([points]), Callable[[], list[Detections]])
        results = detector.infer_many([frame, points], batch_size=2)
        assert_type(results, Generator[FrameResult, None, None])
        for result in results:
            assert_type(result.error, PointPillarsError | None)
            if result.detections is not None:
                assert_type(result.detections, Detections)
            break
        results.close()  # read in part: the reads not started are dropped
        assert_type(detector.last_timings, dict[str, float])
        return found.names


def run_remote(address: str, frame: str) -> None:
    remote = RemoteDetector(address, protocol="grpc")
    results = remote.infer_many([frame], concurrency=2)
    assert_type(results, Generator[FrameResult, None, None])
    assert_type(next(results), FrameResult)
    results.close()  # read in part: its requests in flight are given up on
    remote.close()
'''


def test_a_users_script_type_checks_strictly_against_the_packages_types(tmp_path: Path) -> None:
    """py.typed gives a user's ``mypy --strict`` the package's own types: a script of the README's Python calls
    checks clean, each value of the type it is (what ``infer_many`` yields is importable from the package, as
    the other public types are; what it returns is a generator, closed when read in part), and the package's own
    modules are checked as an installed package's are."""
    import subprocess
    import sys

    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
                           "--python-version", "3.11", str(script)], capture_output=True, text=True,
                          cwd=PACKAGE.parent, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
