"""Every numeric option of ``serve`` and of ``infer --server/--ray`` is range-checked while parsing:
one ``error:`` line naming the option and its range, before any model, server or cluster is touched."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys

import pytest

from pointpillars_trt.apps.cli import main
from pointpillars_trt.apps.serve.client import RemoteDetector
from pointpillars_trt.apps.serve.repository import model_config_text
from pointpillars_trt.errors import InputError

INFER = ["infer", "frames/", "--model", "m", "--out", "o"]
SERVE = ["serve", "--model", "m", "--repository", "r"]


def parse_error(argv: list[str]) -> str:
    """The ``error:`` line of ``pointpillars-trt ARGV`` (which must stop with exit code 2)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), \
            pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    # argparse prefixes the program ("pointpillars-trt infer: error: ...") and may print its usage first
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ") or ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in err.getvalue(), err.getvalue()
    return lines[0]


@pytest.mark.parametrize("argv, option, value, expected", [
    (INFER, "--in-flight", "-3", "1..1024"),
    (INFER, "--in-flight", "0", "1..1024"),
    (INFER, "--in-flight", "100000", "1..1024"),
    (INFER, "--workers", "-1", "1..4096"),
    (INFER, "--workers", "2.5", "not an integer"),
    (INFER, "--gpus-per-worker", "-1", "[0, 64]"),
    (INFER, "--gpus-per-worker", "nan", "[0, 64]"),
    (INFER, "--gpus-per-worker", "inf", "[0, 64]"),
    (SERVE, "--instances", "0", "1..64"),
    (SERVE, "--instances", "1000", "1..64"),
    (SERVE, "--max-batch", "-8", "1..8"),
    (SERVE, "--max-batch", "9", "1..8"),
    (SERVE, "--max-points", "0", "1..16777216"),
    (SERVE, "--max-points", "100000000", "1..16777216"),
    (SERVE, "--max-queue-delay-us", "-1", "0..10000000"),
    (SERVE, "--http-port", "0", "1..65535"),
    (SERVE, "--grpc-port", "70000", "1..65535"),
    (SERVE, "--metrics-port", "-80", "1..65535"),
    (SERVE, "--ready-timeout", "0", "(0, 86400]"),
    (SERVE, "--ready-timeout", "nan", "(0, 86400]"),
    (SERVE, "--ready-timeout", "-5", "(0, 86400]"),
    (SERVE, "--exit-timeout-secs", "0", "1..86400"),  # tritonserver's own option: whole seconds
    (SERVE, "--exit-timeout-secs", "-8", "1..86400"),
    (SERVE, "--exit-timeout-secs", "100000", "1..86400"),
    (SERVE, "--exit-timeout-secs", "inf", "not an integer"),
    (SERVE, "--exit-timeout-secs", "nan", "not an integer"),
    (SERVE, "--exit-timeout-secs", "2.5", "not an integer"),
    # checked while parsing, as infer's (it was refused only once a checkpoint was exported)
    (SERVE, "--device", "gpu", "'gpu': expected auto, cpu, cuda or cuda:N; did you mean cuda?"),
    (INFER, "--device", "0", "'0': expected auto, cpu, cuda or cuda:N; did you mean cuda:0?"),  # trtexec's --device=0
    (INFER, "--server", "127.0.0.1", "expected HOST:PORT"),  # no port: a client would try gRPC's 443
    (INFER, "--server", "localhost:0", "expected HOST:PORT"),
    (INFER, "--server", ":8001", "expected HOST:PORT"),
    (INFER, "--server", "::1:8001", "an IPv6 address goes in brackets before its port, e.g. [::1]:8001"),
    (INFER, "--server", "[::1]", "expected HOST:PORT"),
    # a URL, as Triton's clients write a server: the fix, without the scheme, with the protocol it named
    (INFER, "--server", "http://127.0.0.1:59891", "'http://127.0.0.1:59891': give HOST:PORT without a scheme, and the "
                                                  "protocol with --protocol: --server 127.0.0.1:59891 --protocol http"),
    (INFER, "--server", "grpc://[::1]:8001/", "--server [::1]:8001 --protocol grpc"),
    # a URL without its port: Triton's default port of its protocol (a fix without one was refused in turn)
    (INFER, "--server", "http://localhost", "--server localhost:8000 --protocol http"),
    (INFER, "--server", "grpc://[::1]/", "--server [::1]:8001 --protocol grpc"),
    (INFER, "--server", "tcp://triton", "--server triton:8001 --protocol grpc, or --server triton:8000 --protocol http"),
    (INFER, "--server", "https://triton:443", "the client speaks no TLS: give the server's plain HTTP or gRPC endpoint"),
])
def test_out_of_range_option_is_one_error_line(argv: list[str], option: str, value: str, expected: str) -> None:
    line = parse_error([*argv, f"{option}={value}"])
    assert option in line and expected in line, line


@pytest.mark.parametrize("url", ["http://localhost", "grpc://triton.example/", "http://127.0.0.1:59891"])
def test_the_fix_a_url_server_is_told_is_taken(url: str) -> None:
    """The --server and --protocol the error suggests, given instead, parse."""
    import re

    from pointpillars_trt.apps.ranges import host_port

    with pytest.raises(argparse.ArgumentTypeError) as refused:
        host_port(url)
    fix = re.search(r"--server (\S+) --protocol (\w+)$", str(refused.value))
    assert fix is not None, refused.value
    assert host_port(fix[1]) == fix[1]


def test_the_fix_for_a_url_names_an_odd_host_on_one_line() -> None:
    """A URL whose host holds a newline and an ESC: the suggested --server names it escaped, one printable line."""
    from pointpillars_trt.apps.ranges import host_port

    with pytest.raises(argparse.ArgumentTypeError) as refused:
        host_port("grpc://ho\nst\x1b[31m")
    message = str(refused.value)
    assert message.isprintable() and "--server ho\\nst\\x1b[31m:8001 --protocol grpc" in message, message


def test_the_same_port_twice_is_refused_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["serve", "--model", str(tmp_path / "missing"), "--repository", str(tmp_path / "repo"),
                   "--http-port", "8000", "--grpc-port", "8000"])
    assert rc == 2 and "must differ; got [8000, 8000]" in err.getvalue(), err.getvalue()
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("option", ["--host", "--http-host"])
def test_a_host_serve_cannot_bind_is_refused_before_anything_is_written(tmp_path, option: str) -> None:  # type: ignore[no-untyped-def]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["serve", "--model", str(tmp_path / "missing"), "--repository", str(tmp_path / "repo"),
                   option, "192.0.2.1"])  # TEST-NET-1: documentation only, never an address of this machine
    lines = err.getvalue().splitlines()
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {option} '192.0.2.1': cannot bind there (") and "0.0.0.0" in lines[0], lines
    assert not (tmp_path / "repo").exists()



def test_a_host_name_is_served_on_its_numeric_address_and_ipv6_is_refused() -> None:
    """tritonserver's HTTP and metrics endpoints take numeric addresses only: given ``localhost`` they listened
    nowhere reachable, and the start waited out --ready-timeout."""
    import socket

    from pointpillars_trt.apps.serve.server import check_bind_host

    assert check_bind_host("localhost") == socket.gethostbyname("localhost")
    assert check_bind_host("127.0.0.1") == "127.0.0.1"
    with pytest.raises(InputError, match=r"--host '::1': not an IPv4 address, nor a name of one"):
        check_bind_host("::1")

@pytest.mark.parametrize("options, option", [
    ({"instances": 0}, "--instances"), ({"max_batch": 99}, "--max-batch"),
    ({"max_queue_delay_us": -1}, "--max-queue-delay-us"), ({"max_points": True}, "--max-points"),
])
def test_repository_api_checks_the_same_ranges(options: dict[str, object], option: str) -> None:
    settings = {"instances": 1, "max_batch": 8, "max_queue_delay_us": 0, "device": "cpu", "max_points": 10,
                **options}
    with pytest.raises(InputError, match=option):
        model_config_text(None, **settings)  # type: ignore[arg-type]  # refused before the model is read


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf"), True])
def test_remote_detector_timeout_is_checked_before_connecting(timeout: object) -> None:
    pytest.importorskip("tritonclient.grpc", reason="tritonclient not installed")
    with pytest.raises(InputError, match="timeout"):
        RemoteDetector("127.0.0.1:1", timeout=timeout)  # type: ignore[arg-type]


def instance_count(device: str) -> str:
    """The instance_group line of the repository config ``serve`` writes without ``--instances``."""
    from tiny import tiny_config

    from pointpillars_trt.model_dir import ModelDir

    text = model_config_text(ModelDir(".", tiny_config(), {"precision": "fp32"}), instances=None, max_batch=8,
                             max_queue_delay_us=0, device=device, max_points=10)
    return next(line for line in text.splitlines() if line.startswith("instance_group"))


def test_one_instance_on_the_cpu_by_default() -> None:
    assert instance_count("cpu") == "instance_group [{ count: 1, kind: KIND_CPU }]"


def test_cpu_instances_are_capped_at_the_cores() -> None:
    """Each CPU instance is a process holding its own model and running on every core: one a core at most."""
    from tiny import tiny_config

    from pointpillars_trt.model_dir import ModelDir

    cores = len(os.sched_getaffinity(0))  # the cores this process may run on
    model = ModelDir(".", tiny_config(), {"precision": "fp32"})
    text = model_config_text(model, instances=cores, max_batch=8, max_queue_delay_us=0, device="cpu", max_points=10)
    assert f"count: {cores}, kind: KIND_CPU" in text
    with pytest.raises(InputError, match=rf"--instances {cores + 1} on the CPU: at most {cores}, one a core"):
        model_config_text(model, instances=cores + 1, max_batch=8, max_queue_delay_us=0, device="cpu", max_points=10)


@pytest.mark.cuda
def test_two_instances_a_gpu_by_default(gpu_engine) -> None:  # type: ignore[no-untyped-def]
    assert instance_count("cuda") == "instance_group [{ count: 2, kind: KIND_GPU }]"
    assert instance_count("cuda:0") == "instance_group [{ count: 2, kind: KIND_GPU, gpus: [0] }]"


def run_error(argv: list[str]) -> str:
    """The one ``error:`` line of ``pointpillars-trt ARGV``, which must exit 2 before touching anything."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err.getvalue(), err.getvalue()
    return lines[0]


@pytest.mark.parametrize("extra, named, needed", [
    (["--in-flight", "5"], "--in-flight", "--server"),
    (["--protocol", "http"], "--protocol", "--server"),
    (["--workers", "3"], "--workers", "--ray"),
    (["--gpus-per-worker", "1", "--ray-address", "auto"], "--ray-address, --gpus-per-worker", "--ray"),
    (["--server", "127.0.0.1:1", "--workers", "3"], "--workers", "--ray"),
    (["--ray", "--in-flight", "5"], "--in-flight", "--server"),
])
def test_options_of_the_path_not_taken_are_refused(tmp_path, extra: list[str], named: str, needed: str) -> None:  # type: ignore[no-untyped-def]
    """``--workers`` without ``--ray``, ``--in-flight`` without ``--server``, ...: refused, not ignored."""
    line = run_error(["infer", str(tmp_path), "--out", str(tmp_path / "o"), *extra])
    assert f"{named}: only used with {needed}" in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("given, missing", [
    (["--model", "M"], "--out DIR"), (["--out", "O"], "--model"), ([], "--model and --out DIR"),
])
def test_ray_without_its_model_or_out_names_only_what_is_missing(tmp_path, given: list[str], missing: str) -> None:  # type: ignore[no-untyped-def]
    frame = tmp_path / "f.bin"
    frame.write_bytes(bytes(16))
    named = [str(tmp_path / "m") if arg == "M" else str(tmp_path / "o") if arg == "O" else arg for arg in given]
    line = run_error(["infer", str(frame), *named, "--ray"])
    assert line == (f"error: --ray needs {missing}: the workers load the model, and the outputs (a file a frame, or "
                    "the part files of --format jsonl / parquet) are written there"), line


def test_ray_without_out_and_with_eval_names_both_in_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """It said only ``--ray needs --out DIR``, and the run fixed so was refused again for --eval."""
    frame = tmp_path / "f.bin"
    frame.write_bytes(bytes(16))
    line = run_error(["infer", str(frame), "--model", str(tmp_path / "m"), "--ray", "--eval", "labels"])
    assert line == ("error: --ray needs --out DIR: the workers load the model, and the outputs (a file a frame, or the "
                    "part files of --format jsonl / parquet) are written there; and --eval does not run with --ray: "
                    "drop --eval and add --format kitti (--eval's default; without it, json), then evaluate the label "
                    "files written with `pointpillars-trt eval --pred DIR --labels labels`"), line


@pytest.mark.parametrize("fmt", [None, "json", "jsonl"])
def test_ray_with_eval_gives_the_fix_that_works_for_the_runs_format(tmp_path, assets, monkeypatch,  # type: ignore[no-untyped-def]
                                                                     fmt: str | None) -> None:
    """``infer --ray --eval`` said "evaluate the written label files with `pointpillars-trt eval`", but only --format
    kitti writes label files (and without --eval the default is json). The fix it now gives is followed here, with
    local infer writing what the Ray run writes (the same files, checked in test_distributed_ray), and evaluates."""
    import shlex

    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    training = assets / "kitti" / "training"
    out, labels = tmp_path / "o", training / "label_2"
    command = ["infer", str(training / "velodyne_reduced" / "000134.bin"), "--model",
               str(assets / "checkpoints" / "pointpillar_openpcdet_synthetic.pth"), "--out", str(out), "--device", "cpu",
               "--no-progress", *(["--format", fmt] if fmt else [])]
    line = run_error([*command, "--ray", "--eval", str(labels)])
    crop = " and add --fov-only (which --eval turns on)"
    if fmt is None:
        fix = (f"drop --eval and add --format kitti (--eval's default; without it, json), then evaluate the label "
               f"files written with `pointpillars-trt eval --pred {out} --labels {labels}`")
        ray_run = [*command, "--format", "kitti"]
    elif fmt == "json":
        fix = (f"drop --eval{crop}, then evaluate the JSON files written with `pointpillars-trt eval --pred {out} "
               f"--labels {labels} --calib CALIB_DIR` (the frames' calib folder)")
        ray_run = [*command, "--fov-only"]
    else:
        fix = (f"drop --eval{crop}, then evaluate the rows written by running the same command without --ray (and "
               f"the options only it takes), with --eval {labels} --skip-existing (nothing runs again)")
        ray_run = [*command, "--fov-only"]
    assert line == f"error: --eval does not run with --ray: {fix}", line
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(ray_run) == 0, err.getvalue()
    if fmt == "jsonl":
        then = [*ray_run, "--eval", str(labels), "--skip-existing"]
    else:
        then = shlex.split(fix.split("`")[1].replace("CALIB_DIR", str(training / "calib")))[1:]
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        assert main(then) == 0, said.getvalue()
    assert "Car AP@0.70, 0.70, 0.70:" in said.getvalue(), said.getvalue()


@pytest.mark.parametrize("paths, extra, expected", [
    (["s3://bucket/drive42/"], ["--skip-existing"],
     "error: --skip-existing: 's3://bucket/drive42/' is a URI, whose frames cannot be listed here to find those "
     "already in --out; give them as a local path every Ray node sees (a copy, or the bucket mounted)"),
    (["FRAME"], ["--retry-failed", "--format", "jsonl"],
     "error: --retry-failed reruns the failed frames that --skip-existing would skip: add --skip-existing"),
    (["FRAME"], ["--skip-existing", "--retry-failed"],
     "error: --retry-failed applies to --format jsonl / parquet, whose rows keep failed frames; --format json writes "
     "no file for a failed frame, so --skip-existing reruns it: drop --retry-failed"),
])
def test_resume_with_ray_that_cannot_apply_is_one_error_line(tmp_path, paths: list[str], extra: list[str],  # type: ignore[no-untyped-def]
                                                             expected: str) -> None:
    """--skip-existing / --retry-failed with --ray are local infer's, checked as it checks them; frames given as
    a URI cannot be listed to compare with --out, which is said instead of resuming nothing or everything.
    All before Ray or the model is touched."""
    frame = tmp_path / "f.bin"
    frame.write_bytes(bytes(16))
    given = [str(frame) if path == "FRAME" else path for path in paths]
    line = run_error(["infer", *given, "--model", str(tmp_path / "m"), "--out", str(tmp_path / "o"), "--ray", *extra])
    assert line == expected, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("paths, extra, expected", [
    (["FRAME", "s3://bucket/drive42/"], ["--ray"],
     "error: 'FRAME' and 's3://bucket/drive42/': Ray Data reads the frames of a run through one file system, and "
     "these are on two (file://, s3://): run them separately"),
    (["s3://bucket/drive42/"], [], "error: 's3://bucket/drive42/': no such file or folder (a URI is read by infer "
                                   "--ray alone)"),
    # a URI of one point file was a point file said not to exist, without the option that reads it
    (["s3://bucket/drive42/000000.bin"], [], "error: point file 's3://bucket/drive42/000000.bin' does not exist (a "
                                             "URI is read by infer --ray alone)"),
])
def test_uris_that_cannot_run_are_one_error_line_before_ray(tmp_path, paths: list[str], extra: list[str],  # type: ignore[no-untyped-def]
                                                            expected: str) -> None:
    """A URI beside a local path on another file system (Ray Data reads a run's files through one), and a URI
    without --ray: said before Ray or the model is touched."""
    frame = tmp_path / "f.bin"
    frame.write_bytes(bytes(16))
    given = [str(frame) if path == "FRAME" else path for path in paths]
    line = run_error(["infer", *given, "--model", str(tmp_path / "m"), "--out", str(tmp_path / "o"), *extra])
    assert line == expected.replace("FRAME", str(frame)), line
    assert not (tmp_path / "o").exists()


def test_ray_missing_is_one_error_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without Ray installed (its import blocked in a fresh interpreter), ``infer --ray`` says what to install."""
    import subprocess
    import sys

    frame = tmp_path / "f.bin"
    frame.write_bytes(bytes(16))
    script = ("import sys; sys.modules['ray'] = None; from pointpillars_trt.apps.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", script, "infer", str(frame), "--model", str(tmp_path / "m.pth"),
                           "--out", str(tmp_path / "o"), "--ray"], capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and "pip install 'pointpillars-trt[ray]'" in lines[0], done.stderr


def test_ray_missing_names_detect_dataset_in_python(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without Ray, ``detect_dataset`` said "infer --ray needs Ray Data", a command its caller never ran: the error
    names the function too."""
    import subprocess
    import sys

    script = ("import sys; sys.modules['ray'] = None\n"
              "from pointpillars_trt.apps.distributed import detect_dataset\n"
              "try:\n    detect_dataset(sys.argv[1], sys.argv[2], sys.argv[3])\n"
              "except Exception as exc:\n    print(type(exc).__name__, exc)")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path), str(tmp_path / "m"), str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout == ("BackendError infer --ray (Python: detect_dataset) needs Ray Data: pip install "
                           "'pointpillars-trt[ray]'\n"), done


def test_a_local_ray_cluster_stays_on_loopback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``require_ray`` without an address tells Ray, before its first import, to keep the cluster it starts
    on loopback (Ray reads the setting then); with an address, or RAY_ADDRESS set, the environment is left
    alone."""
    import subprocess
    import sys

    pytest.importorskip("ray", reason="ray not installed")
    script = ("import os, sys; os.environ.pop('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER', None); "
              "from pointpillars_trt.apps.distributed import require_ray; "
              "require_ray(None if sys.argv[1] == 'local' else sys.argv[1]); "
              "import ray._private.ray_constants as c; print(c.ENABLE_RAY_CLUSTER)")
    for address, ray_address, expected in (("local", "", "False"), ("auto", "", "True"),
                                           ("local", "10.0.0.1:6379", "True")):  # RAY_ADDRESS: Ray joins that
        env = {**os.environ, "RAY_ADDRESS": ray_address}
        done = subprocess.run([sys.executable, "-c", script, address], capture_output=True, text=True, timeout=120,
                              env=env)
        assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == expected, (address, done.stderr[-500:])


@pytest.mark.parametrize("named, fix", [("--ray-address ", "leave --ray-address out"),
                                        ("RAY_ADDRESS=", "unset RAY_ADDRESS")])
def test_infer_ray_where_nothing_listens_is_one_error_at_once(tmp_path, repo_root, named: str,  # type: ignore[no-untyped-def]
                                                              fix: str) -> None:
    """``ray.init`` at a HOST:PORT where nothing listens retries for minutes (Ray 2.60: still retrying, a
    "Failed to connect to GCS" line every few seconds, after 2.5 minutes); ``infer --ray`` there, the address
    given by ``--ray-address`` or by RAY_ADDRESS (which Ray reads when none is given), is one ``error:`` line
    naming the address and the fix, well within the child's 60 s."""
    import socket
    import subprocess
    import sys

    from tiny import tiny_model_dir

    pytest.importorskip("ray.data", reason="Ray Data not installed (pip install -e '.[test-scaleout]')")
    model = tiny_model_dir(tmp_path / "model", seed=3).path
    frame = tmp_path / "f.bin"
    frame.write_bytes(bytes(16))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        given = ["--ray-address", address] if named.startswith("--") else []
        done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "infer", str(frame), "--model", str(model),
                               "--out", str(tmp_path / "o"), "--device", "cpu", "--ray", *given],
                              capture_output=True, text=True, timeout=60, cwd=repo_root,
                              env=env if given else {**env, "RAY_ADDRESS": address})
    assert done.returncode == 2, done
    assert done.stderr == (f"error: {named}{address}: no Ray cluster answers there (Connection refused); "
                           f"start one (ray start --head) or {fix} for a local one\n"), done.stderr


def test_a_ray_run_into_earlier_parts_is_told_to_resume_as_local_infer_is(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Into a folder that holds an earlier run's parts, local infer and --ray alike are told to pass
    --skip-existing (or give another --out)."""
    from pointpillars_trt.apps.cli import build_parser
    from pointpillars_trt.apps.infer import check_outputs
    from pointpillars_trt.apps.outputs import PART_PREFIX
    from pointpillars_trt.errors import InputError

    out = tmp_path / "o"
    out.mkdir()
    (out / f"{PART_PREFIX}00000.jsonl").write_text("{}\n")
    base = ["infer", str(tmp_path / "f.bin"), "--model", "m", "--out", str(out), "--format", "jsonl"]
    messages = {}
    for extra in ([], ["--ray"]):
        with pytest.raises(InputError) as caught:
            check_outputs(build_parser().parse_args(base + extra), [])
        messages[bool(extra)] = str(caught.value)
    assert messages[True] == messages[False]
    assert messages[True].endswith("whose rows this run would repeat: pass --skip-existing to run only the frames "
                                   "they lack, or give another --out"), messages[True]


def test_a_ray_run_of_a_uri_into_earlier_parts_is_not_told_to_pass_skip_existing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """--skip-existing refuses frames given as a URI (they cannot be listed here): a URI run into a folder
    of earlier parts is told only to give another --out."""
    pytest.importorskip("ray")
    from pointpillars_trt.apps.cli import main
    from pointpillars_trt.apps.outputs import PART_PREFIX

    out = tmp_path / "o"
    out.mkdir()
    (out / f"{PART_PREFIX}00000.jsonl").write_text("{}\n")
    code = main(["infer", f"file://{tmp_path}/frames/", "--model", str(tmp_path / "m"), "--out", str(out),
                 "--format", "jsonl", "--device", "cpu", "--ray"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1, err
    assert err.rstrip().endswith("whose rows this run would repeat: give another --out"), err


def test_a_repository_held_and_let_go_keeps_no_pid_and_can_be_held_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """While held, the lock file names this process (what a second serve's refusal quotes); once let go it names
    no one, and another hold takes it."""
    from pointpillars_trt.apps.serve.repository import LOCK_FILE, repository_held

    with repository_held(tmp_path / "repo"):
        assert (tmp_path / "repo" / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert (tmp_path / "repo" / LOCK_FILE).read_text() == ""
    with repository_held(tmp_path / "repo"):
        assert (tmp_path / "repo" / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_a_repository_whose_file_system_refuses_locks_is_served_unlocked_with_one_warning(  # type: ignore[no-untyped-def]
        tmp_path, repo_root) -> None:
    """flock failing otherwise than on a lock held (ENOLCK, as an NFS mount without its lock daemon answers; here
    the kernel answers so by a seccomp filter, every local file system supporting flock) stopped serve with
    'error: No locks available', naming neither the repository nor the fix: serve goes on with the repository
    unlocked, said in one warning."""
    import no_flock
    from tiny import tiny_model_dir

    reason = no_flock.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    model = tiny_model_dir(tmp_path / "model").path
    repository = tmp_path / "repo"
    script = "import sys, no_flock; no_flock.refuse_flock()\nfrom pointpillars_trt.apps.cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", script, "serve", "--model", str(model), "--repository",
                           str(repository), "--device", "cpu", "--repository-only"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(repo_root / "tests"),
                                                                                          str(repo_root)])})
    assert done.returncode == 0 and done.stdout.startswith(f"wrote {repository / 'pointpillars'} "), done
    assert done.stderr == (f"warning: --repository '{repository}' is not locked against a second serve: its file "
                           "system refuses a lock (No locks available); start no other serve into it while this one "
                           "runs (it would rewrite the model under this one), or give a folder on a local disk\n")
    assert (repository / "pointpillars" / "config.pbtxt").is_file()


def test_a_repository_in_the_model_dir_is_refused_before_anything_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """It copied the model dir into itself until the path grew too long, left a repo/ folder in the model dir
    (which build then refused) and ended in a raw shutil.Error of hundreds of characters."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model").path
    before = sorted(os.listdir(model))
    for repository in (model / "repo", model):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(["serve", "--model", str(model), "--repository", str(repository), "--repository-only",
                       "--device", "cpu"])
        assert rc == 2 and err.getvalue() == (
            f"error: --repository {str(repository)!r} lies in the model dir {str(model)!r}, which the repository "
            "holds a copy of: give a folder outside it\n"), err.getvalue()
        assert sorted(os.listdir(model)) == before


def test_an_aborted_server_is_said_with_its_likely_request_and_the_fix_where_http_is_reachable() -> None:
    """serve's line for a tritonserver that ended while it served: an abort names Triton's bad_alloc on an HTTP
    request of a huge declared shape, and --http-host 127.0.0.1 only where HTTP listens beyond loopback; a
    SIGKILL names the out-of-memory killer; an exit code alone says nothing more."""
    import signal

    from pointpillars_trt.apps.serve.cli import server_exit_text

    cause = "a std::bad_alloc there is most likely an HTTP request whose JSON data declared a huge shape"
    fix = "HTTP listens on 0.0.0.0, where untrusted clients may reach it; serve it on loopback only, --http-host 127.0.0.1"
    for host in ("127.0.0.1", "127.0.0.2"):
        text = server_exit_text(-signal.SIGABRT, host)
        assert cause in text and "--http-host" not in text, text
    assert fix in server_exit_text(-signal.SIGABRT, "0.0.0.0") and fix.replace("0.0.0.0", "10.1.2.3") in \
        server_exit_text(-signal.SIGABRT, "10.1.2.3")
    assert "out-of-memory killer" in server_exit_text(-signal.SIGKILL, "0.0.0.0")
    assert server_exit_text(3, "0.0.0.0") == ("tritonserver exited with code 3; restart serve (a supervisor such as "
                                              "systemd's Restart=on-failure does it for you)")
    assert "\n" not in server_exit_text(-signal.SIGSEGV, "0.0.0.0") and "SIGSEGV: it crashed" in \
        server_exit_text(-signal.SIGSEGV, "0.0.0.0")


def test_serve_exports_a_checkpoint_in_the_precision_and_config_given_as_infer_does(  # type: ignore[no-untyped-def]
        tmp_path, assets, monkeypatch) -> None:
    """serve --model X.pth took no --precision or --config and always exported fp32 graphs of the built-in config;
    it takes infer's options, and a model dir given another --precision is refused as infer refuses it."""
    import re
    from pathlib import Path

    import pointpillars_trt
    from pointpillars_trt.model_dir import load_model_dir

    monkeypatch.setenv("POINTPILLARS_TRT_CACHE", str(tmp_path / "cache"))
    strict = tmp_path / "strict.yaml"  # the checkpoint's own config but for its score threshold
    own = Path(pointpillars_trt.__file__).parent / "configs" / "openpcdet_kitti_3class.yaml"
    strict.write_text(re.sub(r"(?m)^(\s*score_threshold:).*$", r"\1 0.6", own.read_text()))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["serve", "--model", str(assets / "checkpoints/pointpillar_openpcdet_synthetic.pth"), "--precision",
                   "fp16", "--config", str(strict), "--repository", str(tmp_path / "repo"), "--repository-only",
                   "--device", "cpu"])
    # the precision served is said, as infer's "running on" line says it (it was "wrote REPO/pointpillars" alone)
    assert rc == 0 and out.getvalue() == f"wrote {tmp_path / 'repo' / 'pointpillars'} (openpcdet_kitti_3class, fp16)\n"
    served = load_model_dir(tmp_path / "repo" / "pointpillars" / "1" / "model")
    assert served.precision == "fp16" and served.cfg.postprocess.score_threshold == 0.6
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["serve", "--model", str(served.path), "--precision", "fp32", "--repository", str(tmp_path / "other"),
                   "--repository-only", "--device", "cpu"])
    assert rc == 2 and err.getvalue() == (f"error: --precision fp32: model dir {str(served.path)!r} was built in fp16; "
                                          "drop --precision, or build a model dir with --precision fp32\n")
    assert not (tmp_path / "other").exists()
