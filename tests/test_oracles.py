"""The test oracles are present, and a missing one fails CI instead of silently skipping its tests."""

from __future__ import annotations

import pytest

from .conftest import ORACLES, require_oracle

MISSING = "whisperkv_no_such_oracle"


def test_missing_oracle_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=f"{MISSING}.*CI is set"):
        require_oracle(MISSING)


def test_missing_oracle_skips_locally(monkeypatch):
    for value in (None, "", "0", "false"):
        if value is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.skip.Exception, match=MISSING):
            require_oracle(MISSING)


def test_an_oracle_that_fails_inside_its_import_counts_as_missing(monkeypatch, tmp_path):
    (tmp_path / "broken_oracle.py").write_text("import whisperkv_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="broken_oracle"):
        require_oracle("broken_oracle")


@pytest.mark.parametrize("module", sorted(ORACLES))
def test_every_oracle_imports(module):
    """Under CI this fails when an oracle is missing, whichever tests would have used it."""
    assert require_oracle(module).__name__ == module
