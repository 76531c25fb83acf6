"""``serve``'s first-contact errors for a tritonserver binary or a repository folder it cannot use: one line that
names where the bad value came from (the option, or $PP_TRITONSERVER) and how to fix it. Real paths: a file that
is not executable, a path under a regular file (which no folder can be made under)."""

from __future__ import annotations

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
    assert said.startswith(f"{source} {binary}: not an executable file; ") and "\n" not in said, said
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
