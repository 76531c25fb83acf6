"""Writing the Triton model repository that ``pointpillars-trt serve`` starts ``tritonserver`` on."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
import secrets
from collections.abc import Iterator
from pathlib import Path

from ...config import int_within
from ...errors import InputError, one_line, safe_repr
from ...file_writes import lies_in, replace_folder
from ...graph_io import MAX_BATCH
from ...model_dir import ModelDir, load_model_dir
from ...points import MAX_FRAME_POINTS
from ...runtime_options import RuntimeOptions, max_threads
from ..run_settings import model_dir_identity
from .reply import LATER_STATS, STATS

MODEL_NAME = "pointpillars"
#: Points one request may carry before the model refuses it (a KITTI scan has ~120 k).
DEFAULT_SERVED_MAX_POINTS = 1_000_000
#: Most model instances per GPU (or on the CPU), pipelines per instance, and the longest a request may
#: wait for a batch (10 s).
MAX_INSTANCES = 64
MAX_PIPELINES_PER_INSTANCE = 8
MAX_QUEUE_DELAY_US = 10_000_000
_TEMPLATE = Path(__file__).with_name("triton_model.py")


def resolve_model(model: str | os.PathLike[str], config: str | None = None, precision: str | None = None) -> ModelDir:
    """A model dir as given, or the cached model dir exported from a .pth checkpoint, as local ``infer`` opens
    ``--model`` with ``--config`` and ``--precision`` (a model dir: refused unless built for ``config``, whose launch
    values it then runs with; a checkpoint: exported with ``config`` in ``precision``, default fp32): what reopens
    it by path (Ray's workers) runs the model the run names. It holds none of the bytes its check read (19-24 MB of
    a KITTI or nuScenes rpn.onnx, ``ModelDir.take_checked_files``): no detector opens it here, and serve and a Ray
    run keep it for their whole run."""
    from ..infer import existing_model_path, load_model_dir_of_config, rebuild_named

    path = existing_model_path(os.fspath(model))
    if path.is_file():
        from ...convert.export import model_dir_for_checkpoint

        found = model_dir_for_checkpoint(path, config=config, precision=precision or "fp32")
    else:
        with rebuild_named(path, config):
            found = load_model_dir_of_config(path, config) if config else load_model_dir(path)
    found.take_checked_files()  # not held for the run: what runs the model reads and checks the files itself
    return found


#: Model instances a GPU gets by default: each is a process (its own interpreter lock), and on an H200
#: with 16 cores, 32 gRPC clients got 2,761 frames/s from 2 instances, 2,695 from 4 and 2,510 from 8
#: (on a busier machine: 1,414 from 1, 1,605 from 2, 1,857 from 4).
DEFAULT_GPU_INSTANCES = 2


def gpu_instance_kind(device: str) -> tuple[str, list[int] | None]:
    """(KIND_GPU, [N] or None for every GPU) for a CUDA device, (KIND_CPU, None) for the CPU path;
    "auto" is decided here, where the server will run."""
    from ...devices import pick_device

    kind, index, _ = pick_device(device)
    if kind == "cpu":
        return "KIND_CPU", None
    return "KIND_GPU", [index] if ":" in device else None


def model_config_text(model: ModelDir, *, instances: int | None, max_batch: int, max_queue_delay_us: int,
                      device: str, max_points: int, runtime: RuntimeOptions | None = None,
                      pipelines: int = 1) -> str:
    """config.pbtxt: ragged FP32 [-1, C] points (C: the model's point columns, 4 or 5 with the time lag),
    optional per-request thresholds (score_threshold and nms_iou FP32 [1], max_boxes INT32 [1]), the
    outputs (``velocity`` FP32 [-1, 2] too for a model that predicts it), dynamic batching up to
    ``max_batch`` frames, K instances per GPU (default ``DEFAULT_GPU_INSTANCES``) or on the CPU
    (default 1, at most one a core); each instance's ``pipelines`` detectors (of that batch) run as ``runtime`` says
    (stored as JSON; the device is the instance's). Instances are processes, which time-slice a
    GPU; an instance's pipelines take its batches in turn, one on the GPU while Triton moves the next.
    The model's point range and, where its model dir records it, whether it was trained on the camera view's
    points only are parameters too: ``infer --server`` draws its --viz pictures and decides its default crop by
    them, as local ``infer`` does by the model dir; and the model's identity (weights, config and precision:
    ``run_settings.model_dir_identity``), which ``infer --server`` records in --out's settings as a local run does.

    The Python backend hands each request of a ragged batch to ``execute`` on its own, so the model
    splits nothing; the BATCH_ELEMENT_COUNT batch input documents the split for other backends.
    The points' reshape to [1, -1, C] (``execute`` sees a request of B frames as [B, 1, N, C]) is for a raw
    client's request of batch size 0: Triton hands such a request to the backend without its batch dimension,
    and the Python backend counts the frames of a batch by the first dimension of each request's first input:
    without the reshape, a batch of it alone counts 0 frames and is released unanswered (its client waited for
    ever, and a stop of the server for its exit timeout); with it, it reaches ``execute`` as [1, N, C], refused.
    """
    kind, gpus = gpu_instance_kind(device)
    if instances is None:
        instances = DEFAULT_GPU_INSTANCES if kind == "KIND_GPU" else 1
    limits = {"--instances": (instances, 1, MAX_INSTANCES),
              "--pipelines": (pipelines, 1, MAX_PIPELINES_PER_INSTANCE),
              "--max-batch": (max_batch, 1, MAX_BATCH),
              "--max-queue-delay-us": (max_queue_delay_us, 0, MAX_QUEUE_DELAY_US),
              "--max-points": (max_points, 1, MAX_FRAME_POINTS)}
    for option, (value, low, high) in limits.items():
        if int_within(value, low, high) is None:
            raise InputError(f"serve: {option} {value!r}: expected an integer in {low}..{high}")
    if kind == "KIND_CPU" and instances > max_threads():
        raise InputError(f"serve: --instances {instances} on the CPU: at most {max_threads()}, one a core of this "
                         "machine; each instance is a process with its own copy of the model (~0.7 GB for a KITTI "
                         "model) that runs its frames on every core, so more instances only share the cores")
    gpu_list = f", gpus: [{', '.join(map(str, gpus))}]" if gpus else ""
    runtime = runtime or RuntimeOptions()
    max_boxes = runtime.thresholds.max_boxes or model.cfg.postprocess.max_boxes  # what a request may ask for at most
    params = {"model_dir": "model", "device": "cpu" if kind == "KIND_CPU" else "cuda",
              "pipelines": str(pipelines),
              "max_points": str(max_points), "max_boxes": str(max_boxes), "class_names": ",".join(model.cfg.classes),
              "point_range": ",".join(repr(float(v)) for v in model.cfg.voxel.point_range),
              **({} if model.fov_points_only is None else {"fov_points_only": str(model.fov_points_only).lower()}),
              "model_identity": json.dumps(model_dir_identity(model), sort_keys=True).replace('"', '\\"'),
              "runtime_options": json.dumps(runtime.to_dict()).replace('"', '\\"')}
    outputs = [("boxes", "TYPE_FP32", "[-1, 7]"), ("scores", "TYPE_FP32", "[-1]"), ("labels", "TYPE_INT32", "[-1]")]
    outputs += [(name, "TYPE_INT32", "[1]") for name in (*STATS, *LATER_STATS)]
    if model.cfg.box_code.velocity:
        outputs.append(("velocity", "TYPE_FP32", "[-1, 2]"))
    columns = model.cfg.num_point_columns
    lines = [
        f'name: "{MODEL_NAME}"',
        'backend: "python"',
        f"max_batch_size: {max_batch}",
        f'input [{{ name: "points", data_type: TYPE_FP32, dims: [-1, {columns}], '
        f'allow_ragged_batch: true, reshape: {{ shape: [1, -1, {columns}] }} }},',
        '  { name: "score_threshold", data_type: TYPE_FP32, dims: [1], optional: true },',
        '  { name: "nms_iou", data_type: TYPE_FP32, dims: [1], optional: true },',
        '  { name: "max_boxes", data_type: TYPE_INT32, dims: [1], optional: true }]',
        'batch_input [{ kind: BATCH_ELEMENT_COUNT, target_name: "points_element_count", data_type: TYPE_INT32, '
        'source_input: "points" }]',
        "output [",
        ",\n".join(f'  {{ name: "{name}", data_type: {dtype}, dims: {dims} }}' for name, dtype, dims in outputs),
        "]",
        f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}",
        f"instance_group [{{ count: {instances}, kind: {kind}{gpu_list} }}]",
        *(f'parameters {{ key: "{key}", value: {{ string_value: "{value}" }} }}' for key, value in params.items()),
    ]
    return "\n".join(lines) + "\n"


#: What a model folder this module writes holds (``__pycache__``: the Python backend's, once served).
_OWN_ENTRIES = {".": {"config.pbtxt", "1"}, "1": {"model", "model.py", "python_path.txt", "__pycache__"}}


def refuse_repository_in_model(model: str | os.PathLike[str], repository: str | os.PathLike[str]) -> None:
    """A repository in (or as) the model dir would copy the model dir into itself, over and over (the
    repository holds a copy of it): refused before anything is written."""
    if lies_in(repository, model):
        raise InputError(f"--repository {safe_repr(str(repository))} lies in the model dir {safe_repr(str(model))}, "
                         "which the repository holds a copy of: give a folder outside it")


#: Held (an exclusive flock) by the serve that writes and serves a repository, for as long as it runs.
LOCK_FILE = ".pointpillars-serve.lock"


@contextlib.contextmanager
def repository_held(repository: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``repository`` for this process (created if missing): a second serve that would rewrite the
    model under a running one is refused, naming the process that holds it. The lock goes with the
    process, so a killed serve leaves nothing to clean up. On a file system that refuses locks, serve goes on
    unlocked, said in one warning."""
    root = Path(repository)
    if root.exists() and not root.is_dir():
        raise InputError(f"--repository {safe_repr(str(root))} is a file; give a folder (created if missing)")
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only mount, a folder of another user, a file on the way: the option is named
        raise _cannot_write(root, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise InputError(f"--repository {safe_repr(str(root))} is in use by a running serve (pid {holder}); "
                             "stop it, or give another --repository") from None
        except OSError as exc:  # a file system without locks (ENOLCK: an NFS mount without its lock daemon)
            print(f"warning: --repository {safe_repr(str(root))} is not locked against a second serve: its file "
                  f"system refuses a lock ({exc.strerror or one_line(exc)}); start no other serve into it while this "
                  "one runs (it would rewrite the model under this one), or give a folder on a local disk",
                  file=sys.stderr, flush=True)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: the pid is the first byte serve writes there
            raise _cannot_write(root, exc) from None
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # no pid of a process that has ended is left in it (the empty file stays: unlinked,
            # another serve could lock a file this name no longer leads to)
    finally:
        os.close(fd)  # releases the lock


def _cannot_write(root: Path, exc: OSError) -> InputError:
    """--repository's one error line for a write there that failed (a read-only mount, a full disk). A folder
    copy's ``shutil.Error`` lists each file's error as text: the first one's reason tells."""
    reason = exc.strerror or one_line(exc)
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        reason = re.sub(r"^\[Errno \d+\] ", "", str(exc.args[0][0][-1])).split(": ", 1)[0]
    return InputError(f"--repository {safe_repr(str(root))}: cannot write there ({reason}); give a folder serve can "
                      "write (created if missing): it writes the model's copy there and Triton serves it from there")


def _check_replaceable(target: Path) -> None:
    """A ``target`` already there is replaced only when it is a model folder this module wrote: a user's
    folder of that name (or a link) is refused, never deleted."""
    if os.path.lexists(target):
        foreign = _foreign_entry(target)
        if foreign is not None:
            raise InputError(f"--repository: {safe_repr(str(target))} exists and is not a model folder that serve "
                             f"wrote ({foreign}); move it away or pick another --repository")


def _foreign_entry(target: Path) -> str | None:
    """What in ``target`` this module did not write (None: all of it is its own)."""
    for sub, allowed in _OWN_ENTRIES.items():
        folder = target / sub
        if sub != "." and not os.path.lexists(folder):
            continue
        if folder.is_symlink() or not folder.is_dir():
            return f"{safe_repr(sub)} is not a folder"
        extra = sorted(set(os.listdir(folder)) - allowed)
        if extra:
            return f"it holds {safe_repr(extra[0])}"
    return None


def write_repository(model: ModelDir | str | os.PathLike[str], repository: str | os.PathLike[str], *,
                     instances: int | None = None,
                     max_batch: int = MAX_BATCH, max_queue_delay_us: int = 2000, device: str = "auto",
                     max_points: int = DEFAULT_SERVED_MAX_POINTS, runtime: RuntimeOptions | None = None,
                     pipelines: int = 1) -> Path:
    """Write ``REPOSITORY/pointpillars`` (config.pbtxt, 1/model.py, 1/model/ = a copy of the model dir,
    so the repository moves as one folder) and return its path. It is built beside and renamed into
    place, replacing an older one; other models in the repository are left alone. ``model``: a model dir opened
    already (``resolve_model``), or its path or checkpoint."""
    from ...convert.export import copy_model_dir

    found = model if isinstance(model, ModelDir) else resolve_model(model)
    text = model_config_text(found, instances=instances, max_batch=max_batch, max_queue_delay_us=max_queue_delay_us,
                             device=device, max_points=max_points, runtime=runtime, pipelines=pipelines)
    root = Path(repository)
    root.mkdir(parents=True, exist_ok=True)
    target = root / MODEL_NAME
    _check_replaceable(target)
    staging = root / f".{MODEL_NAME}.{secrets.token_hex(4)}.tmp"
    try:
        version = staging / "1"
        copy_model_dir(found, version / "model")  # with the launch values of a cache entry opened for them
        shutil.copyfile(_TEMPLATE, version / "model.py")
        (version / "python_path.txt").write_text("\n".join(p for p in sys.path if p) + "\n", encoding="utf-8")
        (staging / "config.pbtxt").write_text(text)
        replace_folder(staging, target)  # never a moment with a half-deleted model folder
    except OSError as exc:
        raise _cannot_write(root, exc) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
