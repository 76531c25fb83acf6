"""Model dirs: what export writes, what load gives back, and a clear error for every way a dir can be wrong."""

from __future__ import annotations

import dataclasses
import errno

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from disk_full import fill_up_at_rpn_graph
from graph_reads import count_graph_reads_and_hashes
from notices import published_config_notice
from tiny import random_canvas, tiny_config, tiny_model_dir, tiny_weights

from pointpillars_trt.config import load_config
from pointpillars_trt.errors import CacheNotice, ModelDirError
from pointpillars_trt.runtime import engine_file
from pointpillars_trt.convert.export import export_model_dir
from pointpillars_trt.model_dir import FORMAT_VERSION, METADATA_FILE, load_model_dir
from pointpillars_trt.convert.onnx_export import OPSET, build_rpn_graph
from pointpillars_trt.graph_io import RPN_INPUT


def _edit_metadata(folder: Path, change) -> None:  # type: ignore[no-untyped-def]
    meta = json.loads((folder / METADATA_FILE).read_text())
    change(meta)
    (folder / METADATA_FILE).write_text(json.dumps(meta))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("family", ["openpcdet", "zhulf0804"])
def test_round_trip(tmp_path: Path, family: str, precision: str):
    cfg = tiny_config(family)
    written = tiny_model_dir(tmp_path / "m", family, precision, seed=3)
    loaded = load_model_dir(tmp_path / "m", expected_config=cfg)
    assert loaded.cfg == cfg and loaded.cfg.digest() == cfg.digest()
    assert loaded.metadata == written.metadata and loaded.path == tmp_path / "m"
    assert loaded.precision == precision
    meta = loaded.metadata
    assert meta["format_version"] == FORMAT_VERSION and meta["onnx_opset"] == OPSET
    assert meta["config_name"] == cfg.name and meta["config_digest"] == cfg.digest()
    assert meta["source"] == {"random_seed": 3, "tiny": True}
    assert meta["package_version"] and meta["created"].endswith("+00:00")
    assert meta["graphs"]["pfn"]["inputs"] == [
        {"name": "pillars", "shape": ["num_pillars", 8, cfg.features.channels], "dtype": "float32"}
    ]
    assert meta["graphs"]["rpn"]["outputs"] == [{"name": "heads", "shape": ["batch", 12, 16, 72], "dtype": "float32"}]
    canvas_type = "float16" if precision == "fp16" else "float32"
    assert meta["graphs"]["rpn"]["inputs"] == [{"name": "canvas", "shape": ["batch", 24, 32, 16], "dtype": canvas_type}]
    assert sorted(p.name for p in loaded.path.iterdir()) == ["model.json", "pfn.onnx", "rpn.onnx"]  # no temp files left
    assert loaded.plan_path("rpn") == loaded.path / "rpn.plan"
    # The stored graph is the exported one, and it runs.
    stored = onnx.load(str(loaded.rpn_path))
    assert stored.SerializeToString() == build_rpn_graph(tiny_weights(cfg, 3), cfg, precision).SerializeToString()
    session = ort.InferenceSession(str(loaded.rpn_path), providers=["CPUExecutionProvider"])
    nhwc = np.repeat(random_canvas(cfg).transpose(0, 2, 3, 1), 3, axis=0).astype(canvas_type)  # a batch of 3
    assert session.run(["heads"], {RPN_INPUT: nhwc})[0].shape == (3, 12, 16, 72)


def test_export_overwrites_an_existing_dir_and_drops_its_stale_plans(tmp_path: Path):
    first = tiny_model_dir(tmp_path, seed=0)
    assert not first.has_plans() and engine_file(first, "rpn", "onnxruntime") == first.rpn_path
    for graph in ("pfn", "rpn"):  # pfn.plan: what builds before the PFN ran only as a CUDA kernel also wrote
        first.plan_path(graph).write_bytes(b"plan of the seed-0 graph")
        first.plan_path(graph).with_suffix(".plan.json").write_text("{}")
    assert first.has_plans() and engine_file(first, "rpn", "tensorrt") == tmp_path / "rpn.plan"
    second = tiny_model_dir(tmp_path, seed=1)
    assert first.metadata["graphs"]["rpn"]["sha256"] != second.metadata["graphs"]["rpn"]["sha256"]
    assert load_model_dir(tmp_path).metadata["source"]["random_seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "pfn.onnx", "rpn.onnx"]


def test_plans_mean_rpn_plan_and_a_stray_pfn_plan_is_ignored(tmp_path: Path):
    """Only rpn.plan is built and needed; a pfn.plan of an older build neither counts nor stops the dir loading."""
    model = tiny_model_dir(tmp_path)
    model.plan_path("pfn").write_bytes(b"pfn.plan of an older build")
    model.plan_path("pfn").with_suffix(".plan.json").write_text("{}")
    assert not load_model_dir(tmp_path, model.cfg).has_plans()
    model.plan_path("rpn").write_bytes(b"rpn.plan")
    loaded = load_model_dir(tmp_path, model.cfg)
    assert loaded.has_plans() and loaded.metadata == model.metadata
    model.plan_path("pfn").unlink()
    assert load_model_dir(tmp_path, model.cfg).has_plans()


def test_an_export_that_fails_leaves_the_previous_dir_untouched(tmp_path: Path):
    tiny_model_dir(tmp_path, seed=0)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    cfg = tiny_config()
    with pytest.raises(ModelDirError, match="not JSON-serialisable"):  # the source must be JSON-serialisable
        export_model_dir(tiny_weights(cfg, seed=1), cfg, tmp_path, precision="fp32", source={"seed": object()})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_disk_full_during_a_rebuild_keeps_the_working_model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = tmp_path / "model"
    tiny_model_dir(folder, seed=0)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    fill_up_at_rpn_graph(monkeypatch)
    cfg = tiny_config()
    with pytest.raises(ModelDirError, match=r"cannot write '.*model/rpn.onnx' \(No space left on device\)"):
        export_model_dir(tiny_weights(cfg, seed=1), cfg, folder, precision="fp32", source={})
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no build folder left behind
    load_model_dir(folder)


def test_a_folder_that_is_not_a_model_dir_is_never_overwritten(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "old.plan").write_bytes(b"x")
    cfg = tiny_config()
    with pytest.raises(ModelDirError, match="a non-empty folder that is not a model dir"):
        export_model_dir(tiny_weights(cfg), cfg, tmp_path, precision="fp32", source={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "old.plan"]



def test_a_model_dir_below_a_file_names_the_file(tmp_path: Path):
    """It said "cannot create a build folder beside it (File exists)"; the file in the way is the cause."""
    (tmp_path / "a_file").write_text("x")
    cfg = tiny_config()
    with pytest.raises(ModelDirError, match=rf"model dir .*a_file/sub/model': '{re.escape(str(tmp_path / 'a_file'))}' "
                                            r"is a file, not a folder$"):
        export_model_dir(tiny_weights(cfg), cfg, tmp_path / "a_file" / "sub" / "model", precision="fp32", source={})

def test_concurrent_builds_into_one_folder_leave_one_consistent_model_dir(tmp_path: Path):
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    cfg, folder = tiny_config(), tmp_path / "model"

    def build(seed: int) -> None:
        try:
            export_model_dir(tiny_weights(cfg, seed=seed), cfg, folder, precision="fp32", source={"seed": seed})
        except ModelDirError:
            pass  # losing a race to replace the folder is reported, never half-written

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(build, range(8)))
    model = load_model_dir(folder)
    for graph, entry in model.metadata["graphs"].items():
        assert hashlib.sha256((folder / f"{graph}.onnx").read_bytes()).hexdigest() == entry["sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]



def test_a_folder_swapped_out_while_it_is_checked_is_nothing_to_protect(tmp_path: Path):
    """Another build of the same folder moves it aside between this build's check that it is a folder and
    its listing of it: nothing is left to protect, so the build goes on (before: FileNotFoundError out of
    the check, the intermittent failure of the concurrent-builds test above)."""
    import shutil

    from pointpillars_trt.convert.export import _check_replaceable

    class SwappedOutWhileListed(type(tmp_path)):  # type: ignore[misc]
        def iterdir(self):  # type: ignore[no-untyped-def]
            shutil.rmtree(self)  # the other build's swap, just before the listing
            return super().iterdir()

    cfg, folder = tiny_config(), tmp_path / "model"
    export_model_dir(tiny_weights(cfg, seed=1), cfg, folder, precision="fp32", source={"seed": 1})
    _check_replaceable(SwappedOutWhileListed(folder))
    assert not folder.exists()

def test_a_build_that_loses_the_race_to_its_folder_leaves_the_winner_and_no_old_folder(tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    """Another build moves its dir in between this build's moving the old dir aside and moving its own
    in: this build fails (reported), the winner's dir stays, and the old dir aside is removed, not left
    behind (the race behind an intermittent failure of the concurrent-builds test above)."""
    from pointpillars_trt.convert import export

    cfg, folder = tiny_config(), tmp_path / "model"
    export_model_dir(tiny_weights(cfg, seed=1), cfg, folder, precision="fp32", source={"seed": 1})
    winner = tmp_path / "winner"
    export_model_dir(tiny_weights(cfg, seed=2), cfg, winner, precision="fp32", source={"seed": 2})
    winners_rpn = (winner / "rpn.onnx").read_bytes()
    real_replace = os.replace

    def racing(src, dst):  # type: ignore[no-untyped-def]
        if Path(src).name.startswith(".model.build-") and Path(dst) == folder and not folder.exists():
            real_replace(winner, folder)  # the other build lands first
        real_replace(src, dst)

    monkeypatch.setattr(export.os, "replace", racing)
    with pytest.raises(ModelDirError):
        export_model_dir(tiny_weights(cfg, seed=3), cfg, folder, precision="fp32", source={"seed": 3})
    monkeypatch.undo()
    load_model_dir(folder)
    assert (folder / "rpn.onnx").read_bytes() == winners_rpn
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_missing_folder(tmp_path: Path):
    with pytest.raises(ModelDirError, match=r"model dir .*nope': not found"):
        load_model_dir(tmp_path / "nope")


def test_missing_metadata(tmp_path: Path):
    with pytest.raises(ModelDirError, match=r"model\.json': missing, so .* is not a model dir"):
        load_model_dir(tmp_path)


def test_a_folder_of_checkpoints_given_for_a_model_dir_names_them(tmp_path: Path):
    """OpenPCDet's ckpt/ folder given for a model (``--model output/.../ckpt``): its checkpoints are named, with how to
    give one; a folder of model dirs names those instead."""
    for name in ("checkpoint_epoch_79.pth", "checkpoint_epoch_80.pth", "latest_model.pth", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ModelDirError) as info:
        load_model_dir(tmp_path)
    assert str(info.value) == (
        f"{str(tmp_path / 'model.json')!r}: missing, so {str(tmp_path)!r} is not a model dir (the checkpoints in it: "
        "'checkpoint_epoch_79.pth', 'checkpoint_epoch_80.pth', 'latest_model.pth'; give one as --model (Python: "
        "PointPillars.from_checkpoint))")
    tiny_model_dir(tmp_path / "fp32")
    with pytest.raises(ModelDirError, match=r"is not a model dir \(the model dirs in it: 'fp32'\)$"):
        load_model_dir(tmp_path)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00", b"[1, 2]"])
def test_corrupt_metadata(tmp_path: Path, content: bytes):
    tiny_model_dir(tmp_path)
    (tmp_path / METADATA_FILE).write_bytes(content)
    with pytest.raises(ModelDirError, match=r"model\.json': (unreadable or not valid JSON|expected a JSON object)"):
        load_model_dir(tmp_path)


@pytest.mark.parametrize("graph", ["pfn.onnx", "rpn.onnx"])
def test_missing_graph(tmp_path: Path, graph: str):
    tiny_model_dir(tmp_path)
    os.remove(tmp_path / graph)
    with pytest.raises(ModelDirError, match=rf"{graph} missing"):
        load_model_dir(tmp_path)



def test_a_folder_in_a_graphs_place_and_a_linked_build_folder_are_named_for_what_they_are(tmp_path: Path):
    """A folder named rpn.onnx was "missing"; a --out that is a link to a model dir "exists and is not a folder"."""
    model = tiny_model_dir(tmp_path / "model")
    os.remove(model.rpn_path)
    model.rpn_path.mkdir()
    with pytest.raises(ModelDirError, match="rpn.onnx is a folder, not a regular file"):
        load_model_dir(model.path)
    tiny_model_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    cfg = tiny_config()
    with pytest.raises(ModelDirError, match=r"link': is a symbolic link \(to '.*real'\); a build replaces its folder"):
        export_model_dir(tiny_weights(cfg), cfg, tmp_path / "link", precision="fp32", source={})
    assert load_model_dir(tmp_path / "real")  # left whole


@pytest.mark.parametrize("name", ["pfn.onnx", "rpn.onnx", METADATA_FILE, ""])
def test_a_fifo_or_device_in_a_model_dirs_place_is_named_for_what_it_is(tmp_path: Path, name: str):
    """Each was "not found" or "missing", though ``ls`` shows it there."""
    tiny_model_dir(tmp_path / "model")
    target = tmp_path / "model" / name if name else tmp_path / "fifo.pth"
    if name:
        os.remove(target)
    os.mkfifo(target)
    with pytest.raises(ModelDirError, match=rf"{re.escape(target.name)}'?:? is a FIFO \(named pipe\), not a"):
        load_model_dir(target.parent if name else target)
    with pytest.raises(ModelDirError, match=r"null': is a character device, not a model dir"):
        load_model_dir("/dev/null")

@pytest.mark.parametrize("version", [1, 3, 0])
def test_unknown_format_version(tmp_path: Path, version):  # type: ignore[no-untyped-def]
    tiny_model_dir(tmp_path)
    _edit_metadata(tmp_path, lambda m: m.update(format_version=version))
    with pytest.raises(ModelDirError, match=rf"format_version {version!r} is not known"):
        load_model_dir(tmp_path)


@pytest.mark.parametrize("version, kind", [("2", "str"), (None, "NoneType"), (2.0, "float"), (True, "bool")])
def test_a_format_version_that_is_no_integer_says_its_type(tmp_path: Path, version, kind: str):  # type: ignore[no-untyped-def]
    """"2" for 2 read "format_version '2' is not known ... (it reads 2)", which looks like a contradiction."""
    tiny_model_dir(tmp_path)
    _edit_metadata(tmp_path, lambda m: m.update(format_version=version))
    with pytest.raises(ModelDirError, match=rf"format_version {re.escape(repr(version))} is a {kind}, not the integer "
                                            rf"this package writes \(\d+\); rebuild the model dir"):
        load_model_dir(tmp_path)


def test_missing_key(tmp_path: Path):
    tiny_model_dir(tmp_path)
    _edit_metadata(tmp_path, lambda m: m.pop("config_digest"))
    with pytest.raises(ModelDirError, match="missing key 'config_digest'"):
        load_model_dir(tmp_path)


def test_malformed_config(tmp_path: Path):
    tiny_model_dir(tmp_path)
    _edit_metadata(tmp_path, lambda m: m["config"]["voxel"].update(range_filter="sideways"))
    with pytest.raises(ModelDirError, match=r"model\.json': malformed .*range_filter"):
        load_model_dir(tmp_path)


def test_config_edited_after_the_build(tmp_path: Path):
    """A config changed by hand no longer matches its digest, so the graphs were built for something else."""
    tiny_model_dir(tmp_path)
    _edit_metadata(tmp_path, lambda m: m["config"]["postprocess"].update(pre_nms_top_k=7))
    with pytest.raises(ModelDirError, match="does not match the stored config"):
        load_model_dir(tmp_path)


def test_built_for_another_config(tmp_path: Path):
    tiny_model_dir(tmp_path, family="openpcdet")
    expected = tiny_config("zhulf0804")
    with pytest.raises(ModelDirError) as info:
        load_model_dir(tmp_path, expected_config=expected)
    message = str(info.value)
    assert "built for config tiny_openpcdet" in message and tiny_config("openpcdet").digest() in message
    assert "but tiny_zhulf0804" in message and expected.digest() in message
    # its checkpoint has the other layout, so a rebuild from it would fail: a checkpoint of that layout is asked for
    assert "from a checkpoint of the zhulf0804 layout: `pointpillars-trt build --checkpoint YOUR_CHECKPOINT.pth" in message
    assert "rebuild" not in message and "\n" not in message


def test_rebuild_hint_names_the_checkpoint_while_it_is_there(tmp_path: Path):
    cfg = tiny_config()
    checkpoint = tmp_path / "pp.pth"
    checkpoint.write_bytes(b"weights")
    export_model_dir(tiny_weights(cfg), cfg, tmp_path / "model", precision="fp32",
                     source={"checkpoint": str(checkpoint), "sha256": "ab" * 32, "layout": "openpcdet"})
    # a variant of the same layout is no built-in config name, so the hint asks for the user's YAML rather
    # than naming a config that `build` would refuse
    variant = dataclasses.replace(cfg, name="my_variant", voxel=dataclasses.replace(cfg.voxel, max_pillars=200))
    with pytest.raises(ModelDirError, match=f"rebuild with .*--checkpoint {checkpoint} --config YOUR_CONFIG.yaml --out"):
        load_model_dir(tmp_path / "model", expected_config=variant)
    with pytest.raises(ModelDirError, match=f"rebuild with .*--checkpoint {checkpoint} --config openpcdet_kitti_3class "
                                            "--out"):
        load_model_dir(tmp_path / "model", expected_config=load_config("openpcdet_kitti_3class"))
    # once the checkpoint is gone, a command naming it would fail: the placeholder, said
    checkpoint.unlink()
    with pytest.raises(ModelDirError, match=r"--checkpoint YOUR_CHECKPOINT.pth --config YOUR_CONFIG.yaml --out .*\(the "
                                            "model dir records no checkpoint that is still there: name yours\\)$"):
        load_model_dir(tmp_path / "model", expected_config=variant)


def test_unknown_precision(tmp_path: Path):
    cfg = tiny_config()
    with pytest.raises(Exception, match="precision 'int8'"):
        export_model_dir(tiny_weights(cfg), cfg, tmp_path, precision="int8", source={})
    tiny_model_dir(tmp_path)
    _edit_metadata(tmp_path, lambda m: m.update(precision="int8"))
    with pytest.raises(ModelDirError, match="precision 'int8'"):
        load_model_dir(tmp_path)


def test_graph_digests_match_the_files(tmp_path: Path):
    import hashlib

    model = tiny_model_dir(tmp_path)
    for graph in ("pfn", "rpn"):
        digest = hashlib.sha256(model.onnx_path(graph).read_bytes()).hexdigest()
        assert model.metadata["graphs"][graph]["sha256"] == digest
    assert np.all(np.isfinite(onnx.numpy_helper.to_array(onnx.load(str(model.pfn_path)).graph.initializer[0])))


@pytest.mark.parametrize("graph", ["pfn", "rpn"])
def test_a_graph_that_differs_from_its_recorded_sha256_is_refused(tmp_path: Path, graph: str):
    tiny_model_dir(tmp_path, seed=0)
    path = tmp_path / f"{graph}.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # 64 bytes of weights zeroed: still a valid graph
    path.write_bytes(bytes(data))
    with pytest.raises(ModelDirError, match=rf"{graph}.onnx': damaged or replaced \(sha256 .*rebuild the model dir"):
        load_model_dir(tmp_path)


def test_a_graph_rewritten_in_place_with_its_size_and_mtime_kept_is_checked_again(tmp_path: Path):
    """A process remembers the graphs it checked by their path, size and mtime: one rewritten in place with its size
    kept and its mtime set back (os.utime, cp -p, rsync -t) was trusted unchecked by the next open. Its change time,
    which no user can set back, tells it apart."""
    tiny_model_dir(tmp_path, seed=0)
    load_model_dir(tmp_path)  # checked: remembered
    path = tmp_path / "rpn.onnx"
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # 64 bytes of weights zeroed: same size, a valid graph
    while path.stat().st_ctime_ns == before.st_ctime_ns:  # a change within the file system's clock tick: once more
        with open(path, "r+b") as f:  # in place: the same inode
            f.write(data)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    with pytest.raises(ModelDirError, match=r"rpn.onnx': damaged or replaced \(sha256 .*rebuild the model dir"):
        load_model_dir(tmp_path)


def test_a_graph_cut_to_one_byte_is_refused_with_its_size(tmp_path: Path):
    tiny_model_dir(tmp_path, "openpcdet", seed=0)
    recorded = (tmp_path / "rpn.onnx").stat().st_size
    (tmp_path / "rpn.onnx").write_bytes(b"\x08")
    with pytest.raises(ModelDirError, match=rf"rpn.onnx': damaged or replaced \(1 byte, model.json records {recorded}\)"):
        load_model_dir(tmp_path)


def test_a_graph_of_another_model_swapped_in_is_refused(tmp_path: Path):
    tiny_model_dir(tmp_path / "a", "openpcdet", seed=0)
    tiny_model_dir(tmp_path / "b", "zhulf0804", seed=0)
    (tmp_path / "a" / "rpn.onnx").write_bytes((tmp_path / "b" / "rpn.onnx").read_bytes())
    with pytest.raises(ModelDirError, match="rpn.onnx': damaged or replaced"):
        load_model_dir(tmp_path / "a")


def test_a_model_dirs_graphs_are_read_and_hashed_once_as_a_detector_opens_it(tmp_path: Path, monkeypatch):
    """load_model_dir reads and hashes each graph to check it, and the CPU detector's sessions read and hashed it again
    (~25 ms for a 24 MB fp32 rpn.onnx): they take the bytes the check found whole, which the model dir then holds no
    longer. A second detector of the same ModelDir, which no check just read for, reads and checks each graph itself."""
    from pointpillars_trt.detector import PointPillars

    tiny_model_dir(tmp_path, seed=0)
    sizes = sorted((tmp_path / f"{graph}.onnx").stat().st_size for graph in ("pfn", "rpn"))
    opened, hashed = count_graph_reads_and_hashes(monkeypatch)
    model = load_model_dir(tmp_path)
    detector = PointPillars(model, device="cpu")
    assert sorted(opened) == ["pfn.onnx", "rpn.onnx"] and sorted(n for n in hashed if n in sizes) == sizes
    assert model.checked_files == {}  # handed over: not held for the detector's life
    points = np.array([[10.0, 1.0, -1.0, 0.5]] * 50, np.float32)
    first = detector(points)
    detector.close()
    opened.clear()
    with PointPillars(model, device="cpu") as again:
        assert sorted(opened) == ["pfn.onnx", "rpn.onnx"]
        np.testing.assert_array_equal(again(points).boxes, first.boxes)


@pytest.mark.parametrize("given", ["model dir", "checkpoint"])
def test_the_model_dir_that_serve_and_a_ray_run_hold_holds_no_graph_bytes_once_checked(tmp_path: Path, assets: Path,
                                                                                      monkeypatch, given: str):
    """serve and infer --ray open --model (resolve_model) and keep the model dir for their whole run, while Triton's
    instances and Ray's workers reopen it by path: it held the bytes of the graphs its check read (19-24 MB of a
    KITTI or nuScenes rpn.onnx) for nothing. The graphs are still read and checked."""
    from pointpillars_trt.apps.serve.repository import resolve_model

    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    if given == "model dir":
        path = tiny_model_dir(tmp_path / "m").path
    else:
        path = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
        with published_config_notice(path):
            resolve_model(path)  # exported into the cache: the run opens the cache entry
    opened, _ = count_graph_reads_and_hashes(monkeypatch)
    model = resolve_model(path)
    assert {"pfn.onnx", "rpn.onnx"} <= set(opened)
    assert model.checked_files == {}


def test_a_graph_replaced_between_its_check_and_its_open_is_refused_not_run_from_the_bytes_checked(tmp_path: Path):
    """The bytes load_model_dir checked go to the detector only while the file is still the one they were read from:
    a build into the same folder meanwhile is refused as before, when the session read the file again."""
    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.model_dir import pfn_weights

    tiny_model_dir(tmp_path / "a", seed=0)
    other = tiny_model_dir(tmp_path / "b", seed=1)
    model = load_model_dir(tmp_path / "a")
    recorded = model.checked_files["pfn.onnx"]
    model.rpn_path.write_bytes(other.rpn_path.read_bytes())  # same inputs and outputs, other weights
    with pytest.raises(ModelDirError, match="rpn.onnx': replaced since its model dir was opened"):
        PointPillars(model, device="cpu")
    for found, read in zip(pfn_weights(model, recorded), pfn_weights(model)):  # the GPU pipeline's PFN weights
        np.testing.assert_array_equal(found, read)



def test_a_graph_swapped_between_two_opens_in_one_process_is_refused_by_every_reader_of_it(tmp_path: Path):
    """A second open of a model dir in one process reads no graph (the first checked the files, of these sizes and
    times), so its detector's readers get no checked bytes and read the files themselves: the GPU pipeline's PFN
    weights and the cuDNN engine's RPN weights took a graph swapped meanwhile as it lay, where ONNX Runtime refused it.
    Each reads through graph_to_open, which refuses bytes that are not the ones model.json records."""
    from pointpillars_trt.detector import PointPillars
    from pointpillars_trt.model_dir import graph_to_open, pfn_weights
    from pointpillars_trt.runtime import EngineRequest, engine_options_for

    tiny_model_dir(tmp_path / "a", seed=0)
    other = tiny_model_dir(tmp_path / "b", seed=1)
    PointPillars(load_model_dir(tmp_path / "a"), device="cpu").close()  # the first open: its graphs read and checked
    model = load_model_dir(tmp_path / "a")
    assert model.take_checked_files() == {}  # the second: nothing read
    for graph in ("pfn", "rpn"):  # same inputs and outputs, other weights
        model.onnx_path(graph).write_bytes(other.onnx_path(graph).read_bytes())
    replaced = "{}.onnx': replaced since its model dir was opened"
    with pytest.raises(ModelDirError, match=replaced.format("pfn")):
        pfn_weights(model)  # the GPU pipeline's PFN kernel's weights
    request = EngineRequest(device_id=0, tf32=False, precision=model.precision, config_digest=model.cfg.digest(),
                            graph_sha256=model.graph_sha256("rpn"))
    with pytest.raises(ModelDirError, match=replaced.format("rpn")):  # what the cuDNN engine reads its weights from
        graph_to_open(model.rpn_path, None, engine_options_for("cudnn", request).graph_sha256)
    with pytest.raises(ModelDirError, match=replaced.format("pfn")):
        PointPillars(model, device="cpu")  # ONNX Runtime's sessions, as before
    assert graph_to_open(model.rpn_path, None, None) is None  # no record (a graph opened alone): its opener reads it

KILLED_BUILD = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tiny import tiny_config, tiny_weights
from pointpillars_trt.convert.export import export_model_dir

def stall(model):
    print(model.path, flush=True)  # the staging folder, with the graphs and model.json in it
    time.sleep(120)

cfg = tiny_config("openpcdet")
export_model_dir(tiny_weights(cfg, 0), cfg, Path(sys.argv[1]), precision="fp32", source={}, finish=stall)
"""


def test_the_staging_folder_of_a_killed_build_is_removed_by_the_next_build_beside_it(tmp_path: Path):
    """A build killed (SIGKILL, out of memory) leaves its staging folder beside the model dir: the next build of
    that model dir removes it, and keeps the staging folder of a build that still runs, of another host, and other
    folders."""
    import signal
    import subprocess
    import sys

    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": str(tests.parent)}
    with subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(tmp_path / "m"), str(tests)],
                          stdout=subprocess.PIPE, text=True, env=env) as build:
        try:  # the with closes its pipe and waits for the process
            assert build.stdout is not None
            killed = Path(build.stdout.readline().strip())
        finally:
            build.send_signal(signal.SIGKILL)
    assert killed.parent == tmp_path and killed.name.startswith(f".m.build-{build.pid}-") and killed.is_dir()
    host = killed.name.split("-")[2]  # this host's tag
    running = tmp_path / f".m.build-{os.getppid()}-{host}-0123abcd"  # a live process's build
    other = tmp_path / f".other.build-{build.pid}-{host}-0123abcd"  # another model dir's: its own build sweeps it
    # a build of another host sharing the folder (NFS, a volume of several containers): its pid says nothing here
    elsewhere = tmp_path / f".m.build-{build.pid}-0000ffff-0123abcd"
    for folder in (running, other, elsewhere):
        folder.mkdir()
    tiny_model_dir(tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m", running.name, other.name, elsewhere.name])


def test_a_damaged_or_junk_cache_entry_is_rebuilt(tmp_path: Path, assets: Path):
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    cache = tmp_path / "cache"
    with published_config_notice(checkpoint):  # each build of the entry says its config
        first = model_dir_for_checkpoint(checkpoint, cache_dir=cache)
    good = first.rpn_path.read_bytes()
    first.rpn_path.write_bytes(good[:-100])  # truncated
    with published_config_notice(checkpoint), pytest.warns(CacheNotice, match="rpn.onnx': damaged or replaced"):
        again = model_dir_for_checkpoint(checkpoint, cache_dir=cache)
    assert again.path == first.path and again.rpn_path.read_bytes() == good
    for entry in first.path.iterdir():
        entry.unlink()
    (first.path / "junk.txt").write_text("not a model dir")
    with published_config_notice(checkpoint), pytest.warns(CacheNotice, match="model.json': missing"):
        third = model_dir_for_checkpoint(checkpoint, cache_dir=cache)
    assert third.rpn_path.read_bytes() == good and not (third.path / "junk.txt").exists()


def test_a_damaged_cache_entry_is_said_as_it_is_rebuilt(tmp_path: Path, assets: Path):
    """A cache entry that is there but cannot be used is rebuilt with a CacheNotice naming it and why (it was rebuilt
    without a word, hiding a cache that keeps getting damaged); the first fill and a sound entry say nothing."""
    import warnings

    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    cache = tmp_path / "cache"
    with warnings.catch_warnings(), published_config_notice(checkpoint):  # the first fill: its config, no CacheNotice
        warnings.simplefilter("error", CacheNotice)
        first = model_dir_for_checkpoint(checkpoint, cache_dir=cache)
        assert model_dir_for_checkpoint(checkpoint, cache_dir=cache).path == first.path
    good = first.rpn_path.read_bytes()
    first.rpn_path.write_bytes(good[:1000])
    with published_config_notice(checkpoint), pytest.warns(CacheNotice) as said:  # and the rebuild its config again
        again = model_dir_for_checkpoint(checkpoint, cache_dir=cache)
    assert [str(w.message) for w in said if w.category is CacheNotice] == [
        f"rebuilding model cache entry '{first.path}', which cannot be used as it is ('{first.rpn_path}': damaged or "
        f"replaced (1000 bytes, model.json records {len(good)}); rebuild the model dir)"]
    assert again.rpn_path.read_bytes() == good


def test_a_cache_entry_another_run_put_in_place_first_is_used(tmp_path: Path, assets: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    """Two runs fill one empty cache entry at once and the other's rename lands first: this run uses that entry
    (it failed: cannot write ... (Directory not empty)), and leaves no build folder behind."""
    import shutil

    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    with published_config_notice(checkpoint):
        theirs = model_dir_for_checkpoint(checkpoint, cache_dir=tmp_path / "theirs").path
    real_replace = os.replace

    def other_run_first(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if ".build-" in Path(src).name and not os.path.lexists(dst):  # this run's finished build folder
            shutil.copytree(theirs, dst)  # the other run's, renamed in just before
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", other_run_first)
    cache = tmp_path / "cache"
    model = model_dir_for_checkpoint(checkpoint, cache_dir=cache)
    assert model.path == cache / theirs.name and model.rpn_path.read_bytes() == (theirs / "rpn.onnx").read_bytes()
    assert [p.name for p in cache.iterdir()] == [theirs.name]


def test_a_cache_entry_shared_by_configs_of_other_launch_values_runs_each_with_its_own(tmp_path: Path, assets: Path):
    # the cache key leaves the score threshold, NMS IoU and max boxes out: the entry a first config built
    # must not hand its values to a second config that differs only in them (or the reverse)
    from pointpillars_trt.config import load_config
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    cache = tmp_path / "cache"
    builtin = load_config("openpcdet_kitti_3class")
    strict = builtin.with_thresholds(score_threshold=0.3, nms_iou=0.2, max_boxes=5)
    first = model_dir_for_checkpoint(checkpoint, config=strict, cache_dir=cache)
    second = model_dir_for_checkpoint(checkpoint, cache_dir=cache)
    assert second.path == first.path
    assert first.cfg.postprocess == strict.postprocess and second.cfg.postprocess == builtin.postprocess
    assert model_dir_for_checkpoint(checkpoint, config=strict, cache_dir=cache).cfg.postprocess == strict.postprocess


def test_serves_copy_of_a_cache_entry_built_with_other_launch_values_holds_those_of_its_config(
        tmp_path: Path, assets: Path, monkeypatch: pytest.MonkeyPatch):
    # serve exports a checkpoint with its own config into the cache and copies the entry into the repository,
    # which Triton reopens by path: the copy's model.json holds that config's launch values, not the entry's
    from pointpillars_trt.apps.serve.repository import write_repository
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    builtin = load_config("openpcdet_kitti_3class")
    entry = model_dir_for_checkpoint(checkpoint, config=builtin.with_thresholds(score_threshold=0.3, max_boxes=5))
    served = write_repository(checkpoint, tmp_path / "repo", device="cpu") / "1" / "model"
    assert load_model_dir(served).cfg.postprocess == builtin.postprocess
    assert load_model_dir(entry.path).cfg.postprocess.max_boxes == 5  # the entry itself is left as it was


def test_a_model_dir_keeps_its_label_base_and_the_digest_it_recorded(tmp_path: Path, assets: Path) -> None:
    """label_base configures nothing now, but model dirs hold it and their recorded digests hash it: one built from a
    real OpenPCDet checkpoint records 1 and the digest earlier versions recorded for its config (test_config's
    RECORDED_DIGESTS), and one whose config had none (0) as an earlier version wrote it still opens."""
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    builtin = load_config("openpcdet_kitti_3class")
    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    with published_config_notice(checkpoint):
        built = model_dir_for_checkpoint(checkpoint, cache_dir=tmp_path / "cache")
    meta = json.loads((built.path / METADATA_FILE).read_text())
    assert meta["config"]["label_base"] == 1 and meta["config_digest"] == "8489c6b29aa62db6" == builtin.digest()
    assert load_model_dir(built.path, builtin).cfg.digest() == "8489c6b29aa62db6"
    _edit_metadata(built.path, lambda m: (m["config"].pop("label_base"), m.update(config_digest="b10d71c964330991")))
    older = load_model_dir(built.path)
    assert older.cfg.digest() == "b10d71c964330991" and older.cfg.to_dict()["label_base"] == 0
    _edit_metadata(built.path, lambda m: m["config"].update(label_base=1))  # still hashed: an edit shows
    with pytest.raises(ModelDirError, match="does not match the stored config"):
        load_model_dir(built.path)


def test_a_model_dir_opened_for_a_config_of_its_digest_runs_with_that_configs_launch_values(tmp_path: Path,
                                                                                            assets: Path) -> None:
    # `infer --model DIR --config strict.yaml` and from_model_dir(DIR, config=strict), where strict differs from
    # the build's config only in its launch values: they ran the dir's values without a word
    from pointpillars_trt.apps.infer import load_model_dir_of_config
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    with published_config_notice(checkpoint):
        built = model_dir_for_checkpoint(checkpoint, cache_dir=tmp_path / "cache")
    builtin = load_config("openpcdet_kitti_3class")
    strict = builtin.with_thresholds(score_threshold=0.3, nms_iou=0.2, max_boxes=5)
    yaml_path = tmp_path / "strict.yaml"
    yaml_path.write_text(yaml.safe_dump(strict.to_dict()))
    assert load_model_dir(built.path, strict).cfg.postprocess == strict.postprocess
    assert load_model_dir_of_config(built.path, str(yaml_path)).cfg.postprocess == strict.postprocess
    assert load_model_dir(built.path, builtin).cfg.postprocess == builtin.postprocess
    assert load_model_dir(built.path).cfg.postprocess == builtin.postprocess  # the folder is left as it was


@pytest.fixture
def read_only(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Make a folder's file system refuse every change under it (EROFS), as a read-only mount does, root or not
    (chmod does not stop root): the system calls that create, replace or remove an entry fail there."""
    roots: list[str] = []

    def under(path: object) -> bool:
        return isinstance(path, (str, os.PathLike)) and any(
            os.path.abspath(os.fspath(path)).startswith(root + os.sep) for root in roots)

    def refusing(call: str, writes: Callable[..., bool] = lambda *args: True) -> None:
        real = getattr(os, call)

        def refused(*args: object, **kwargs: object) -> object:
            if any(under(arg) for arg in args[:2]) and writes(*args):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(args[0]))  # type: ignore[arg-type]
            return real(*args, **kwargs)

        monkeypatch.setattr(os, call, refused)

    refusing("open", lambda path, flags, *rest: bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)))
    for call in ("mkdir", "rmdir", "unlink", "replace", "rename", "link"):
        refusing(call)
    return lambda folder: roots.append(os.path.abspath(folder))


def test_a_read_only_cache_entry_opens_with_other_launch_values_without_a_write(tmp_path: Path, assets: Path,
                                                                               read_only: Callable[[Path], None]):
    # a config that differs from the entry's only in its launch values is no reason to write the cache: on a
    # read-only one that write was an OSError naming a hidden temp file
    from pointpillars_trt.config import load_config
    from pointpillars_trt.convert.export import model_dir_for_checkpoint
    from pointpillars_trt.detector import PointPillars

    checkpoint = assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"
    cache = tmp_path / "cache"
    builtin = load_config("openpcdet_kitti_3class")
    with published_config_notice(checkpoint):
        entry = model_dir_for_checkpoint(checkpoint, cache_dir=cache).path
    files = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in sorted(cache.rglob("*"))
             if path.is_file()}
    read_only(cache)
    stricter = {**builtin.to_dict(), "postprocess": {**builtin.to_dict()["postprocess"], "score_threshold": 0.4}}
    detector = PointPillars.from_checkpoint(checkpoint, config=stricter, cache_dir=cache, device="cpu")
    assert detector.model.path == entry and detector.cfg.postprocess.score_threshold == 0.4
    assert {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in sorted(cache.rglob("*"))
            if path.is_file()} == files
    assert load_model_dir(entry).cfg.postprocess == builtin.postprocess


def test_a_cache_that_cannot_be_written_is_named_with_the_fix(tmp_path: Path, assets: Path):
    from pointpillars_trt.convert.export import model_dir_for_checkpoint

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ModelDirError) as info:
        model_dir_for_checkpoint(assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth", cache_dir=a_file / "c")
    assert str(info.value) == (f"cache_dir '{a_file / 'c'}' cannot be written (Not a directory): pass a writable "
                               "cache_dir, or build a model dir with `pointpillars-trt build` and use that instead of "
                               "the checkpoint")
    assert list(tmp_path.iterdir()) == [a_file]


@pytest.mark.parametrize("text", ["[" * 200_000 + "]" * 200_000, '{"format_version": ' + "9" * 5000 + "}"])
def test_a_hostile_model_json_is_one_clear_error(tmp_path: Path, text: str):
    tiny_model_dir(tmp_path)
    (tmp_path / "model.json").write_text(text)
    with pytest.raises(ModelDirError, match="model.json': not a model.json this package wrote"):
        load_model_dir(tmp_path)


def test_a_fifo_as_model_json_is_refused_without_blocking(tmp_path: Path):
    tiny_model_dir(tmp_path)
    (tmp_path / "model.json").unlink()
    os.mkfifo(tmp_path / "model.json")
    with pytest.raises(ModelDirError, match="model.json"):
        load_model_dir(tmp_path)


def _record_graph(folder: Path, graph: str) -> None:
    """Make model.json record the graph file's current sha256 and size (what a careless copy would do)."""
    import hashlib

    data = (folder / f"{graph}.onnx").read_bytes()

    def change(meta: dict) -> None:  # type: ignore[type-arg]
        meta["graphs"][graph].update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))

    _edit_metadata(folder, change)


def test_a_graph_whose_io_differs_from_the_record_is_refused_at_load(tmp_path: Path):
    """An fp16 RPN (float16 canvas) in an fp32 dir, with its sha256 and size recorded: one error at load
    naming the graph, the tensor and both dtypes, instead of a failure on every frame."""
    tiny_model_dir(tmp_path / "a", precision="fp32")
    tiny_model_dir(tmp_path / "b", precision="fp16")
    (tmp_path / "a" / "rpn.onnx").write_bytes((tmp_path / "b" / "rpn.onnx").read_bytes())
    _record_graph(tmp_path / "a", "rpn")
    with pytest.raises(ModelDirError, match=r"rpn.onnx': inputs canvas float16 .*records canvas float32"):
        load_model_dir(tmp_path / "a")


def test_a_graph_with_a_renamed_output_is_refused_at_load(tmp_path: Path):
    tiny_model_dir(tmp_path)
    model = onnx.load(str(tmp_path / "pfn.onnx"))
    old = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = ["renamed" if name == old else name for name in node.output]
    model.graph.output[0].name = "renamed"
    (tmp_path / "pfn.onnx").write_bytes(model.SerializeToString())
    _record_graph(tmp_path, "pfn")
    with pytest.raises(ModelDirError, match=r"pfn.onnx': outputs renamed float32 .*records pillar_features"):
        load_model_dir(tmp_path)


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[: len(data) // 2], r"pfn.onnx': not a readable ONNX graph \(DecodeError\)$"),
    (lambda data: _without_outputs(data), r"pfn.onnx': outputs , but model.json records pillar_features float32 "
                                          r"\[num_pillars, 16\]: not the graph this model dir was built with"),
])
def test_a_graph_that_cannot_be_read_or_declares_no_output_is_refused_at_load_though_recorded(tmp_path: Path,
                                                                                            damage, message):
    """A graph recorded with its sha256 and size (a careless copy) is still checked for what it declares: one cut
    short is unreadable, and one of no output is not the graph built."""
    tiny_model_dir(tmp_path)
    path = tmp_path / "pfn.onnx"
    path.write_bytes(damage(path.read_bytes()))
    _record_graph(tmp_path, "pfn")
    with pytest.raises(ModelDirError, match=message):
        load_model_dir(tmp_path)


def _without_outputs(data: bytes) -> bytes:
    model = onnx.load_model_from_string(data)
    del model.graph.output[:]
    return model.SerializeToString()


NO_ONNX = """
import sys
sys.path.insert(0, sys.argv[2])
{opens}
print(sorted(name for name in sys.modules if name.split(".")[0] == "onnx"))
"""
OPENS = {
    "the CPU detector": """
from pointpillars_trt.detector import PointPillars

with PointPillars.from_model_dir(sys.argv[1], device="cpu"):
    pass
""",
    "the GPU pipeline's weights": """
from pointpillars_trt.model_dir import graph_initializers, graph_to_open, load_model_dir, pfn_weights
from pointpillars_trt.runtime.cudnn import read_rpn_weights

model = load_model_dir(sys.argv[1])
files = model.take_checked_files()
pfn_weights(model, files.get("pfn.onnx"))  # the PFN kernel's, as the GPU pipeline reads them
rpn = graph_to_open(model.rpn_path, files.get("rpn.onnx"), model.graph_sha256("rpn"))
read_rpn_weights(graph_initializers(model.rpn_path, rpn), model.cfg)  # the cuDNN engine's, as it reads them
""",
}


@pytest.mark.parametrize("opens", OPENS)
def test_a_model_dir_and_the_weights_of_its_detectors_open_without_importing_onnx(tmp_path: Path, opens: str):
    """The graphs' inputs and outputs are read from the records that declare them, and their weights from the
    initializer records: a whole parse of each graph imported onnx (~50 ms at every start of infer, of a Triton
    instance, of a Ray worker), which nothing else of a detector uses, and decoded every node and weight."""
    import subprocess
    import sys

    tiny_model_dir(tmp_path)
    repo = Path(__file__).resolve().parent.parent
    found = subprocess.run([sys.executable, "-c", NO_ONNX.format(opens=OPENS[opens]), str(tmp_path), str(repo)],
                           capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"


def test_a_record_that_its_config_contradicts_is_refused(tmp_path: Path):
    tiny_model_dir(tmp_path)
    _edit_metadata(tmp_path, lambda meta: meta["graphs"]["pfn"]["outputs"][0].update(shape=["num_pillars", 64]))
    with pytest.raises(ModelDirError, match=r"the outputs recorded for pfn.onnx .* not what its config gives"):
        load_model_dir(tmp_path)


def test_a_sparse_4gib_graph_is_refused_by_its_size_before_hashing(tmp_path: Path):
    import time

    tiny_model_dir(tmp_path)
    with open(tmp_path / "rpn.onnx", "r+b") as f:
        f.truncate(4 * 2**30)
    start = time.monotonic()
    with pytest.raises(ModelDirError, match=r"rpn.onnx': damaged or replaced \(4294967296 bytes, model.json records"):
        load_model_dir(tmp_path)
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("meta", ['{"name": "my project"}', "not json", '{"format_version": 2}'])
def test_a_folder_with_a_model_json_that_is_not_ours_is_never_overwritten(tmp_path: Path, meta: str):
    (tmp_path / "model.json").write_text(meta)
    (tmp_path / "train.py").write_text("mine")
    cfg = tiny_config()
    with pytest.raises(ModelDirError, match="not a model dir"):
        export_model_dir(tiny_weights(cfg), cfg, tmp_path, precision="fp32", source={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "train.py"]
    assert (tmp_path / "model.json").read_text() == meta


def test_a_model_dir_holding_user_files_is_not_rebuilt_over_them(tmp_path: Path):
    tiny_model_dir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "cudnn").mkdir()  # the cuDNN engine's plan cache is the model dir's own
    (tmp_path / "timing.cache").write_bytes(b"\0")  # so is TensorRT's timing cache (build --backend tensorrt)
    cfg = tiny_config()
    with pytest.raises(ModelDirError, match=r"also holds 'notes.txt', which a rebuild would delete"):
        export_model_dir(tiny_weights(cfg, seed=1), cfg, tmp_path, precision="fp32", source={})
    assert (tmp_path / "notes.txt").read_text() == "mine"
    (tmp_path / "notes.txt").unlink()
    export_model_dir(tiny_weights(cfg, seed=1), cfg, tmp_path, precision="fp32", source={})
    load_model_dir(tmp_path)
