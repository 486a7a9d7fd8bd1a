"""core.fsutil.require_file: the one check of a file a command must read or run."""

import os

import pytest

from core.errors import EXIT_MISSING, EXIT_USAGE, MissingError, UsageError
from core.fsutil import require_file


def test_a_regular_readable_file_gives_its_stat(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"x" * 10)
    assert require_file(str(p), "source", "fix it").st_size == 10


@pytest.mark.parametrize("make,cls,code,what", [
    (lambda d: d / "nope", MissingError, EXIT_MISSING, "no such file"),
    (lambda d: d, UsageError, EXIT_USAGE, "not a regular file"),
])
def test_missing_and_not_a_file(tmp_path, make, cls, code, what):
    path = str(make(tmp_path))
    with pytest.raises(cls) as e:
        require_file(path, "source", "give the model file to copy")
    assert e.value.exit_code == code
    assert str(e.value) == f"source {path}: {what}; give the model file to copy"


def test_an_executable_is_asked_for_when_running(tmp_path):
    p = tmp_path / "ds4-bench"
    p.write_text("#!/bin/sh\n")
    os.chmod(p, 0o644)
    require_file(str(p), "engine binary", "fix")
    with pytest.raises(UsageError, match="not executable"):
        require_file(str(p), "engine binary", "fix", executable=True)
    os.chmod(p, 0o755)
    require_file(str(p), "engine binary", "fix", executable=True)
