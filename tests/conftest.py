"""Fixtures shared by the test modules."""
import pytest

TOPOLOGY_ENV = ("TOPOCOLL_TOPOLOGY", "TOPOCOLL_SLURM_TOPOLOGY", "SLURM_TOPOLOGY_CONF",
                "TOPOCOLL_LINKS", "TOPOCOLL_LINKS_FILE", "TOPOCOLL_NICS", "TOPOCOLL_EMULATE",
                "SLURMD_NODENAME")
"""The settings topology detection reads."""


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No user topology settings or ~/.cache probe file leak in: HOME is the test's tmp_path,
    which it returns."""
    for k in TOPOLOGY_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path
