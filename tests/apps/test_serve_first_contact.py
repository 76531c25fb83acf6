"""``serve``'s first-contact errors for a tritonserver binary or a repository folder it cannot use: one line that
names where the bad value came from (the option, or $PP_TRITONSERVER) and how to fix it. Real paths: a file that
is not executable, a path under a regular file (which no folder can be made under)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pointpillars_trt.apps.cli import main
from pointpillars_trt.apps.serve.server import find_tritonserver
from pointpillars_trt.errors import BackendError


@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_binary_that_is_not_executable_names_where_it_came_from_and_how_to_get_one(
        given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale $PP_TRITONSERVER was said as 'tritonserver PATH: not an executable file', naming neither the
    variable nor a way to get a binary."""
    binary = tmp_path / "tritonserver"
    binary.write_text("not a program\n")  # a file, not executable
    monkeypatch.setenv("PP_TRITONSERVER", str(binary))
    with pytest.raises(BackendError) as caught:
        find_tritonserver(str(binary) if given == "option" else None)
    source = "--tritonserver" if given == "option" else "$PP_TRITONSERVER"
    said = str(caught.value)
    assert said.startswith(f"{source} '{binary}': not an executable file; ") and "\n" not in said, said
    assert "pip install --no-deps --target DIR nvidia-pytriton" in said, said


def test_a_repository_that_cannot_be_made_names_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --repository under a regular file (as under a read-only mount) was said as "'PATH': Not a directory",
    naming neither the option nor what serve needs of the folder."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "tiny", seed=3)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    repository = blocker / "repo"
    rc = main(["serve", "--model", str(model.path), "--repository", str(repository), "--device", "cpu",
               "--repository-only"])
    err = capsys.readouterr().err
    assert rc == 2 and err == (f"error: --repository '{repository}': cannot write there (Not a directory); give a "
                               "folder serve can write (created if missing): it writes the model's copy there and "
                               "Triton serves it from there\n"), err


def small_file_limit() -> None:
    """The child's files may grow to 1 KiB: a write past it fails (EFBIG, Python ignores SIGXFSZ), as a write to a
    full disk fails, with no file name of its own."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))


def test_a_repository_the_models_copy_cannot_be_written_in_is_one_line(tmp_path: Path, repo_root: Path) -> None:
    """The model's copy fails as on a full disk. Before: copytree's list of every file's error ('[('.../model.json',
    ...), ...]') as the error line, or 'No space left on device' alone where the lock file's pid could not be
    written."""
    from tiny import tiny_model_dir

    model = tiny_model_dir(tmp_path / "tiny", seed=3)
    repository = tmp_path / "repo"
    done = subprocess.run([sys.executable, "-m", "pointpillars_trt", "serve", "--model", str(model.path),
                           "--repository", str(repository), "--device", "cpu", "--repository-only"],
                          capture_output=True, text=True, timeout=120, cwd=repo_root,
                          env={**os.environ, "PYTHONPATH": str(repo_root)}, preexec_fn=small_file_limit)
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == (f"error: --repository '{repository}': cannot write there ({os.strerror(errno.EFBIG)}); give a "
                           "folder serve can write (created if missing): it writes the model's copy there and Triton "
                           "serves it from there\n"), done.stderr
    assert sorted(p.name for p in repository.iterdir()) == [".pointpillars-serve.lock"]  # no half-written model


def test_a_model_that_is_not_there_or_no_model_is_the_one_line_before_any_note(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: where no GPU shows, "note: device auto: the model's instances run on the CPU" came first, and a
    missing --model made the repository folder (and its lock file) before its error."""
    missing, junk = tmp_path / "missing", tmp_path / "model.pth"
    junk.write_bytes(b"no checkpoint\n")
    for model, said in ((missing, f"error: --model '{missing}': no such checkpoint file or model dir\n"),
                        (junk, f"error: {junk}: not a torch checkpoint (neither a zip archive nor a legacy torch "
                               "pickle stream)\n")):
        rc = main(["serve", "--model", str(model), "--repository", str(tmp_path / f"repo-{model.name}"),
                   "--device", "auto", "--repository-only"])
        err = capsys.readouterr().err
        assert (rc, err) == (2, said)
    assert not (tmp_path / "repo-missing").exists()


@pytest.mark.parametrize("precision", [None, "fp16"])
def test_a_model_dir_of_another_format_gets_its_rebuild_command_as_infer_gives_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], precision: str | None) -> None:
    """A model.json of another format version: infer names the build command that rebuilds the model dir; serve
    said only 'rebuild the model dir', with or without --precision."""
    from tiny import set_unknown_format_version, tiny_model_dir

    model = tiny_model_dir(tmp_path / "tiny", seed=3).path
    refused = set_unknown_format_version(model)
    given = ["--precision", precision] if precision else []
    rc = main(["serve", "--model", str(model), "--repository", str(tmp_path / "repo"), "--device", "cpu",
               "--repository-only", *given])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(refused), err
    assert f"rebuild the model dir: `pointpillars-trt build --checkpoint YOUR_CHECKPOINT.pth --out {model}`" in err, err
