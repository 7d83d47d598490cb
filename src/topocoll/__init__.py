"""topocoll: topology-aware collective communication and the tensor-parallel layers built on it.

    import topocoll.collectives as collectives
    comm = collectives.init()
    comm.all_reduce(x)

Subpackages: ``topocoll.collectives`` (communicator, collectives, torch backend),
``topocoll.topology`` (ranks -> nodes -> switches, link costs), ``topocoll.rtp``,
``topocoll.paro``, ``topocoll.tesseract``, ``topocoll.primepar`` (parallel layers, need torch) and
``topocoll.bench`` (microbenchmarks). The command line is ``topocoll`` (``topocoll --help``).
"""
__version__ = "0.1.0"

__all__ = ["__version__"]
