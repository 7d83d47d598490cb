"""Non-contiguous tensors on "topocoll": every operation takes transposed, channels_last and
sliced-with-step tensors (and expand()ed ones as inputs), staged through contiguous copies as
gloo does, and gives what the same call on contiguous tensors gives (on gloo; the list
all_to_all on topocoll, whose contiguous form torch_collectives.py checks), blocking, async with
wait() and async with a future: the user's tensors hold the result when wait() returns and when
a .then() callback runs, and the future resolves to them. Outputs that overlap themselves
(expand()) raise ValueError naming their strides on every rank, and the group still works."""
import _common  # noqa: F401
from _common import rank_main

import warnings

import torch
import torch.distributed as dist

from topocoll import collectives
import topocoll.collectives.torch  # noqa: F401 - registers "topocoll"

warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames, not ours

SENTINEL = -7.0  # the gaps of a sliced-with-step tensor: no copy may touch them
UNSET = -5.0  # an output's elements before the call
IN_KINDS = ("contiguous", "transposed", "channels_last", "step", "expanded")
OUT_KINDS = ("contiguous", "transposed", "channels_last", "step")  # expanded: refused
MODES = ("blocking", "wait", "future")


def data(shape, rank, salt=0):
    """Small integers (1..4) as float32: exact in any order of summation."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n) * 7 + rank * 3 + salt) % 4 + 1).reshape(shape).float()


class Layout:
    """A 4-d tensor of the given values in one memory layout; ``intact()`` checks that nothing
    wrote into the gaps of its storage (a step slice's)."""

    def __init__(self, kind, values):
        self.kind, self.base = kind, None
        if kind == "contiguous":
            self.t = values.clone()
        elif kind == "transposed":
            self.t = values.transpose(0, 1).contiguous().transpose(0, 1)
        elif kind == "channels_last":
            self.t = values.contiguous(memory_format=torch.channels_last)
        elif kind == "step":
            shape = values.shape
            self.base = torch.full((*shape[:-1], 2 * shape[-1]), SENTINEL)
            self.t = self.base[..., ::2]
            self.t.copy_(values)
        elif kind == "expanded":  # one value per last row, read-only: every element the first's
            self.t = values[..., :1].expand(values.shape)
        assert self.t.shape == values.shape
        assert (kind == "contiguous") == self.t.is_contiguous(), (kind, self.t.stride())

    def intact(self, what):
        if self.base is not None:
            assert bool((self.base[..., 1::2] == SENTINEL).all()), f"{what}: a gap was written"


def inputs(kind, shapes, r, salt=0):
    return [Layout(kind, data(s, r, salt + i)) for i, s in enumerate(shapes)]


def outputs(kind, shapes, r, inplace):
    return [Layout(kind, data(s, r, 50 + i) if inplace else torch.full(s, UNSET))
            for i, s in enumerate(shapes)]


def run(name, call, ins, outs, mode, opts=None):
    """Issue ``call(group, in_tensors, out_tensors, async_op)`` on topocoll in ``mode``; the
    output tensors' values (as seen by a .then() callback, in future mode)."""
    ts, os_ = [x.t for x in ins], [x.t for x in outs]
    if mode == "blocking":
        w = call(TOPO, ts, os_, False)
        assert w is None or w.is_completed(), name
        return [o.clone() for o in os_]
    w = call(TOPO, ts, os_, True)
    if mode == "wait":
        w.wait()
        return [o.clone() for o in os_]
    seen = []
    fut = w if isinstance(w, torch.futures.Future) else w.get_future()  # all_reduce_coalesced
    chained = fut.then(lambda f: seen.append([o.clone() for o in os_]) or f.value())
    got = chained.wait()  # the future's value: the user's own tensors, not stand-ins
    assert len(got) == len(os_), f"{name}: the future has {len(got)} tensors for {len(os_)}"
    for g, o in zip(got, os_):
        assert (g.data_ptr(), g.stride()) == (o.data_ptr(), o.stride()), \
            f"{name}: the future resolved to a tensor other than the output"
    for a, b in zip(seen[0], os_):
        assert torch.equal(a, b), f"{name}: the .then() callback saw {a.flatten()[:6]} before " \
            f"the result {b.flatten()[:6]} was in place"
    return seen[0]


def compare(name, call, in_shapes, out_shapes, inplace, ref=None, skip=lambda i: False):
    """``call`` on topocoll with every layout pair and mode against ``ref`` (default ``call``
    itself on gloo) on contiguous copies of the same values."""
    r, p = RANK, SIZE
    mine = OUT_KINDS[r % len(OUT_KINDS)]  # ranks with layouts of their own
    if in_shapes:
        pairs = [(k, k) for k in OUT_KINDS] + [("expanded", "contiguous")] + \
            [("contiguous", k) for k in OUT_KINDS[1:]] + [(k, "contiguous") for k in OUT_KINDS[1:]]
        pairs.append((IN_KINDS[(r + 1) % len(IN_KINDS)], mine))
    else:  # in place: the one tensor is written
        pairs = [(k, k) for k in OUT_KINDS] + [(mine, mine)]
    for in_kind, out_kind in pairs:
        for mode in MODES:
            what = f"{name} in={in_kind} out={out_kind} {mode}"
            ins = inputs(in_kind, in_shapes, r)
            outs = outputs(out_kind, out_shapes, r, inplace)
            expect = [torch.full(s, UNSET) for s in out_shapes]
            if inplace:
                expect = [x.t.clone(memory_format=torch.contiguous_format) for x in outs]
            before = [x.t.clone() for x in ins]
            (ref or call)(GLOO, [x.t.clone(memory_format=torch.contiguous_format) for x in ins],
                          expect, False)
            got = run(what, call, ins, outs, mode)
            for i, (a, b) in enumerate(zip(got, expect)):
                if not skip(i):
                    assert torch.equal(a, b), f"{what}[{i}]: {a.flatten()[:8]} != {b.flatten()[:8]}"
            for x in ins + outs:
                x.intact(what)
            for x, b in zip(ins, before):  # inputs are only read
                assert torch.equal(x.t, b), f"{what}: an input changed"


def collectives_(r, p):
    s = (2, 3, 2, 2)  # 4-d, so channels_last applies; 24 elements
    big = (2 * p, 3, 2, 2)
    sum_ = dist.ReduceOp.SUM

    compare("all_reduce", lambda g, i, o, a: dist.all_reduce(o[0], op=sum_, group=g, async_op=a),
            [], [s], inplace=True)
    compare("all_reduce max", lambda g, i, o, a: dist.all_reduce(
        o[0], op=dist.ReduceOp.MAX, group=g, async_op=a), [], [s], inplace=True)
    compare("all_reduce_coalesced",
            lambda g, i, o, a: dist.all_reduce_coalesced(o, group=g, async_op=a), [], [s, big],
            inplace=True, ref=lambda g, i, o, a: [dist.all_reduce(t, group=g) for t in o])
    for root in sorted({0, p - 1}):
        compare(f"broadcast root={root}", lambda g, i, o, a, root=root: dist.broadcast(
            o[0], src=root, group=g, async_op=a), [], [s], inplace=True)
        compare(f"reduce root={root}", lambda g, i, o, a, root=root: dist.reduce(
            o[0], dst=root, group=g, async_op=a), [], [s], inplace=True,
            skip=lambda k, root=root: r != root)  # non-root contents are unspecified
    compare("all_gather", lambda g, i, o, a: dist.all_gather(o, i[0], group=g, async_op=a),
            [s], [s] * p, inplace=False)
    compare("all_gather_into_tensor", lambda g, i, o, a: dist.all_gather_into_tensor(
        o[0], i[0], group=g, async_op=a), [s], [big], inplace=False)
    compare("all_gather_coalesced", lambda g, i, o, a: dist.all_gather_coalesced(
        [o[2 * q:2 * q + 2] for q in range(p)], i, group=g, async_op=a), [s, big], [s, big] * p,
        inplace=False)
    compare("reduce_scatter", lambda g, i, o, a: dist.reduce_scatter(
        o[0], i, group=g, async_op=a), [s] * p, [s], inplace=False)
    compare("reduce_scatter_tensor", lambda g, i, o, a: dist.reduce_scatter_tensor(
        o[0], i[0], group=g, async_op=a), [big], [s], inplace=False)
    compare("all_to_all_single", lambda g, i, o, a: dist.all_to_all_single(
        o[0], i[0], group=g, async_op=a), [big], [big], inplace=False)
    splits = [2] * p  # rows of dim 0: uneven-path code with equal sizes

    compare("all_to_all_single splits", lambda g, i, o, a: dist.all_to_all_single(
        o[0], i[0], splits, splits, group=g, async_op=a), [big], [big], inplace=False)
    compare("all_to_all", lambda g, i, o, a: dist.all_to_all(o, i, group=g, async_op=a),
            [s] * p, [s] * p, inplace=False,
            ref=lambda g, i, o, a: dist.all_to_all(o, i, group=TOPO))  # gloo lacks it in 2.11
    for root in sorted({0, p - 1}):
        compare(f"gather root={root}", lambda g, i, o, a, root=root: dist.gather(
            i[0], o if r == root else None, dst=root, group=g, async_op=a),
            [s], [s] * p if r == root else [], inplace=False)
        compare(f"scatter root={root}", lambda g, i, o, a, root=root: dist.scatter(
            o[0], i if r == root else None, src=root, group=g, async_op=a),
            [s] * p, [s], inplace=False)


def coalesced_(r, p):
    """The coalesced tensor forms torch's _coalescing_manager calls, on the group itself."""
    s, big = (2, 3, 2, 2), (2 * p, 3, 2, 2)

    def agc(g, i, o, a):
        if g is GLOO:
            return [dist.all_gather_into_tensor(x, y, group=g) for x, y in zip(o, i)]
        w = PG.allgather_into_tensor_coalesced(o, i)
        return w if a else w.wait() and None

    def rsc(g, i, o, a):
        if g is GLOO:
            return [dist.reduce_scatter_tensor(x, y, group=g) for x, y in zip(o, i)]
        opts = dist.ReduceScatterOptions()
        if hasattr(opts, "asyncOp"):
            opts.asyncOp = a
        w = PG.reduce_scatter_tensor_coalesced(o, i, opts)
        return w if a else w.wait() and None

    compare("allgather_into_tensor_coalesced", agc, [s, s], [big, big], inplace=False)
    compare("reduce_scatter_tensor_coalesced", rsc, [big, big], [s, s], inplace=False)


def point_to_point(r, p):
    """A ring: each rank sends to the next and receives from the previous, every layout pair."""
    s = (2, 3, 2, 2)
    nxt, prv = (r + 1) % p, (r - 1) % p
    for in_kind, out_kind in zip(IN_KINDS, OUT_KINDS + ("step",)):
        for mode in MODES:
            what = f"send/recv in={in_kind} out={out_kind} {mode}"
            src, dst = inputs(in_kind, [s], r)[0], outputs(out_kind, [s], r, False)[0]
            expect = inputs(in_kind, [s], prv)[0].t.contiguous()
            sent = dist.isend(src.t, nxt, tag=11)
            if mode == "blocking":
                dist.recv(dst.t, prv, tag=11)
            elif mode == "wait":
                dist.irecv(dst.t, prv, tag=11).wait()
            else:
                seen = []
                w = dist.irecv(dst.t, prv, tag=11)
                w.get_future().then(lambda f: seen.append(dst.t.clone())).wait()
                assert torch.equal(seen[0], expect), f"{what}: callback saw {seen[0].flatten()}"
            sent.wait()
            assert torch.equal(dst.t, expect), f"{what}: {dst.t.flatten()} != {expect.flatten()}"
            src.intact(what)
            dst.intact(what)


def parameters(r, p):
    """A non-contiguous Parameter (a leaf that requires grad) is written as a plain tensor is,
    past autograd, as the collective's own writes to a contiguous one are."""
    for mode in MODES:
        w = torch.nn.Parameter(data((3, 4), r).t())
        ref = data((3, 4), r).t().contiguous()
        dist.all_reduce(ref, group=GLOO)
        got = run(f"all_reduce of a Parameter {mode}", lambda g, i, o, a: dist.all_reduce(
            o[0], group=g, async_op=a), [], [_Given(w)], mode)
        assert torch.equal(got[0], ref) and torch.equal(w.detach(), ref), (mode, w, ref)
        assert w.requires_grad and w.grad_fn is None, "the Parameter is still a leaf"
        got = run(f"irecv into a Parameter {mode}", lambda g, i, o, a: _ring(o[0], a), [],
                  [_Given(w)], mode)
        expect = data((3,), (r - 1) % p).expand(4, 3)
        assert torch.equal(got[0], expect) and torch.equal(w.detach(), expect), (mode, w)


class _Given:
    """A tensor given as is to ``run`` (the Layout interface)."""

    def __init__(self, t):
        self.t = t

    def intact(self, what):
        pass


def _ring(out, async_op):
    """Send this rank's (3,) data to the next rank, four times; receive the previous rank's four
    into the rows of ``out`` (4, 3): one receive of 12 elements, its Work if ``async_op``."""
    r, p = RANK, SIZE
    sent = dist.isend(data((3,), r).expand(4, 3), (r + 1) % p, tag=12)
    w = dist.irecv(out, (r - 1) % p, tag=12)
    if not async_op:
        w.wait()
    sent.wait()
    return w if async_op else None


def refused(r, p):
    """An expand()ed output (stride 0) raises ValueError naming it and its strides, blocking and
    async, on every rank; gather's outputs are the root's only, so the others raise the
    MismatchError that names the root. Nothing hangs: the group works afterwards."""
    s, big = (2, 3, 2, 2), (2 * p, 3, 2, 2)
    flat = torch.zeros(1)

    def ex(shape):
        return flat.expand(shape)

    strides = str(tuple(ex(s).stride()))
    x, xb = data(s, r), data(big, r)
    calls = [
        ("allreduce", lambda a: dist.all_reduce(ex(s), async_op=a)),
        ("allreduce_coalesced", lambda a: dist.all_reduce_coalesced([x.clone(), ex(s)],
                                                                    async_op=a)),
        ("broadcast", lambda a: dist.broadcast(ex(s), src=0, async_op=a)),
        ("reduce", lambda a: dist.reduce(ex(s), dst=0, async_op=a)),
        ("allgather output[1]", lambda a: dist.all_gather(
            [torch.empty(s)] + [ex(s)] * (p - 1), x, async_op=a)),
        ("all_gather output", lambda a: dist.all_gather_into_tensor(ex(big), x, async_op=a)),
        ("allgather_coalesced output", lambda a: dist.all_gather_coalesced(
            [[ex(s)] for _ in range(p)], [x], async_op=a)),
        ("reduce_scatter output", lambda a: dist.reduce_scatter(ex(s), [x] * p, async_op=a)),
        ("reduce_scatter output", lambda a: dist.reduce_scatter_tensor(ex(s), xb, async_op=a)),
        ("all_to_all output", lambda a: dist.all_to_all_single(ex(big), xb, async_op=a)),
        ("all_to_all output", lambda a: dist.all_to_all_single(ex(big), xb, [2] * p, [2] * p,
                                                               async_op=a)),
        ("alltoall output[0]", lambda a: dist.all_to_all([ex(s)] * p, [x] * p, async_op=a)),
        ("scatter output", lambda a: dist.scatter(ex(s), [x] * p if r == 0 else None, src=0,
                                                  async_op=a)),
        ("all_gather output", lambda a: PG.allgather_into_tensor_coalesced(
            [torch.empty(big), ex(big)], [x, x]).wait()),
        ("reduce_scatter output", lambda a: PG.reduce_scatter_tensor_coalesced(
            [ex(s), torch.empty(s)], [xb, xb], dist.ReduceScatterOptions()).wait()),
    ]
    for name, call in calls:
        for a in (False, True):
            _common.expect_raises(ValueError, lambda: call(a), name, "overlaps itself", strides)
    for a in (False, True):  # the root's outputs
        def gather(a=a):
            w = dist.gather(x, [torch.empty(s), ex(s)] + [torch.empty(s)] * (p - 2)
                            if r == 0 else None, dst=0, async_op=a)
            if w is not None:
                w.wait()

        if r == 0:
            _common.expect_raises(ValueError, gather, "gather output[1]", "overlaps itself",
                                  strides)
        else:
            _common.expect_raises(collectives.MismatchError, gather, "rank 0 rejected")
    # point to point: the receiver alone raises; nothing was sent
    _common.expect_raises(ValueError, lambda: dist.irecv(ex(s), (r - 1) % p), "recv",
                          "overlaps itself", strides)
    y = torch.full((3, 4), float(r)).t()  # the group works, and in step
    dist.all_reduce(y)
    assert bool((y == sum(range(p))).all()), y


def issue_order(r, p):
    """Calls queued on a non-contiguous tensor read it as the calls before them left it (issue
    order, as on a contiguous tensor): two async all_reduces in a row sum twice; a list
    reduce_scatter and all_to_all read tensors an async all_reduce before them wrote."""
    for trial in range(3):
        t = (torch.arange(12.0).reshape(3, 4) + r).t()  # transposed: staged
        first = dist.all_reduce(t, async_op=True)
        second = dist.all_reduce(t, async_op=True)
        second.wait()
        first.wait()
        want = sum(torch.arange(12.0).reshape(3, 4) + q for q in range(p)).t() * p
        assert torch.equal(t, want), (trial, t, want)
        parts = [torch.full((2,), float(r + k)) for k in range(p)]
        writes = dist.all_reduce(parts[r], async_op=True)  # contiguous, written before the reads
        out = torch.empty(2)
        reads = dist.reduce_scatter(out, parts, async_op=True)
        swapped = torch.empty(p * 2)
        exchanged = [swapped[2 * k:2 * k + 2] for k in range(p)]
        swaps = dist.all_to_all(exchanged, parts, async_op=True)
        for w in (swaps, reads, writes):
            w.wait()
        summed = float(p * (p - 1))  # every rank's parts[rank] (= 2 * rank), all_reduced
        want_rs = sum(float(q + r) for q in range(p) if q != r) + summed
        assert torch.all(out == want_rs), (trial, out, want_rs)
        got = [float(x[0]) for x in exchanged]  # rank k's parts[r]: its own slot reduced
        assert got == [summed if k == r else float(k + r) for k in range(p)], (trial, got)


def rejected_midway(r, p):
    """A coalesced call rejected at its second tensor on rank 0: the first tensor's call ran
    on every rank, so its result lands in rank 0's (non-contiguous) tensor too, as in the
    peers' (contiguous) ones; the group stays in step."""
    if p < 2:
        return
    for blocking in (False, True):
        first = (torch.ones(4, 3) * (r + 1)).t() if r == 0 else torch.ones(3, 4) * (r + 1)
        second = torch.zeros(1).expand(5) if r == 0 else torch.zeros(5)
        try:
            w = dist.all_reduce_coalesced([first, second, torch.ones(2)], async_op=not blocking)
            if w is not None:
                w.wait()
        except (ValueError, collectives.MismatchError) as err:
            assert isinstance(err, ValueError if r == 0 else collectives.MismatchError), err
        else:
            raise AssertionError("a coalesced call with a rejected tensor went through")
        dist.barrier()  # the first call has run everywhere by now
        assert torch.all(first == sum(range(1, p + 1))), (blocking, first)
        staged = torch.full((p, 2), -1.0).t() if r == 0 else torch.full((2, p), -1.0)
        bad = torch.zeros(1).expand(p * 2) if r == 0 else torch.zeros(p * 2)
        try:
            with dist._coalescing_manager(async_ops=True) as cm:
                dist.all_gather_into_tensor(staged, torch.full((2,), float(r)))
                dist.all_gather_into_tensor(bad, torch.full((2,), float(r)))
            cm.wait()
        except (ValueError, collectives.MismatchError):
            pass
        else:
            raise AssertionError("a coalesced all_gather with a rejected output went through")
        dist.barrier()
        want = torch.arange(float(p)).repeat_interleave(2)
        assert torch.equal(staged.reshape(-1), want), (blocking, staged)  # in logical order
    x = torch.ones(3)
    dist.all_reduce(x)
    assert torch.all(x == p), x


def body():
    global TOPO, GLOO, PG, RANK, SIZE
    dist.init_process_group("topocoll")
    RANK, SIZE = r, p = dist.get_rank(), dist.get_world_size()
    TOPO, GLOO = dist.group.WORLD, dist.new_group(backend="gloo")
    PG = dist.distributed_c10d._get_default_group()  # our ProcessGroupTopocoll itself
    for check in (collectives_, coalesced_, point_to_point, parameters, refused, issue_order,
                  rejected_midway):
        check(r, p)
        dist.barrier()
    dist.destroy_process_group()


rank_main(body)
