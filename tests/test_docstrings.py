"""Every public module, class and function of the packages has a docstring (mpi4py's rule)."""
import importlib
import inspect
import pkgutil

import pytest

PACKAGES = ["topocoll"] + [f"topocoll.{p}" for p in (
    "collectives", "topology", "bench", "rtp", "tesseract", "paro", "primepar", "cluster")]


def _modules():
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        yield pkg
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{name}."):
            if info.name.endswith("__main__"):
                continue
            try:
                yield importlib.import_module(info.name)
            except ImportError as err:  # optional extras (cupy, ...) missing here
                if "cupy" in str(err) or "torch" in str(err):
                    continue
                raise


def _public(module):
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            yield name, obj
            if inspect.isclass(obj):
                for meth, fn in vars(obj).items():
                    if not meth.startswith("_") and inspect.isfunction(fn):
                        yield f"{name}.{meth}", getattr(obj, meth)  # inherited docs count


@pytest.mark.parametrize("module", list(_modules()), ids=lambda m: m.__name__)
def test_public_objects_have_docstrings(module):
    assert module.__doc__, f"module {module.__name__} has no docstring"
    missing = [n for n, obj in _public(module) if not (inspect.getdoc(obj) or "").strip()]
    assert not missing, f"{module.__name__}: no docstring on {', '.join(missing)}"
