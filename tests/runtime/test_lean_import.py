"""import_without: a module's optional import refused to the importing thread only, on real packages
written to a temporary folder."""

from __future__ import annotations

import sys
import textwrap

import pytest

from pointpillars_trt.runtime.lean_import import import_without


@pytest.fixture()
def packages(tmp_path, monkeypatch):
    """Writes modules (name -> source) into a folder on sys.path; removes them from sys.modules after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(**sources: str) -> None:
        for name, source in sources.items():
            (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
            written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)


OPTIONAL = """
try:
    import pp_probe_heavy
    HEAVY = True
except ImportError:
    HEAVY = False
"""


def test_the_hidden_package_is_not_imported_and_the_module_takes_its_fallback(packages):
    packages(pp_probe_heavy="LOADED = True\n", pp_probe_light=OPTIONAL)
    meta_path = list(sys.meta_path)
    light = import_without("pp_probe_light", ["pp_probe_heavy"])
    assert light.HEAVY is False
    assert "pp_probe_heavy" not in sys.modules
    assert sys.meta_path == meta_path  # nothing left behind: a later import of the package works
    import pp_probe_heavy

    assert pp_probe_heavy.LOADED


def test_a_package_imported_before_is_left_to_the_module(packages):
    packages(pp_probe_heavy="LOADED = True\n", pp_probe_light=OPTIONAL)
    import pp_probe_heavy  # noqa: F401

    assert import_without("pp_probe_light", ["pp_probe_heavy"]).HEAVY is True


def test_other_threads_import_the_package_while_it_is_hidden_from_this_one(packages):
    packages(pp_probe_heavy="LOADED = True\n", pp_probe_light="""
        import threading
        seen = {}
        def other_thread():
            import pp_probe_heavy
            seen["other"] = pp_probe_heavy.LOADED
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        try:
            import pp_probe_heavy
            seen["this"] = True
        except ImportError:
            seen["this"] = False
    """)
    light = import_without("pp_probe_light", ["pp_probe_heavy"])
    assert light.seen == {"other": True, "this": True}  # the other thread's import put it in sys.modules first


def test_the_modules_own_import_errors_come_through(packages):
    packages(pp_probe_heavy="LOADED = True\n", pp_probe_needs="import pp_probe_heavy\n")
    meta_path = list(sys.meta_path)
    with pytest.raises(ModuleNotFoundError, match="pp_probe_heavy is not imported while pp_probe_needs imports"):
        import_without("pp_probe_needs", ["pp_probe_heavy"])
    assert sys.meta_path == meta_path
    assert "pp_probe_needs" not in sys.modules


def test_a_submodule_of_the_hidden_package_is_hidden_too(packages, tmp_path):
    (tmp_path / "pp_probe_pkg").mkdir()
    (tmp_path / "pp_probe_pkg" / "__init__.py").write_text("")
    (tmp_path / "pp_probe_pkg" / "part.py").write_text("X = 1\n")
    packages(pp_probe_light="""
        try:
            from pp_probe_pkg import part
            FOUND = True
        except ImportError:
            FOUND = False
    """)
    try:
        assert import_without("pp_probe_light", ["pp_probe_pkg"]).FOUND is False
    finally:
        for name in ("pp_probe_pkg", "pp_probe_pkg.part"):
            sys.modules.pop(name, None)


def test_a_module_imported_before_is_returned_as_it_is(packages):
    packages(pp_probe_heavy="LOADED = True\n", pp_probe_light=OPTIONAL)
    import pp_probe_light

    assert import_without("pp_probe_light", ["pp_probe_heavy"]) is pp_probe_light
    assert pp_probe_light.HEAVY is True
