"""Bad input on "topocoll" raises a clear TypeError/ValueError on every rank, and nothing hangs:
the group still works afterwards. Bad input on one rank only: a MismatchError on the others."""
import _common  # noqa: F401
from _common import rank_main

import warnings

import torch
import torch.distributed as dist

from topocoll import collectives
import topocoll.collectives.torch  # noqa: F401

warnings.filterwarnings("ignore", category=FutureWarning)


class _Bad(torch.Tensor):
    """A tensor subclass whose memory can't be found (a library's tensor with a bug)."""

    def data_ptr(self):
        raise RuntimeError("data_ptr failed on this tensor")


def raises(kind, words, fn):
    try:
        fn()
    except kind as err:
        msg = str(err)
        for w in words:
            assert w.lower() in msg.lower(), f"{w!r} not in {msg!r}"
        return
    raise AssertionError(f"expected {kind.__name__} mentioning {words}")


def body():
    dist.init_process_group("topocoll")
    r, p = dist.get_rank(), dist.get_world_size()
    x = torch.ones(4)
    raises(ValueError, ["PREMUL_SUM", "not supported"],
           lambda: dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0)))
    for op, name in ((dist.ReduceOp.BAND, "band"), (dist.ReduceOp.BXOR, "bxor")):
        raises(TypeError, [name, "integer or bool", "float32"],
               lambda op=op: dist.all_reduce(x, op=op))
    raises(TypeError, ["meta", "NCCL"], lambda: dist.all_reduce(torch.ones(4, device="meta")))
    raises(ValueError, ["allreduce overlaps itself", "strides (1, 0)"],  # one element, 4 places
           lambda: dist.all_reduce(torch.ones(4, 1).expand(4, 4)))
    raises(TypeError, ["avg", "int"],
           lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG))
    raises(TypeError, ["avg", "bool"],
           lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG))
    raises(ValueError, ["elements", str(p * 4)],
           lambda: dist.all_gather_into_tensor(torch.empty(p * 4 + 1), x))
    raises(TypeError, ["dtype"], lambda: dist.all_gather_into_tensor(
        torch.empty(p * 4, dtype=torch.float64), x))
    raises(ValueError, ["elements"],
           lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(p * 4)))
    raises(ValueError, ["split", str(p)], lambda: dist.all_to_all_single(
        torch.empty(p + 1), torch.ones(p + 1)))
    raises(ValueError, ["input_split_sizes"], lambda: dist.all_to_all_single(
        torch.empty(p), torch.ones(p), [1] * p, [2] * p))
    if p > 1:  # rank 0 sends one row more to rank 1 than rank 1 expects: every rank raises
        ins = [1] * p
        outs = [1] * p
        if r == 0:
            ins = [0, 2] + [1] * (p - 2)
        raises(ValueError, ["rank 0 sends", "split sizes disagree"],
               lambda: dist.all_to_all_single(torch.empty(p), torch.ones(p), outs, ins))
        # shapes that differ between ranks: the agreement step fails on every rank
        raises(collectives.MismatchError, ["disagree"],
               lambda: dist.all_reduce(torch.ones(4 + r)))
        # bad arguments on the last rank only: it raises its own error, the others a
        # MismatchError naming it, at once (blocking and async)
        bad = p - 1

        def one_rank(kind, words, mine, theirs):
            if r == bad:
                raises(kind, words, mine)
            else:
                raises(collectives.MismatchError, [f"rank {bad} rejected its arguments"], theirs)

        one_rank(TypeError, ["band"], lambda: dist.all_reduce(x.clone(), op=dist.ReduceOp.BAND),
                 lambda: dist.all_reduce(x.clone()))
        one_rank(ValueError, ["elements"],
                 lambda: dist.all_gather_into_tensor(torch.empty(p * 4 + 1), x),
                 lambda: dist.all_gather_into_tensor(torch.empty(p * 4), x))
        one_rank(ValueError, ["split"],
                 lambda: dist.all_to_all_single(torch.empty(p + 1), torch.ones(p + 1)),
                 lambda: dist.all_to_all_single(torch.empty(p), torch.ones(p)))
        one_rank(TypeError, ["band"],
                 lambda: dist.all_reduce(x.clone(), op=dist.ReduceOp.BAND, async_op=True),
                 lambda: dist.all_reduce(x.clone(), async_op=True).wait())
        one_rank(ValueError, ["elements"],
                 lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(p * 4)),
                 lambda: dist.reduce_scatter_tensor(torch.empty(4), torch.ones(p * 4)))
        # coalesced: a bad second tensor on one rank; every peer call of the batch is rejected,
        # so the ranks stay in step (checked by the all_reduce at the end)
        good = [torch.ones(4), torch.ones(4), torch.ones(4)]
        one_rank(ValueError, ["overlaps itself"],
                 lambda: dist.all_reduce_coalesced([torch.ones(4), torch.ones(1).expand(4),
                                                    torch.ones(4)]),
                 lambda: dist.all_reduce_coalesced(good))
        pg = dist.distributed_c10d._get_default_group()  # our ProcessGroupTopocoll itself
        outs = [torch.empty(p * 4) for _ in range(3)]
        one_rank(ValueError, ["elements"],
                 lambda: pg.allgather_into_tensor_coalesced(
                     [outs[0], torch.empty(3), outs[2]], [x, x, x]).wait(),
                 lambda: pg.allgather_into_tensor_coalesced(outs, [x, x, x]).wait())
        # the same on a call the others repeat prepared (the same tensor, blocking): their
        # MismatchError comes from the prepared run and must not tell anyone in turn
        same = torch.ones(4)
        for _ in range(3):
            same.fill_(1)
            dist.all_reduce(same)
        for _ in range(2):
            same.fill_(1)
            one_rank(TypeError, ["band"], lambda: dist.all_reduce(same, op=dist.ReduceOp.BAND),
                     lambda: dist.all_reduce(same))
        for _ in range(3):
            same.fill_(1)
            dist.all_reduce(same)
            assert torch.all(same == p), same
        # coalesced: an error other than TypeError/ValueError on one rank's second tensor
        one_rank(RuntimeError, ["data_ptr failed"],
                 lambda: dist.all_reduce_coalesced([torch.ones(4), torch.ones(4).as_subclass(_Bad),
                                                    torch.ones(4)]),
                 lambda: dist.all_reduce_coalesced(good))
        # uneven all-to-all: the peers' first call is the split-table all-gather
        one_rank(ValueError, ["input_split_sizes"],
                 lambda: dist.all_to_all_single(torch.empty(p), torch.ones(p), [1] * p, [2] * p),
                 lambda: dist.all_to_all_single(torch.empty(p), torch.ones(p), [1] * p, [1] * p))
        # split sizes on one rank, none on the others: the split-size exchange (an all_gather)
        # meets the plain all_to_all; every rank's message names both and says why
        try:
            if r == 0:
                dist.all_to_all_single(torch.empty(p), torch.ones(p), [1] * p, [1] * p)
            else:
                dist.all_to_all_single(torch.empty(p), torch.ones(p))
        except collectives.MismatchError as err:
            assert "all_to_all and all_gather among them" in str(err) or \
                "all_gather and all_to_all among them" in str(err), str(err)
            assert any("split sizes on every rank or on none" in n for n in err.__notes__), err
        else:
            raise AssertionError("all_to_all_single with and without split sizes didn't raise")
        # gather and scatter agree first (their messages would pair with another call's)
        lists = [torch.empty(4) for _ in range(p)]
        one_rank(ValueError, ["gather output[0] overlaps itself"],  # the root's outputs
                 lambda: dist.gather(x, [torch.empty(1).expand(4)] + lists[1:], dst=bad),
                 lambda: dist.gather(x, None, dst=bad))
        one_rank(ValueError, ["overlaps itself"],
                 lambda: dist.scatter(torch.empty(1).expand(4), lists if r == 0 else None, src=0),
                 lambda: dist.scatter(torch.empty(4), lists if r == 0 else None, src=0))
        raises(collectives.MismatchError, ["scatter", "disagree on root"],
               lambda: dist.scatter(torch.empty(4), lists, src=r))  # each rank its own root
        raises(collectives.MismatchError, ["disagree on collective"],
               lambda: dist.gather(x, lists if r == 0 else None, dst=0) if r % 2 else
               dist.scatter(torch.empty(4), lists if r == 0 else None, src=0))
        # a gather met by a plain all_gather: the gather's rank says the calls differ, not
        # that it passed an int64 tensor (its agreement's all-gather is int64)
        if r == 0:
            raises(collectives.MismatchError, ["gather", "calls don't match"],
                   lambda: dist.gather(x, lists, dst=0))
        else:
            raises(collectives.MismatchError, ["disagree"],
                   lambda: dist.all_gather([torch.empty(4) for _ in range(p)], x))
        lists = [torch.full((4,), -1.0) for _ in range(p)]  # in step: each gets its own call's
        dist.gather(torch.full((4,), float(r)), lists if r == 0 else None, dst=0)
        if r == 0:
            assert all(torch.all(t == q) for q, t in enumerate(lists)), lists
    raises(ValueError, ["dst", "not a rank"], lambda: dist.isend(x, dst=p + 3))
    raises(ValueError, ["tag"], lambda: dist.recv(torch.empty(2), tag=1 << 31))  # any source
    raises(RuntimeError, ["sourceRank()", "recv"], lambda: dist.isend(x, dst=r, tag=2)._source_rank())
    dist.recv(torch.empty_like(x), src=r, tag=2)  # the isend to itself above
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.ones(2), (3,),
                                     check_invariants=True)
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    raises(ValueError, ["sparse", "SUM"], lambda: dist.all_reduce(sparse, op=dist.ReduceOp.MAX))
    raises(TypeError, ["sparse_csr", "dense"],
           lambda: dist.broadcast(torch.eye(3).to_sparse_csr(), src=0))
    raises(ValueError, ["tag"], lambda: dist.isend(x, dst=0, tag=1 << 31))
    raises(ValueError, [f"needs {p} tensors", "got 5"],
           lambda: dist.all_gather([torch.empty(4)] * 5, x))
    if p > 1:  # a tag beyond 32767 (MPICH's MPI_TAG_UB is 2**29 - 1), as gloo takes any
        big = 100000
        if r == 0:
            dist.send(torch.full((3,), 7.0), 1, tag=big)
        elif r == 1:
            got = torch.empty(3)
            dist.recv(got, 0, tag=big)
            assert torch.all(got == 7), got
    if p > 1:  # a message larger than the receiving tensor
        if r == 0:
            dist.send(torch.ones(8), 1, tag=9)
        elif r == 1:
            raises(RuntimeError, ["larger than the receiving tensor"],
                   lambda: dist.recv(torch.empty(4), 0, tag=9))
    if p > 2:  # the root's second receive of a gather fails to post: the first is kept
        from topocoll.collectives.backends import mpi
        pg = dist.distributed_c10d._get_default_group()
        n = 1 << 20  # 4 MiB: still in flight when the next receive is posted
        if r == 0:
            posted, real = [], pg._mpi.irecv

            def failing(buf, src, tag=0, channel="coll"):
                if posted:
                    raise RuntimeError("injected: posting a receive failed")
                posted.append(real(buf, src, tag, channel))
                return posted[-1]

            pg._mpi.irecv = failing
            outs = [torch.zeros(n) for _ in range(p)]
            try:
                w = dist.gather(torch.zeros(n), outs, dst=0, async_op=True)
                raises(RuntimeError, ["injected"], w.wait)
            finally:
                pg._mpi.irecv = real
            first = posted[0]
            assert any(k is first for k in mpi._ORPHANED) or first.Test(), \
                "the receive posted before the failure was dropped while in flight"
            first.Wait()  # it completes with rank 1's message, into the tensor it was for
            assert torch.all(outs[1] == 1), outs[1]
        else:  # rank 2's message is never received (it stays posted, kept when dropped)
            w = dist.gather(torch.full((n,), float(r)), None, dst=0, async_op=True)
        if r == 1:
            w.wait()
    y = torch.full((5,), float(r))
    dist.all_reduce(y)  # the group still works
    assert torch.all(y == sum(range(p))), y
    dist.destroy_process_group()


rank_main(body)
