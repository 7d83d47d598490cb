"""Every torch.distributed collective on the "topocoll" backend against gloo, in one job.

The default group is topocoll, set up with no MASTER_ADDR (the MPI rendezvous) or by torchrun; gloo runs over
the same ranks through the TCPStore that rendezvous made. Argument ``env`` instead inits from
MASTER_ADDR/MASTER_PORT given by the test.
"""
import _common  # noqa: F401
from _common import rank_main

import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import topocoll.collectives.torch  # noqa: F401 - registers "topocoll"

warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames, not ours

OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16]
SIZES = [0, 1, 7, 70_001]  # 70_001 float32 > 256 KiB: the ring algorithm


def data(shape, dtype, rank, salt=0):
    """Small integers (1..4), so every op and dtype is exact in any order."""
    n = int(torch.tensor(shape).prod()) if shape else 1
    vals = (torch.arange(n, dtype=torch.int64) * 7 + rank * 3 + salt) % 4 + 1
    return vals.reshape(shape).to(dtype)


def same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs " \
        f"{b.dtype}{list(b.shape)}"
    assert torch.equal(a, b), f"{what}: topocoll {a.flatten()[:8]} != gloo {b.flatten()[:8]}"


def both(fn, what):
    """Run ``fn(group)`` on topocoll and on gloo; the results must be identical."""
    mine, ref = fn(TOPO), fn(GLOO)
    if isinstance(mine, (list, tuple)):
        assert len(mine) == len(ref), what
        for i, (a, b) in enumerate(zip(mine, ref)):
            if isinstance(a, torch.Tensor):
                same(a, b, f"{what}[{i}]")
            else:
                assert a == b, f"{what}[{i}]: topocoll {a!r} != gloo {b!r}"
    else:
        same(mine, ref, what)


def reductions(r, p):
    for dtype in DTYPES:
        for n in SIZES:
            for op in OPS:
                if dtype == torch.bfloat16 and op == dist.ReduceOp.PRODUCT:
                    continue  # products of 1..4 overflow bfloat16's 8-bit mantissa
                name = f"all_reduce {dtype} n={n} {op}"

                def ar(g, n=n, dtype=dtype, op=op):
                    t = data((n,), dtype, r)
                    dist.all_reduce(t, op=op, group=g)
                    return t

                both(ar, name)
            for root in range(p):
                def red(g, n=n, dtype=dtype, root=root):
                    t = data((n,), dtype, r)
                    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX, group=g)
                    return t if r == root else t[:0]  # non-root contents are unspecified

                both(red, f"reduce {dtype} n={n} root={root}")
    t = data((5, 3), torch.float32, r)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)  # gloo has no AVG: compare with the mean
    expect = torch.stack([data((5, 3), torch.float32, q) for q in range(p)]).mean(0)
    assert torch.allclose(t, expect), f"AVG {t} vs {expect}"


def bits(shape, dtype, rank, salt=0):
    """Values with several bits set (0..119), or for bools True where that value is odd."""
    n = int(torch.tensor(shape).prod()) if shape else 1
    vals = ((torch.arange(n, dtype=torch.int64) * 37 + rank * 11 + salt) % 120).reshape(shape)
    return vals % 2 == 1 if dtype == torch.bool else vals.to(dtype)


def bitwise(r, p):
    """BAND/BOR/BXOR on integers and bools, and every op on bools (gloo's bool sum is 'or', its
    product 'and'), through all_reduce, reduce and reduce_scatter."""
    bitwise_ops = [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    for dtype in (torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool):
        for op in bitwise_ops + (OPS if dtype == torch.bool else []):
            for n in SIZES:
                def ar(g, n=n, dtype=dtype, op=op):
                    t = bits((n,), dtype, r)
                    dist.all_reduce(t, op=op, group=g)
                    return t

                both(ar, f"all_reduce {dtype} n={n} {op}")

                def rs(g, n=n, dtype=dtype, op=op):
                    out = torch.empty((n,), dtype=dtype)
                    dist.reduce_scatter_tensor(out, bits((p * n,), dtype, r, salt=5), op=op,
                                               group=g)
                    return out

                both(rs, f"reduce_scatter_tensor {dtype} n={n} {op}")
            for root in range(p):
                def red(g, dtype=dtype, op=op, root=root):
                    t = bits((9,), dtype, r, salt=3)
                    dist.reduce(t, dst=root, op=op, group=g)
                    return t if r == root else t[:0]

                both(red, f"reduce {dtype} {op} root={root}")


def movement(r, p):
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.bool):
        for n in (0, 3, 70_001):
            def bc(g, root, n=n, dtype=dtype):
                t = data((n,), dtype, r)
                dist.broadcast(t, src=root, group=g)
                return t

            for root in range(p):
                both(lambda g, root=root: bc(g, root), f"broadcast {dtype} n={n} root={root}")

            def ag(g, n=n, dtype=dtype):
                out = [torch.empty((n, 2), dtype=dtype) for _ in range(p)]
                dist.all_gather(out, data((n, 2), dtype, r), group=g)
                return out

            both(ag, f"all_gather {dtype} n={n}")

            def agt(g, n=n, dtype=dtype):
                out = torch.empty((p * n, 2), dtype=dtype)
                dist.all_gather_into_tensor(out, data((n, 2), dtype, r), group=g)
                return out

            both(agt, f"all_gather_into_tensor {dtype} n={n}")
        for root in range(p):
            def ga(g, root=root, dtype=dtype):
                out = [torch.empty((4,), dtype=dtype) for _ in range(p)] if r == root else None
                dist.gather(data((4,), dtype, r), out, dst=root, group=g)
                return out or []

            both(ga, f"gather {dtype} root={root}")

            def sc(g, root=root, dtype=dtype):
                ins = [data((4,), dtype, q, salt=9) for q in range(p)] if r == root else None
                out = torch.empty((4,), dtype=dtype)
                dist.scatter(out, ins, src=root, group=g)
                return out

            both(sc, f"scatter {dtype} root={root}")


def scatters(r, p):
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        for n in (0, 5, 40_000):
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                def rs(g, n=n, dtype=dtype, op=op):
                    out = torch.empty((n,), dtype=dtype)
                    ins = [data((n,), dtype, r, salt=q) for q in range(p)]
                    dist.reduce_scatter(out, ins, op=op, group=g)
                    return out

                both(rs, f"reduce_scatter {dtype} n={n} {op}")

                def rst(g, n=n, dtype=dtype, op=op):
                    out = torch.empty((n, 3), dtype=dtype)
                    dist.reduce_scatter_tensor(out, data((p * n, 3), dtype, r), op=op, group=g)
                    return out

                both(rst, f"reduce_scatter_tensor {dtype} n={n} {op}")


def all_to_all(r, p):
    def even(g):
        out = torch.empty((2 * p, 3))
        dist.all_to_all_single(out, data((2 * p, 3), torch.float32, r), group=g)
        return out

    both(even, "all_to_all_single even")
    # uneven: rank r sends (r + s) % 3 rows to rank s
    ins = [(r + s) % 3 for s in range(p)]
    outs = [(q + r) % 3 for q in range(p)]

    def uneven(g):
        out = torch.full((sum(outs), 2), -1.0)
        dist.all_to_all_single(out, data((sum(ins), 2), torch.float64, r).float(), outs, ins,
                               group=g)
        return out

    both(uneven, "all_to_all_single uneven")

    # the list form against its definition: gloo has no alltoall in some torch releases (2.11)
    out = [torch.empty((3,), dtype=torch.int64) for q in range(p)]
    dist.all_to_all(out, [data((3,), torch.int64, r, salt=s) for s in range(p)], group=TOPO)
    for q in range(p):
        same(out[q], data((3,), torch.int64, q, salt=r), f"all_to_all lists from {q}")
    # gloo wants equal sizes; topocoll also takes unequal ones: rank q sends q + 1 elements
    out = [torch.empty((q + 1,), dtype=torch.int64) for q in range(p)]
    dist.all_to_all(out, [data((r + 1,), torch.int64, r, salt=s) for s in range(p)])
    for q in range(p):
        same(out[q], data((q + 1,), torch.int64, q, salt=r), f"all_to_all uneven lists from {q}")


def point_to_point(r, p):
    big = 1 << 20  # 4 MiB: beyond any eager limit, so a blocking send would deadlock here
    nxt, prv = (r + 1) % p, (r - 1) % p

    def ring(g):
        send = data((big,), torch.float32, r)
        recv = torch.empty(big)
        ops = [dist.P2POp(dist.isend, send, nxt, g), dist.P2POp(dist.irecv, recv, prv, g)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return recv

    both(ring, "batch_isend_irecv ring")
    # both neighbours isend first, then recv: isend must not block
    send = data((big,), torch.float32, r, salt=1)
    w = dist.isend(send, nxt, tag=3)
    got = torch.empty(big)
    dist.recv(got, prv, tag=3)
    w.wait()
    same(got, data((big,), torch.float32, prv, salt=1), "isend/recv")
    if p > 1:  # tags keep two messages apart
        a, b = torch.empty(2), torch.empty(2)
        if r == 0:
            dist.send(torch.full((2,), 5.0), 1, tag=5)
            dist.send(torch.full((2,), 6.0), 1, tag=6)
        elif r == 1:
            wb = dist.irecv(b, 0, tag=6)
            dist.recv(a, 0, tag=5)
            wb.wait()
            assert a.tolist() == [5.0, 5.0] and b.tolist() == [6.0, 6.0], (a, b)


def objects(r, p):
    def ago(g):
        out = [None] * p
        dist.all_gather_object(out, {"rank": r, "s": "x" * r}, group=g)
        return out

    both(ago, "all_gather_object")
    for root in range(p):
        def bo(g, root=root):
            lst = [r, {"k": [r] * 3}, "hi"] if r == root else [None] * 3
            dist.broadcast_object_list(lst, src=root, group=g)
            return lst

        both(bo, f"broadcast_object_list root={root}")

        def go(g, root=root):
            out = [None] * p if r == root else None
            dist.gather_object(("obj", r), out, dst=root, group=g)
            return out or []

        both(go, f"gather_object root={root}")

        def so(g, root=root):
            out = [None]
            dist.scatter_object_list(out, [f"to {q}" for q in range(p)] if r == root else None,
                                     src=root, group=g)
            return out

        both(so, f"scatter_object_list root={root}")


def functional(r, p):
    t = data((4 * p, 2), torch.float32, r)
    for name, fn in [
        ("all_reduce", lambda g: fc.all_reduce(t, "sum", g)),
        ("all_gather_tensor", lambda g: fc.all_gather_tensor(t, 0, g)),
        ("reduce_scatter_tensor", lambda g: fc.reduce_scatter_tensor(t, "sum", 0, g)),
        ("all_to_all_single", lambda g: fc.all_to_all_single(t, None, None, g)),
        ("broadcast", lambda g: fc.broadcast(t, 0, g)),
    ]:
        both(lambda g, fn=fn: fc.wait_tensor(fn(g)), f"functional {name}")


def subgroups(r, p):
    """new_group on a subset (called by every rank, as torch requires; only members build)."""
    for ranks in ([0, 1], list(range(1, p, 2)), [p - 1]):
        ranks = sorted(set(ranks))
        topo = dist.new_group(ranks, backend="topocoll")
        gloo = dist.new_group(ranks, backend="gloo")
        if r not in ranks:
            assert topo == dist.GroupMember.NON_GROUP_MEMBER
            continue
        assert dist.get_world_size(topo) == len(ranks)
        assert dist.get_group_rank(topo, r) == ranks.index(r)
        a, b = data((9,), torch.int64, r), data((9,), torch.int64, r)
        dist.all_reduce(a, group=topo)
        dist.all_reduce(b, group=gloo)
        same(a, b, f"subgroup {ranks} all_reduce")
        src = ranks[-1]
        a, b = data((3,), torch.float32, r), data((3,), torch.float32, r)
        dist.broadcast(a, src=src, group=topo)
        dist.broadcast(b, src=src, group=gloo)
        same(a, b, f"subgroup {ranks} broadcast from global rank {src}")
        out = [None] * len(ranks)
        dist.all_gather_object(out, r, group=topo)
        assert out == ranks, out
        x = fc.all_reduce(torch.ones(2), "sum", topo)
        assert fc.wait_tensor(x).tolist() == [len(ranks)] * 2


def torch_suite_features(r, p):
    """What torch's own suite found missing: all_gather_coalesced, recv from any source and
    sparse all_reduce, against gloo (the timeout's wording: torch_timeout.py)."""
    def agc(g):
        ins = [data((3,), torch.float32, r), data((2, 2), torch.float32, r, salt=1),
               data((0,), torch.float32, r)]
        outs = [[torch.empty_like(t) for t in ins] for _ in range(p)]
        dist.all_gather_coalesced(outs, ins, group=g)
        return [t for lst in outs for t in lst]

    both(agc, "all_gather_coalesced")

    def sparse(g):
        # integer values: sums are exact whatever the order; ranks overlap in some indices
        idx = torch.tensor([[r % 3, 2, 4], [1, r % 2, 3]])
        t = torch.sparse_coo_tensor(idx, data((3, 2), torch.float32, r), (5, 4, 2),
                                    check_invariants=True)
        dist.all_reduce(t, group=g)
        assert t.is_coalesced(), "sparse all_reduce result is not coalesced"
        return [t.indices(), t.values()]

    both(sparse, "sparse all_reduce")

    # two in flight on one tensor: the second sums what the first left (p times the first sum),
    # as a dense tensor's second all_reduce would
    idx = torch.tensor([[r % 3, 2, 4], [1, r % 2, 3]])
    t = torch.sparse_coo_tensor(idx, data((3, 2), torch.float32, r), (5, 4, 2),
                                check_invariants=True)
    dense = t.to_dense()
    dist.all_reduce(dense, group=GLOO)
    works = [dist.all_reduce(t, group=TOPO, async_op=True) for _ in range(2)]
    for w in works:
        w.wait()
    assert torch.equal(t.to_dense(), dense * p), f"two async sparse all_reduces: " \
        f"{t.to_dense().flatten()[:8]} != {(dense * p).flatten()[:8]}"

    def anysource(g):
        senders = []
        if r == 0:
            for _ in range(p - 1):
                t = torch.empty(4)
                q = dist.recv(t, group=g)  # src=None: whoever sends first
                assert torch.equal(t, data((4,), torch.float32, q)), (q, t)
                senders.append(q)
            w = dist.irecv(t, group=g) if p > 1 else None
            if w is not None:
                w.wait()
                senders.append(w._source_rank())
                assert torch.equal(t, data((4,), torch.float32, senders[-1]))
        elif r == 1:
            dist.send(data((4,), torch.float32, r), dst=0, group=g)
            dist.send(data((4,), torch.float32, r), dst=0, group=g)
        else:
            dist.send(data((4,), torch.float32, r), dst=0, group=g)
        dist.barrier(group=GLOO)  # a fast rank's next round must not feed this one
        return sorted(senders)

    got = anysource(TOPO)
    assert got == (sorted(list(range(1, p)) + [1]) if r == 0 else []), f"any source: {got}"
    both(anysource, "recv from any source")


def body():
    global TOPO, GLOO
    if sys.argv[1:] == ["env"]:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        dist.init_process_group("topocoll", rank=world.Get_rank(), world_size=world.Get_size())
    else:
        dist.init_process_group("topocoll")
    assert dist.get_backend() == "topocoll"
    r, p = dist.get_rank(), dist.get_world_size()
    from mpi4py import MPI  # imported after init_process_group: under torchrun that joins the world

    assert (r, p) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
    TOPO, GLOO = dist.group.WORLD, dist.new_group(backend="gloo")
    checks = (reductions, bitwise, movement, scatters, all_to_all, point_to_point, objects,
              functional, subgroups, torch_suite_features)
    if sys.argv[1:] == ["env"]:
        checks = (objects, subgroups)  # the rendezvous differs; the collectives don't
    for check in checks:
        check(r, p)
        dist.barrier()
    dist.destroy_process_group()


rank_main(body)
