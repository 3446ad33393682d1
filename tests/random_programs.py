"""Random valid linked CatBP programs with matching inputs, for differential tests.

A `Case` is a linked list of 1-3 programs (upward, downward, finalize) over a random pool
of axes of both kinds (GEOMETRIC and TOPOLOGICAL, sometimes the same id in both), sizes
1-4 with at most 256 elements in any tensor, the factor / selector / outside-slot specs it
reads, and two sets of input values (so a bound session is run twice on different data).

The structure comes from a `Chooser`: either Hypothesis draws (`cases()`, which shrinks
to small programs) or a seeded `random.Random` (`case_from_seed`, for scripts). Values
come from a numpy generator seeded by one drawn integer.

The generator tracks an upper bound of the number of leaves of the fused segment that can
compute each value (a CONTRACT inlines a CONTRACT it reads first; an ELIMINATE or a
NORMALIZE joins its producer's segment) and keeps it within per-semiring limits
(`LIMITS`). (Kernels no longer depend on the number of leaves, so the limits bound the
size of a product, not the number of patterns to compile.)

Hand-written programs are built from the same instructions: `sp` (a spec), `load`,
`unit`, `contract`, `elim`, `normalize`, `store`, `load_slot`; `gemm_case` is a matrix
product as a Case.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec, make_semiring
from catbp_jit.ir.listing import format_programs
from catbp_jit.semiring import SEMIRINGS as SEMIRING_KINDS

G, T = AxisType.GEOMETRIC, AxisType.TOPOLOGICAL
OP = OpCode

MAX_ELEMENTS = 256
# Axis keys the pool is drawn from: ids 0-2 exist in both kinds, so (G, i) and (T, i)
# often meet in one tensor.
CANDIDATE_KEYS = [(G, 0), (G, 1), (G, 2), (G, 3), (T, 0), (T, 1), (T, 2)]
SIZES = [1, 1, 2, 2, 3, 3, 4, 4]  # size-1 axes are common

# (semiring, dtype) -> (max leaves of a segment, max leaves of a segment that normalizes)
SEMIRINGS: list[tuple[str, str]] = [
    ("PROB", "float64"),
    ("PROB", "float32"),
    ("LOGPROB", "float64"),
    ("SAT", "bool"),
    ("COUNT", "int64"),
    ("MAXLOG", "float64"),
]
LIMITS: dict[tuple[str, str], tuple[int, int]] = {
    ("PROB", "float64"): (5, 2),
    ("PROB", "float32"): (2, 1),
    ("LOGPROB", "float64"): (3, 1),
    ("SAT", "bool"): (2, 0),
    ("COUNT", "int64"): (2, 0),
    ("MAXLOG", "float64"): (3, 1),
    ("MAXLOG", "float32"): (2, 1),
}
PROGRAM_NAMES = ("upward", "downward", "finalize")


# ------------------------------------------------------------------------------ choosers


class Chooser:
    """The random decisions of the generator. Subclasses say where they come from."""

    def int(self, lo: int, hi: int) -> int:  # inclusive
        raise NotImplementedError

    def chance(self, p: float) -> bool:
        """True with probability about p; shrinks to False."""
        return self.int(0, 99) >= round(100 * (1 - p))

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.int(0, len(seq) - 1)]

    def permutation(self, seq: Sequence[Any]) -> list:
        rest, out = list(seq), []
        while rest:
            out.append(rest.pop(self.int(0, len(rest) - 1)))
        return out

    def subset(self, seq: Sequence[Any], min_size: int = 0) -> list:
        """A random subset in random order."""
        perm = self.permutation(seq)
        return perm[: self.int(min(min_size, len(perm)), len(perm))]

    def weighted(self, options: Sequence[tuple[Any, int]]) -> Any:
        total = sum(w for _, w in options)
        x = self.int(0, total - 1)
        for value, w in options:
            if x < w:
                return value
            x -= w
        raise AssertionError("unreachable")


class DrawChooser(Chooser):
    def __init__(self, draw: Callable):
        self.draw = draw

    def int(self, lo: int, hi: int) -> int:
        return lo if lo == hi else self.draw(st.integers(lo, hi))


class RandomChooser(Chooser):
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


# ---------------------------------------------------------------------------------- cases


@dataclass
class Inputs:
    factors: dict[int, np.ndarray]
    selectors: dict[int, np.ndarray]
    slots: dict[tuple, np.ndarray]


@dataclass
class Case:
    semiring: str
    dtype: np.dtype
    programs: list[Program]
    factor_specs: dict[int, TensorSpec]
    selector_specs: dict[int, TensorSpec]
    slot_specs: dict[tuple, TensorSpec]  # slots that exist before the first program
    inputs: list[Inputs]  # value sets, each complete
    pool: dict[tuple, int] = field(default_factory=dict)  # axis key -> size

    def sr(self):
        return make_semiring(self.semiring, self.dtype)

    def listing(self) -> str:
        def spec_line(kind, table):
            return "".join(f"  {kind} {k!r}: {v}\n" for k, v in table.items())

        return (
            f"semiring {self.semiring} {self.dtype.name}\n"
            + spec_line("factor", self.factor_specs)
            + spec_line("selector", self.selector_specs)
            + spec_line("slot", self.slot_specs)
            + format_programs(self.programs)
        )

    def factor_provider(self, which: int = 0):
        vals, specs = self.inputs[which].factors, self.factor_specs
        return lambda i: (vals[i], specs[i])

    def selector_provider(self, which: int = 0):
        vals, specs = self.inputs[which].selectors, self.selector_specs
        return lambda i: (vals[i], specs[i])

    def initial_slots(self, which: int = 0) -> dict[tuple, tuple[np.ndarray, TensorSpec]]:
        return {k: (self.inputs[which].slots[k], s) for k, s in self.slot_specs.items()}


@dataclass
class Value:
    """What the generator knows about a register or a slot."""

    spec: TensorSpec
    chain: int = 1  # leaves of the product a CONTRACT reading it first would inline
    seg: int = 1  # leaves of the segment that computes it (what a NORMALIZE joins)
    is_contract: bool = False


def _spec(keys, pool) -> TensorSpec:
    return TensorSpec(tuple(Axis(aid, kind, pool[(kind, aid)]) for kind, aid in keys))


# ------------------------------------------------------------------------------ values


def random_values(rng: np.random.Generator, spec: TensorSpec, semiring: str, dtype: np.dtype) -> np.ndarray:
    """Values of one input tensor, as an ndarray of dtype (0-d ones too)."""
    return np.asarray(_random_values(rng, spec.shape, semiring), dtype=dtype)


def _random_values(rng: np.random.Generator, shape: tuple, semiring: str):
    if semiring == "PROB":
        x = np.array(rng.uniform(0.05, 2.0, size=shape))
        r = rng.random()
        if r < 0.05:
            x = np.zeros(shape)  # all zero: NORMALIZE leaves it alone
        elif r < 0.4:
            x[rng.random(shape) < 0.3] = 0.0
        return x
    if semiring in ("LOGPROB", "MAXLOG"):
        x = np.array(rng.normal(0.0, 3.0, size=shape))
        r = rng.random()
        if semiring == "MAXLOG" and rng.random() < 0.3:  # ties: equal terms, exact sums
            x = np.array(rng.integers(-3, 1, size=shape), dtype=np.float64)
        if r < 0.07:
            x = np.full(shape, -np.inf)  # all -inf: NORMALIZE gives NaN, as CatBP's
        elif r < 0.45:
            x[rng.random(shape) < 0.3] = -np.inf
        return x
    if semiring == "SAT":
        return rng.random(shape) < rng.choice([0.1, 0.5, 0.9])
    if semiring == "COUNT":
        if rng.random() < 0.25:  # products and sums wrap around int64
            return rng.integers(-(2**62), 2**62, size=shape, dtype=np.int64)
        return rng.integers(0, 4, size=shape, dtype=np.int64)
    raise ValueError(semiring)


def selector_values(rng: np.random.Generator, spec: TensorSpec, semiring: str, dtype: np.dtype) -> np.ndarray:
    """σ(j, c) = 1 iff state j maps to mode c (last axis): one-hot rows, some all zero."""
    sr = make_semiring(semiring, dtype)
    shape = spec.shape
    if not shape:
        return np.asarray(sr.one(()), dtype=dtype)
    q = shape[-1]
    flat = int(np.prod(shape[:-1], dtype=np.int64))
    labels = rng.integers(-1, q, size=flat)
    hot = np.zeros((flat, q), dtype=bool)
    ok = labels >= 0
    hot[np.arange(flat)[ok], labels[ok]] = True
    out = np.where(hot, sr.one(()), sr.zero(()))
    return np.asarray(out.reshape(shape), dtype=dtype)


# --------------------------------------------------------------------------- the generator


class _Gen:
    def __init__(
        self,
        c: Chooser,
        semiring: str,
        dtype: str,
        *,
        max_programs: int = 3,
        max_ops: int = 12,
        outside_slots: bool = True,
        empty_contract: bool = True,
    ):
        self.c = c
        self.semiring, self.dtype = semiring, np.dtype(dtype)
        self.max_leaves, self.max_norm = LIMITS[(semiring, self.dtype.name)]
        self.normalizes = SEMIRING_KINDS[semiring].normalizes
        self.max_programs, self.max_ops = max_programs, max_ops
        self.outside_slots, self.empty_contract = outside_slots, empty_contract

    def pool(self) -> dict[tuple, int]:
        c = self.c
        keys = c.subset(CANDIDATE_KEYS, min_size=1)[:6]
        sizes = [c.choice(SIZES) for _ in keys]
        while int(np.prod(sizes)) > MAX_ELEMENTS:  # shrink the biggest axis
            sizes[int(np.argmax(sizes))] -= 1
        return dict(zip(keys, sizes))

    def rand_spec(self, max_axes: int | None = None) -> TensorSpec:
        keys = self.c.subset(list(self.P))
        return _spec(keys[:max_axes] if max_axes is not None else keys, self.P)

    def selector_spec(self) -> TensorSpec:
        geo = [k for k in self.P if k[0] == G]
        topo = [k for k in self.P if k[0] == T]
        if not topo or self.c.chance(0.15):
            return self.rand_spec()
        return _spec(self.c.subset(geo)[:3] + [self.c.choice(topo)], self.P)

    def build(self) -> Case:
        c = self.c
        self.P = self.pool()
        fids = c.subset(list(range(8)), min_size=1)[:4]
        factor_specs = {f: self.rand_spec() for f in sorted(fids)}
        selector_specs = {}
        if c.chance(0.5):
            selector_specs = {s: self.selector_spec() for s in sorted(c.subset([0, 3, 5])[:2])}
        slot_specs: dict[tuple, TensorSpec] = {}
        slots: dict[tuple, Value] = {}
        if self.outside_slots and c.chance(0.3):
            for i in range(c.int(1, 2)):
                key = ("given", i)
                slot_specs[key] = self.rand_spec()
                slots[key] = Value(slot_specs[key])
        self.factor_specs, self.selector_specs, self.slots = factor_specs, selector_specs, slots
        self.n_slots = 0

        n_programs = c.int(1, self.max_programs)
        programs = [
            self.program(
                PROGRAM_NAMES[i] if n_programs > 1 else PROGRAM_NAMES[0], i, last=(i == n_programs - 1)
            )
            for i in range(n_programs)
        ]

        seed = c.int(0, 2**32 - 1)
        inputs = []
        for which in range(2):
            rng = np.random.default_rng([seed, which])
            inputs.append(
                Inputs(
                    {f: random_values(rng, s, self.semiring, self.dtype) for f, s in factor_specs.items()},
                    {
                        i: selector_values(rng, s, self.semiring, self.dtype)
                        for i, s in selector_specs.items()
                    },
                    {k: random_values(rng, s, self.semiring, self.dtype) for k, s in slot_specs.items()},
                )
            )
        return Case(
            self.semiring,
            self.dtype,
            programs,
            factor_specs,
            selector_specs,
            slot_specs,
            inputs,
            dict(self.P),
        )

    # one program ---------------------------------------------------------------------

    def program(self, name: str, index: int, last: bool) -> Program:
        c = self.c
        self.live: dict[int, Value] = {}
        self.order: list[int] = []  # definition order of live registers
        self.next_rid = c.int(0, 5)
        self.ins: list[Instruction] = []
        for _ in range(c.int(1, self.max_ops)):
            self.step(index)
        if self.live and c.chance(0.85):  # most programs leave a result behind
            rid = self.order[-1] if c.chance(0.7) else c.choice(self.order)
            self.store(rid, index)
        if last and self.live and c.chance(0.4):  # a finalize-like Z
            rid = c.choice(self.order)
            dst = self.eliminate(rid, ())
            self.store(
                dst,
                index,
                key=("Z",) if ("Z",) not in self.slots or self.slots[("Z",)].spec == TensorSpec(()) else None,
            )
        if self.live and c.chance(0.7):
            self.free(sorted(self.live))
        return Program(tuple(self.ins), name)

    def define(self, ins: Instruction, value: Value) -> int:
        self.ins.append(ins)
        self.live[ins.dst] = value
        self.order.append(ins.dst)
        self.next_rid = ins.dst + self.c.choice([1, 1, 1, 2, 3])
        return ins.dst

    def step(self, index: int) -> None:
        c = self.c
        options = [("factor", 3), ("unit", 1), ("contract", 5)]
        if self.selector_specs:
            options.append(("selector", 1))
        if self.slots:
            options.append(("load_slot", 2))
        if self.live:
            options += [("eliminate", 3), ("normalize", 2), ("store", 2), ("free", 1)]
        kind = c.weighted(options)
        rid = self.next_rid
        if kind == "factor":
            fid = c.choice(sorted(self.factor_specs))
            self.define(Instruction(OP.LOAD_FACTOR, rid, {"factor_id": fid}), Value(self.factor_specs[fid]))
        elif kind == "selector":
            sid = c.choice(sorted(self.selector_specs))
            args = {"selector_id": sid} if c.chance(0.8) else {"mode_axis_id": sid}
            self.define(Instruction(OP.LOAD_SELECTOR, rid, args), Value(self.selector_specs[sid]))
        elif kind == "unit":
            spec = self.rand_spec()
            self.define(Instruction(OP.UNIT, rid, {}, spec), Value(spec))
        elif kind == "load_slot":
            key = c.choice(sorted(self.slots, key=repr))
            self.define(Instruction(OP.LOAD_SLOT, rid, {"slot": key}), self.slots[key])
        elif kind == "contract":
            self.contract()
        elif kind == "eliminate":
            chains = [r for r in self.order if self.live[r].is_contract]
            # an ELIMINATE of a product is the core of BP: it fuses with the product
            src = chains[-1] if chains and c.chance(0.4) else c.choice(self.order)
            self.eliminate(src, self.keep_keys(self.live[src].spec))
        elif kind == "normalize":
            self.normalize(self.order[-1] if c.chance(0.5) else c.choice(self.order))
        elif kind == "store":
            src = self.order[-1] if c.chance(0.5) else c.choice(self.order)
            self.store(src, index)
            if c.chance(0.3):  # the slot keeps the value from before the NORMALIZE
                self.normalize(src)
        elif kind == "free":
            self.free(c.subset(self.order, min_size=1))

    def contract(self) -> int:
        c = self.c
        n = c.weighted([(1, 3), (2, 4), (3, 3), (4, 2), (5, 1)] + ([(0, 1)] if self.empty_contract else []))
        if not self.live:
            n = 0 if self.empty_contract else None
            if n is None:  # nothing to multiply yet: multiply units
                spec = self.rand_spec()
                u = self.define(Instruction(OP.UNIT, self.next_rid, {}, spec), Value(spec))
                n, inputs = 1, [u]
            else:
                inputs = []
        else:
            chains = [r for r in self.order if self.live[r].is_contract]
            if chains and c.chance(0.5):
                first = chains[-1] if c.chance(0.6) else c.choice(chains)  # left-deep chain
            else:
                first = c.choice(self.order)
            recent = self.order[-4:]
            inputs = [first] + [
                c.choice(recent) if c.chance(0.5) else c.choice(self.order) for _ in range(max(n - 1, 0))
            ]
            if n == 0:
                inputs = []

        # A CONTRACT inlines the product its first input computes; UNIT inputs are dropped
        # first, so any input may end up first: bound by the longest chain among them.
        def chain_of(rs):
            return max(self.live[r].chain for r in rs) + len(rs) - 1 if rs else 1

        while chain_of(inputs) > self.max_leaves:
            inputs.pop()
        chain = chain_of(inputs)
        assert chain <= self.max_leaves
        required: list[tuple] = []
        for r in inputs:
            for ax in self.live[r].spec.axes:
                if ax.size > 1 and ax.key not in required:
                    required.append(ax.key)
        optional = [k for k in self.P if k not in required]
        keys = c.permutation(required + c.subset(optional)[: c.int(0, len(optional))])
        out = _spec(keys, self.P)
        args = {"inputs": tuple(inputs), "out_spec": out}
        seg = chain
        if len(inputs) == 1:  # a view: it may be folded into the segment computing its input
            seg = max(seg, self.live[inputs[0]].seg)
        return self.define(
            Instruction(OP.CONTRACT, self.next_rid, args, out),
            Value(out, chain=chain, seg=seg, is_contract=True),
        )

    def keep_keys(self, spec: TensorSpec):
        """keep_keys (a tuple) or ("drop", ids): every shape of argument the VM accepts."""
        c = self.c
        keys = list(spec.keys)
        mode = c.weighted([("subset", 5), ("none", 1), ("all", 1), ("absent", 1), ("drop", 1)])
        if mode == "subset":
            return tuple(c.subset(keys))
        if mode == "none":
            return ()
        if mode == "all":  # a pure transpose
            return tuple(c.permutation(keys))
        if mode == "absent":  # keys the input lacks are skipped
            others = [k for k in self.P if k not in keys] + [(T if k[0] == G else G, k[1]) for k in keys]
            others = list(dict.fromkeys(k for k in others if k not in keys))
            return tuple(c.permutation(c.subset(keys) + c.subset(others)[:2]))
        ids = sorted({k[1] for k in self.P})
        return ("drop", tuple(c.subset(ids)))

    def eliminate(self, src: int, keep) -> int:
        spec = self.live[src].spec
        if keep and keep[0] == "drop":
            drop = set(keep[1])
            args = {"src": src, "drop": tuple(keep[1])}
            kept = [k for k in spec.keys if k[1] not in drop]
        else:
            if self.c.chance(0.1):
                args = {"src": src, "keep_axis_keys": tuple(keep)}  # CatBP's other spelling
            else:
                args = {"src": src, "keep_keys": tuple(keep)}
            kept = [k for k in keep if spec.has_key(k)]
        out = spec.subset(kept)
        v = self.live[src]
        seg = v.chain if v.is_contract else 1
        if all(ax.size == 1 for ax in spec.axes if ax.key not in kept):
            # it only moves elements: it may become a view that the product is folded into,
            # which a CONTRACT then inlines like the product itself
            return self.define(
                Instruction(OP.ELIMINATE, self.next_rid, args),
                Value(out, chain=v.chain, seg=max(seg, v.seg), is_contract=v.is_contract),
            )
        return self.define(Instruction(OP.ELIMINATE, self.next_rid, args), Value(out, seg=seg))

    def normalize(self, src: int) -> None:
        v = self.live[src]
        if self.normalizes and v.seg > self.max_norm:
            return  # keep the number of kernel patterns bounded (see module docstring)
        self.ins.append(Instruction(OP.NORMALIZE, None, {"src": src}))
        if self.normalizes:  # a new value; in SAT and COUNT it is a no-op
            self.live[src] = Value(v.spec, chain=1, seg=v.seg)
        if self.c.chance(0.2):  # twice on one register
            self.ins.append(Instruction(OP.NORMALIZE, None, {"src": src}))

    def store(self, src: int, index: int, key=None) -> None:
        c = self.c
        v = self.live[src]
        if key is None:
            same = [k for k, s in self.slots.items() if s.spec == v.spec]
            if same and c.chance(0.4):
                key = c.choice(sorted(same, key=repr))  # rewritten, with the same spec
            else:
                self.n_slots += 1
                key = c.choice([("msg", index, self.n_slots), ("bel", self.n_slots), ("s", self.n_slots)])
        args = {"slot": key, "src": src} if c.chance(0.9) else {"slot_key": list(key), "src": src}
        self.ins.append(Instruction(OP.STORE_SLOT, None, args))
        self.slots[key] = v

    def free(self, rids: Sequence[int]) -> None:
        rids = list(rids)
        if len(rids) == 1 and self.c.chance(0.3):
            args = {"src": rids[0]}  # the single-register spelling
        else:
            args = {"srcs": tuple(rids)}
        self.ins.append(Instruction(OP.FREE, None, args))
        for r in rids:
            del self.live[r]
            self.order.remove(r)


def generate(c: Chooser, semiring: str, dtype: str, **kw) -> Case:
    return _Gen(c, semiring, dtype, **kw).build()


@st.composite
def cases(draw, semirings: Sequence[tuple[str, str]] = tuple(SEMIRINGS), **kw) -> Case:
    """Random valid linked programs with inputs, for one of `semirings` (name, dtype)."""
    semiring, dtype = draw(st.sampled_from(list(semirings)))
    return generate(DrawChooser(draw), semiring, dtype, **kw)


def case_from_seed(seed: int, semiring: str | None = None, dtype: str | None = None, **kw) -> Case:
    c = RandomChooser(seed)
    if semiring is None:
        semiring, dtype = c.choice(SEMIRINGS)
    return generate(c, semiring, dtype, **kw)


# ------------------------------------------------------------- hand-written programs


def sp(*axes) -> TensorSpec:
    """sp((G, 0, 2), (T, 3, 4)): a spec of (kind, id, size) axes."""
    return TensorSpec(tuple(Axis(aid, kind, size) for kind, aid, size in axes))


def load(dst, fid):
    return Instruction(OP.LOAD_FACTOR, dst, {"factor_id": fid})


def unit(dst, spec):
    return Instruction(OP.UNIT, dst, {}, spec)


def contract(dst, inputs, out):
    return Instruction(OP.CONTRACT, dst, {"inputs": tuple(inputs), "out_spec": out}, out)


def elim(dst, src, keep):
    return Instruction(OP.ELIMINATE, dst, {"src": src, "keep_keys": tuple(keep)})


def normalize(src):
    return Instruction(OP.NORMALIZE, None, {"src": src})


def store(key, src):
    return Instruction(OP.STORE_SLOT, None, {"slot": key, "src": src})


def load_slot(dst, key):
    return Instruction(OP.LOAD_SLOT, dst, {"slot": key})


# Σ_k a ⊗ b as a matrix product (test_reassociate's GEMM tests, test_jit_invariants')
AI, AJ, AK, AB = Axis(10, G, 12), Axis(11, G, 20), Axis(12, G, 24), Axis(13, G, 3)
AB2 = Axis(14, G, 4)  # a second batch axis: 12 products


def gemm_case(semiring, dtype, a_axes, b_axes, keep, norm=False, values=None, seed=0):
    """Σ_k a ⊗ b kept over `keep` (in that order), as a Case with random inputs."""
    a_spec, b_spec = TensorSpec(tuple(a_axes)), TensorSpec(tuple(b_axes))
    both = tuple(dict.fromkeys(a_axes + b_axes))
    prog = (
        [load(0, 0), load(1, 1), contract(2, (0, 1), TensorSpec(both)), elim(3, 2, [x.key for x in keep])]
        + ([normalize(3)] if norm else [])
        + [store(("out",), 3)]
    )
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    make = values or (lambda shape: rng.uniform(0.1, 2.0, shape))
    factors = {0: np.asarray(make(a_spec.shape), dt), 1: np.asarray(make(b_spec.shape), dt)}
    return Case(
        semiring,
        dt,
        [Program(tuple(prog), "upward")],
        {0: a_spec, 1: b_spec},
        {},
        {},
        [Inputs(factors, {}, {})],
    )


def scale_case(semiring, dtype="float64", seed=0, axes=(AI, AK, AJ)):
    """The front end's scaled tensor (frontend/emit_tree.py): t = Σ_k a ⊗ b, its total
    stored as ("scale",), t normalized and stored as ("t",), then read again (Σ t ⊗ c);
    axes: i, k and j."""
    AI, AK, AJ = axes
    a_spec, b_spec, c_spec = TensorSpec((AI, AK)), TensorSpec((AK, AJ)), TensorSpec((AJ, AI))
    t_spec = TensorSpec((AI, AJ))
    prog = [
        load(0, 0),
        load(1, 1),
        load(2, 2),
        contract(3, (0, 1), TensorSpec((AI, AK, AJ))),
        elim(4, 3, [AI.key, AJ.key]),
        elim(5, 4, []),
        store(("scale",), 5),
        normalize(4),
        store(("t",), 4),
        contract(6, (4, 2), t_spec),
        elim(7, 6, []),
        store(("Z",), 7),
    ]
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)

    def make(shape):
        x = rng.uniform(0.1, 2.0, shape)
        return np.log(x) if SEMIRING_KINDS[semiring].loads_logs else x

    factors = {f: np.asarray(make(sp.shape), dt) for f, sp in enumerate((a_spec, b_spec, c_spec))}
    return Case(
        semiring,
        dt,
        [Program(tuple(prog), "upward")],
        {0: a_spec, 1: b_spec, 2: c_spec},
        {},
        {},
        [Inputs(factors, {}, {})],
    )


# Sums into outputs i (3: fewer than a kernel's side-by-side outputs) and d over r (40)
# and s (21: not a whole number of lines): the reassociating mode's sums in lanes
# (tests/test_lane_sums.py, and on the GPU test_cuda_kernels.py)
LI, LD, LR, LS = Axis(20, G, 3), Axis(21, G, 5), Axis(22, G, 40), Axis(23, G, 21)
LANE_SUM_CASES = {
    # one leaf whose terms lie in a row in memory: the kernel adds them where they lie
    "one leaf": ((LI, LS), None, [LI]),
    # one leaf, 840 terms an output: vectors of 210 (a long axis is cut), each through buf
    "one leaf, vectors": ((LI, LR, LS), None, [LI]),
    # two leaves, 840 terms; in pieces of buf, the last a part of a line
    "two leaves": ((LI, LR, LS), (LD, LR, LS), [LI, LD]),
    # a leaf without r, repacked (plan/repack.py)
    "a leaf without r": ((LI, LR, LS), (LD, LS), [LI, LD]),
}


def lane_sum_case(name, semiring="PROB", dtype="float64", values=None):
    """LANE_SUM_CASES[name] as a Case: Σ a ⊗ b kept over its outputs, or Σ a alone."""
    a_axes, b_axes, keep = LANE_SUM_CASES[name]
    case = gemm_case(semiring, dtype, a_axes, b_axes or a_axes, keep, values=values)
    if b_axes is not None:
        return case
    prog = (load(0, 0), elim(1, 0, [x.key for x in keep]), store(("out",), 1))
    case.programs = [Program(prog, "upward")]
    case.factor_specs = {0: case.factor_specs[0]}
    case.inputs = [Inputs({0: case.inputs[0].factors[0]}, {}, {})]
    return case
