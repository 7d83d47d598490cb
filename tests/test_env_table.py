"""Every TOPOCOLL_* environment variable the package reads is documented in docs/environment.md."""
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parent.parent
FALLBACK_DIRS = ["src/topocoll", "collectives", "topology", "bench", "rtp", "paro", "tesseract",
                 "primepar"]


def _package_dirs() -> list[str]:
    """The package folders, from pyproject.toml's package-dir mapping (a new package is scanned
    as soon as it is mapped there)."""
    if tomllib is None:
        return FALLBACK_DIRS
    with open(ROOT / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return sorted(set(mapping.values()))


PACKAGE_DIRS = _package_dirs()
NAME = re.compile(r"\bTOPOCOLL_[A-Z0-9_]*[A-Z0-9]\b")
# Names that appear in the source but are not environment variables (none today).
NOT_VARIABLES: set[str] = set()


def _names_in_source() -> dict[str, str]:
    """Every TOPOCOLL_* name in the package's code, with one file that mentions it. The package
    reads its variables by literal name (``os.environ.get("TOPOCOLL_X")``) or through a constant
    holding that name (``ENV_LINKS = "TOPOCOLL_LINKS"``), so the names in its source are the
    variables it reads."""
    found: dict[str, str] = {}
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in NAME.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def test_source_reads_environment_variables():
    # guard against the grep silently finding nothing (folders moved, pattern broken)
    names = _names_in_source()
    assert {"TOPOCOLL_TIMEOUT", "TOPOCOLL_TOPOLOGY", "TOPOCOLL_SHM"} <= set(names), names


def test_every_variable_is_in_the_environment_table():
    table = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(TOPOCOLL_[A-Z0-9_]+)`", table))
    missing = {n: f for n, f in _names_in_source().items()
               if n not in documented and n not in NOT_VARIABLES}
    assert not missing, ("environment variables read by the package but missing from "
                         "docs/environment.md: "
                         + ", ".join(f"{n} ({f})" for n, f in sorted(missing.items())))


def test_table_names_no_variable_the_code_does_not_know():
    table = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(TOPOCOLL_[A-Z0-9_]+)`", table))
    stale = documented - set(_names_in_source())
    assert not stale, f"docs/environment.md lists variables the code never reads: {sorted(stale)}"
