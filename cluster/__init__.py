"""A real multi-host cluster on one machine: network namespaces with their own hostnames as
hosts, bridges as leaf and spine switches, ``tc tbf``-shaped veths as links, and MPICH's hydra
launching across them (``topocoll cluster up|run|exec|status|down``; docs/cluster.md).

    from topocoll import cluster
    c = cluster.up(cluster.from_mapping({"hosts": 2, "ranks_per_host": 2,
                                         "host_rate": "400mbit"}))
    subprocess.run(c.mpiexec_argv(["python", "train.py"]))
    cluster.down(c.name)

Needs root and iproute2. Nothing here is imported by the other layers.
"""
from .description import Description, format_rate, from_mapping, load, parse_rate
from .errors import ClusterError, DescriptionError, UsageError
from .layout import Layout
from .manage import Cluster, describe_status, down, status, up
from .net import missing_requirements

__all__ = ["Cluster", "ClusterError", "Description", "DescriptionError", "Layout", "UsageError",
           "down", "describe_status", "format_rate", "from_mapping", "load",
           "missing_requirements", "parse_rate", "status", "up"]
