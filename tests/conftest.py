import pytest


@pytest.fixture(autouse=True)
def _isolated_rig(tmp_path, monkeypatch):
    """Each test gets its own rig folder; nothing reads ./rig or the user's environment."""
    monkeypatch.setenv("REPLICA_TUNER_RIG", str(tmp_path / "rig"))
    monkeypatch.delenv("REPLICA_TUNER_DEBUG", raising=False)
    yield
