"""Fixtures of the replicas tests."""

import pytest

from tests.replicas.helpers import synced_rig


@pytest.fixture
def synced(tmp_path):
    """A primary and two verified replicas: (rig dir, the bytes, [primary, replica, replica])."""
    return synced_rig(tmp_path)
