"""Rank script: the quick start of topocoll.primepar's docstring, as it stands, on every rank."""
import _common  # noqa: F401
from _common import rank_main

from test_doc_examples import docstring_example


def body():
    exec(compile(docstring_example("topocoll.primepar"), "primepar docstring", "exec"), {})


rank_main(body)
