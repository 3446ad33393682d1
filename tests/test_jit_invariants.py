"""Invariants of compiled executables: the memory plan, arena size against the reference's
peak live bytes, determinism (repeats, dispatch modes, thread counts), zero allocation per
run, refused inputs that change nothing, the warm disk cache under the strict policy in a
new process, and the Executable's inspection and save/load API.
"""

import builtins
import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import catbp_jit
from catbp_jit.bundle import load_bundle
from catbp_jit.cache import CacheMissError, KernelCache
from catbp_jit.errors import InputMismatchError, UnknownInputError
from catbp_jit.ir.adapt import adapt_program, adapt_programs
from catbp_jit.plan.arena import ALIGN_BYTES, CLASSES
from catbp_jit.plan.pipeline import plan
from catbp_jit.reference.kernels import keep_keys_from_drop
from catbp_jit.reference.vm import RegisterBank
from catbp_jit.semiring import SEMIRINGS
from conftest import CORPUS, REPO, shared_dir
from jit_helpers import assert_same_bits, check_memory_plan, count_allocations, executable, inputs
from random_programs import AB, AI, AJ, AK, gemm_case

MODES = ("compiled", "loop")
CORPUS_BY_NAME = {p.name: p for p in CORPUS}
# corpus bundles of different semirings and dtypes (two with NORMALIZE)
SOME_CORPUS = [
    n
    for n in (
        "grid3_d2__prob_float64_normalized",
        "grid3_d2__logprob_float64",
        "grid2x4_d3_sparse__sat_bool",
        "z4_cycle__maxlog_float64_normalized",
    )
    if n in CORPUS_BY_NAME
]


def bench_path(name):
    return shared_dir() / "bench" / name


def bench_param(name):
    return pytest.param(
        bench_path(name),
        id=name,
        marks=pytest.mark.skipif(
            not (bench_path(name) / "bundle.json").exists(), reason=f"no bench bundle {name}"
        ),
    )


_BUNDLES = {}


def bundle_at(path):
    path = Path(path)
    if path not in _BUNDLES:
        _BUNDLES[path] = load_bundle(path)
    return _BUNDLES[path]


def snapshot(slots):
    """Copies of the slot arrays (views are overwritten by the next run)."""
    return {k: np.array(v, copy=True) for k, (v, _) in slots.items()}


def assert_bit_identical(a, b, what=""):
    assert set(a) == set(b), what
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape, (what, k)
        assert x.tobytes() == y.tobytes(), (what, k, x, y)


# =====================================================================================
# Memory plan
# =====================================================================================

PLAN_BUNDLES = [pytest.param(p, id=p.name) for p in CORPUS] + [
    bench_param("chain200_d2__prob_float64"),
    bench_param("grid4x8_d2__prob_float64"),
]


@pytest.mark.parametrize("path", PLAN_BUNDLES)
def test_memory_plan_is_aligned_and_disjoint(path):
    b = bundle_at(path)
    exe = executable(b, "loop")
    sess = exe.bind()
    assert sess.mem.ctypes.data % ALIGN_BYTES == 0
    assert sess.mem.size == exe.memory.total
    check_memory_plan(exe, sess.mem.ctypes.data)


# =====================================================================================
# Arena bytes against the reference VM's peak live bytes
# =====================================================================================


def reference_peak_bytes(programs, sr_name, itemsize, factor_specs, selector_specs):
    """Peak, over instructions, of the bytes of distinct arrays the reference VM holds
    (registers and slots), simulated on specs: which instruction makes a new array and
    which shares one follows catbp_jit.reference (loads of matching dtype and LOAD_SLOT /
    STORE_SLOT share, an ELIMINATE that drops no axis returns a view, NORMALIZE rebinds
    its register to a new array in the semirings that normalize, FREE drops registers)."""
    fresh = itertools.count()
    slots = {}  # key -> (array identity, spec)
    peak = 0

    def nbytes(spec):
        return int(np.prod(spec.shape, dtype=np.int64)) * itemsize

    for prog in adapt_programs(programs):
        regs = {}  # registers are per program (each run_program starts a fresh VM)
        for ins in prog.instructions:
            op, a = ins.op.name, ins.args
            if op == "UNIT":
                regs[ins.dst] = (("new", next(fresh)), ins.spec)
            elif op == "LOAD_FACTOR":
                regs[ins.dst] = (("factor", a["factor_id"]), factor_specs[a["factor_id"]])
            elif op == "LOAD_SELECTOR":
                regs[ins.dst] = (("selector", a["selector_id"]), selector_specs[a["selector_id"]])
            elif op == "LOAD_SLOT":
                regs[ins.dst] = slots[a["slot"]]
            elif op == "STORE_SLOT":
                slots[a["slot"]] = regs[a["src"]]
            elif op == "CONTRACT":
                regs[ins.dst] = (("new", next(fresh)), a["out_spec"])
            elif op == "ELIMINATE":
                ident, spec = regs[a["src"]]
                keep = a.get("keep_keys")
                if keep is None:
                    keep = keep_keys_from_drop(spec, a.get("drop", ()))
                pos = spec.axis_pos()
                present = [k for k in keep if k in pos]
                out = type(spec)(tuple(spec.axes[pos[k]] for k in present))
                dropped = len(present) < len(spec.axes)
                regs[ins.dst] = ((("new", next(fresh)) if dropped else ident), out)
            elif op == "NORMALIZE":
                if SEMIRINGS[sr_name].normalizes:
                    regs[a["src"]] = (("new", next(fresh)), regs[a["src"]][1])
            elif op == "FREE":
                for r in a.get("srcs", ()):
                    regs.pop(r, None)
            else:  # pragma: no cover
                raise AssertionError(f"unknown op {op}")
            live = {ident: nbytes(spec) for ident, spec in itertools.chain(regs.values(), slots.values())}
            peak = max(peak, sum(live.values()))
    return peak


def reference_peak_bytes_measured(b):
    """The same peak, measured on the reference VM itself, one instruction at a time."""
    vm = catbp_jit.reference.VirtualMachine(b.semiring_runtime())
    peak = 0

    def root(x):
        while isinstance(x.base, np.ndarray):
            x = x.base
        return x

    for p in b.programs:
        vm.regs = RegisterBank()
        for ins in adapt_program(p).instructions:
            vm._execute(ins, b.factor_provider, b.selector_provider)
            live = {}
            for arr in itertools.chain(vm.regs.data.values(), (a for a, _ in vm.slots.data.values())):
                r = root(np.asarray(arr))
                live[id(r)] = r.nbytes
            peak = max(peak, sum(live.values()))
    return peak


def plan_only(b):
    """The memory plan of plan/pipeline.plan (fuse, hoist, plan_memory, ...): no kernel
    is compiled."""
    return plan(b.programs, b.semiring_runtime(), b.factor_specs(), b.selector_specs(), {}).memory


@pytest.mark.parametrize(
    "name",
    [
        "grid3_d2__prob_float64_normalized",
        "grid3_d2__sat_bool",
        "z4_cycle__logprob_float64_normalized",
        "z4_cycle__maxlog_float64_normalized",
    ],
)
def test_peak_simulation_matches_the_reference_vm(name):
    if name not in CORPUS_BY_NAME:
        pytest.skip(f"no corpus bundle {name}")
    b = bundle_at(CORPUS_BY_NAME[name])
    sim = reference_peak_bytes(
        b.programs, b.semiring_runtime().name, b.dtype.itemsize, b.factor_specs(), b.selector_specs()
    )
    assert sim == reference_peak_bytes_measured(b)


@pytest.mark.parametrize(
    "path", [bench_param("grid4x8_d2__prob_float64"), bench_param("grid5_d3__prob_float64")]
)
def test_arena_bytes_below_reference_peak(path):
    b = bundle_at(path)
    sr = b.semiring_runtime()
    peak = reference_peak_bytes(b.programs, sr.name, sr.dtype.itemsize, b.factor_specs(), b.selector_specs())
    if b.name.startswith("grid4x8"):
        # small enough to check the simulation against the reference VM itself
        assert peak == reference_peak_bytes_measured(b)
    memory = plan_only(b)
    print(
        f"{b.name}: arena {memory.total_bytes} bytes {memory.class_bytes()}, "
        f"reference peak live {peak} bytes, ratio {memory.total_bytes / peak:.3f}"
    )
    assert memory.total_bytes < peak


def test_plan_only_matches_compile():
    b = bundle_at(CORPUS_BY_NAME["grid3_d2__prob_float64_normalized"])
    exe = executable(b, "loop")
    memory = plan_only(b)
    assert memory.regions == exe.memory.regions
    assert memory.total_bytes == exe.memory.total_bytes


# =====================================================================================
# Determinism
# =====================================================================================

DETERMINISM = [pytest.param(CORPUS_BY_NAME[n], id=n) for n in SOME_CORPUS] + [
    bench_param("grid4x8_d2__prob_float64")
]


@pytest.mark.parametrize("path", DETERMINISM)
def test_repeated_runs_and_modes_are_bit_identical(path):
    b = bundle_at(path)
    factors, selectors = inputs(b)
    results = {}
    for mode in MODES:
        sess = executable(b, mode).bind()
        first = snapshot(sess.run(factors=factors, selectors=selectors))
        for _ in range(4):
            assert_bit_identical(
                first, snapshot(sess.run(factors=factors, selectors=selectors)), f"{b.name} {mode} repeat"
            )
        # a second session of the same executable too
        assert_bit_identical(
            first,
            snapshot(executable(b, mode).bind().run(factors=factors, selectors=selectors)),
            f"{b.name} {mode} new session",
        )
        results[mode] = first
    assert_bit_identical(results["compiled"], results["loop"], f"{b.name} compiled vs loop")


THREADS_CHILD = textwrap.dedent("""
    import json, sys
    import numba
    import numpy as np
    import catbp_jit
    from catbp_jit.bundle import load_bundle
    from catbp_jit.plan.options import PlanOptions
    path, out, min_work = sys.argv[1], sys.argv[2], int(sys.argv[3])
    options = PlanOptions(parallel_min_work=min_work)  # the same schedule as the parent's
    b = load_bundle(path)
    f = {k: np.ascontiguousarray(a, dtype=b.dtype) for k, (a, _) in b.factors.items()}
    s = {k: np.ascontiguousarray(a, dtype=b.dtype) for k, (a, _) in b.selectors.items()}
    arrays, info = {}, {"threads": numba.get_num_threads(), "keys": [], "par": {}}
    for mode in ("compiled", "loop"):
        exe = catbp_jit.compile(b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(),
                                selector_specs=b.selector_specs(), mode=mode, options=options)
        info["par"][mode] = sum(exe.schedule.chunks(i) > 1 for i in range(len(exe.schedule.steps)))
        slots = exe.bind().run(factors=f, selectors=s)
        keys = sorted(slots, key=repr)
        info["keys"] = [repr(k) for k in keys]
        for i, k in enumerate(keys):
            arrays[f"{mode}_{i}"] = np.array(slots[k][0], copy=True)
    np.savez(out, **arrays)
    print(json.dumps(info))
""")


def run_child(script, args, tmp_path, **env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    path = tmp_path / "child.py"
    path.write_text(script)
    return subprocess.run(
        [sys.executable, str(path), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
        timeout=300,
    )


def test_bit_identical_across_thread_counts(tmp_path, monkeypatch):
    """Steps cut in chunks give the same bits with 2 threads (here: the pool's) and 1 (a
    child process).

    The bench bundles' segments may all be below the planner's parallel threshold
    (PlanOptions.parallel_min_work is tuned for speed); the threshold is lowered here, and in the
    child, until the schedule has chunked steps, so the check is never moot."""
    import numba

    from catbp_jit.plan.options import PlanOptions

    path = bench_path("grid4x8_d2__prob_float64")
    if not (path / "bundle.json").exists():
        pytest.skip("no bench bundle grid4x8_d2__prob_float64")
    b = bundle_at(path)
    if numba.get_num_threads() < 2:
        pytest.skip("this process has fewer than 2 Numba threads")
    factors, selectors = inputs(b)

    def compile_all(min_work):
        options = PlanOptions(parallel_min_work=min_work)
        return {
            mode: catbp_jit.compile(
                b.programs,
                b.semiring_runtime(),
                factor_specs=b.factor_specs(),
                selector_specs=b.selector_specs(),
                mode=mode,
                options=options,
            )
            for mode in MODES
        }

    min_work = PlanOptions().parallel_min_work
    exes = compile_all(min_work)

    def chunked(exe):
        return sum(exe.schedule.chunks(i) > 1 for i in range(len(exe.schedule.steps)))

    while not chunked(exes["loop"]):
        assert min_work > 1 << 10, "no segment of the bundle is ever run in parallel"
        min_work >>= 2
        exes = compile_all(min_work)
    n_par = chunked(exes["compiled"])
    # (their kernels are the serial steps': no second variant to compile)
    assert not any(k.pattern.name.endswith("_par") for k in exes["compiled"].kernels)
    print(
        f"{b.name}: parallel_min_work {min_work}, {n_par} of "
        f"{len(exes['compiled'].schedule.steps)} steps parallel"
    )

    here = {}
    for mode, exe in exes.items():
        sess = exe.bind()
        here[mode] = snapshot(sess.run(factors=factors, selectors=selectors))
        for _ in range(4):
            assert_bit_identical(
                here[mode],
                snapshot(sess.run(factors=factors, selectors=selectors)),
                f"{mode} repeat, chunked steps",
            )
        # chunked steps allocate nothing per run either
        np_count, per_run = count_allocations(sess, factors, selectors, 10)
        assert np_count.allocations == 0, np_count
        assert len(set(per_run)) == 1 and per_run[0] <= (0 if mode == "loop" else 8), per_run
    assert_bit_identical(here["compiled"], here["loop"], "compiled vs loop")

    out = tmp_path / "slots1.npz"
    proc = run_child(
        THREADS_CHILD,
        [path, out, min_work],
        tmp_path,
        NUMBA_NUM_THREADS="1",
        CATBP_JIT_CACHE_DIR=os.environ["CATBP_JIT_CACHE_DIR"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["threads"] == 1
    assert info["par"] == {"compiled": n_par, "loop": n_par}
    keys = sorted(here["compiled"], key=repr)
    assert info["keys"] == [repr(k) for k in keys]
    with np.load(out) as z:
        for mode in MODES:
            there = {k: z[f"{mode}_{i}"] for i, k in enumerate(keys)}
            assert_bit_identical(here[mode], there, f"{mode}: 2 threads vs 1 thread")


# =====================================================================================
# Zero allocation per run
# =====================================================================================

ALLOC_BUNDLES = [bench_param(f"{n}__prob_float64") for n in ("chain200_d2", "grid4x8_d2", "grid6_d2")] + [
    pytest.param(CORPUS_BY_NAME[n], id=n) for n in SOME_CORPUS
]
RUNS = 100
# grid6_d2 runs take ~0.1 s each on 2 busy cores: fewer runs keep the suite's time modest
RUNS_FOR = {"grid6_d2__prob_float64": 10}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", ALLOC_BUNDLES)
def test_run_allocates_nothing(path, mode):
    b = bundle_at(path)
    sess = executable(b, mode).bind()
    factors, selectors = inputs(b)
    sess.run(factors=factors, selectors=selectors)  # warm-up
    runs = RUNS_FOR.get(b.name, RUNS)
    np_count, per_run = count_allocations(sess, factors, selectors, runs)
    print(f"{b.name} {mode}, {runs} runs: numpy {np_count}, NRT per run {sorted(set(per_run))}")
    assert np_count.allocations == 0, np_count
    assert np_count.reallocs == 0, np_count
    if mode == "loop":
        assert set(per_run) == {0}, per_run
    else:
        assert len(set(per_run)) == 1, per_run
        assert per_run[0] <= 8, per_run


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB"])
@pytest.mark.parametrize(
    "axes",
    [((AI, AK), (AK, AJ), (AI, AJ)), ((AI, AK, AB), (AB, AK, AJ), (AJ, AB, AI))],
    ids=["matrices", "copied"],
)
def test_reassociating_run_with_gemm_steps_allocates_nothing(semiring, mode, axes):
    """exact=False: BLAS GEMM steps (np.dot into the arena), their operands' copies and
    LOGPROB's exponentials (in the step's workspace) allocate nothing per run either."""
    case = gemm_case(semiring, "float64", *axes, norm=True)
    exe = catbp_jit.compile(
        case.programs,
        case.sr(),
        factor_specs=case.factor_specs,
        mode=mode,
        exact=False,
        options=catbp_jit.PlanOptions(gemm_program_min_terms=1),
    )
    assert any(st.pattern.template == "gemm" for st in exe.schedule.steps)
    sess = exe.bind()
    factors = case.inputs[0].factors
    sess.run(factors=factors)  # warm-up
    np_count, per_run = count_allocations(sess, factors, {}, RUNS)
    assert np_count.allocations == 0 and np_count.reallocs == 0, np_count
    if mode == "loop":
        assert set(per_run) == {0}, per_run
    else:
        assert len(set(per_run)) == 1 and per_run[0] <= 8, per_run


# =====================================================================================
# Refused inputs
# =====================================================================================


@pytest.fixture(scope="module")
def refusal_bundle():
    return bundle_at(CORPUS_BY_NAME["grid3_d2__prob_float64"])


@pytest.mark.parametrize("mode", MODES)
def test_refused_inputs_change_nothing(refusal_bundle, mode):
    b = refusal_bundle
    sess = executable(b, mode).bind()
    factors, selectors = inputs(b)
    good = snapshot(sess.run(factors=factors, selectors=selectors))
    fid = sorted(factors)[0]
    other = sorted(factors)[-1]
    arr = factors[fid]
    # a valid change to another factor comes along with every bad input: it must not be
    # copied in either (everything is checked before anything is copied)
    changed = {other: (factors[other] * 0.5 + 0.25).astype(b.dtype)}

    bad_inputs = [
        ("shape", InputMismatchError, fid, np.zeros(arr.shape + (2,), dtype=b.dtype)),
        ("shape", InputMismatchError, fid, np.zeros(arr.size + 1, dtype=b.dtype)),
        ("dtype", InputMismatchError, fid, arr.astype(np.float32)),
        ("dtype", InputMismatchError, fid, arr.astype(np.int64)),
        ("unknown", UnknownInputError, max(factors) + 1000, arr),
    ]
    sid = sorted(selectors)[0]
    bad_inputs = [("factor",) + x for x in bad_inputs] + [
        ("selector", "shape", InputMismatchError, sid, np.zeros(selectors[sid].size + 3, dtype=b.dtype)),
        ("selector", "dtype", InputMismatchError, sid, selectors[sid].astype(np.float32)),
        ("selector", "unknown", UnknownInputError, max(selectors) + 1000, selectors[sid]),
    ]
    for kind, what, err, ident, bad in bad_inputs:
        with pytest.raises(err) as info:
            if kind == "factor":
                sess.run(factors={**changed, ident: bad}, selectors=selectors)
            else:
                sess.run(factors={**factors, **changed}, selectors={**selectors, ident: bad})
        msg = str(info.value)
        assert f"{kind} {ident}" in msg, (what, msg)
        assert_bit_identical(good, snapshot(sess.slots), f"slots after a refused {what}")
        # the inputs were not touched: running again gives the previous results
        assert_bit_identical(good, snapshot(sess.run()), f"rerun after a refused {what}")

    # and the session still works with good inputs
    assert_bit_identical(good, snapshot(sess.run(factors=factors, selectors=selectors)), "good again")


@pytest.mark.parametrize("mode", MODES)
def test_missing_input_on_first_run(refusal_bundle, mode):
    b = refusal_bundle
    factors, selectors = inputs(b)
    missing = sorted(factors)[1]
    sess = executable(b, mode).bind()
    with pytest.raises(UnknownInputError) as info:
        sess.run(factors={k: v for k, v in factors.items() if k != missing}, selectors=selectors)
    msg = str(info.value)
    assert "factor" in msg and str(missing) in msg, msg
    assert "selector" not in msg, msg  # only what is missing is named

    sess = executable(b, mode).bind()
    with pytest.raises(UnknownInputError) as info:
        sess.run(factors=factors)
    assert "selector" in str(info.value), str(info.value)

    sess = executable(b, mode).bind()
    with pytest.raises(UnknownInputError) as info:
        sess.run()
    assert "no value given" in str(info.value) and "factor" in str(info.value), str(info.value)
    # once everything is given, it runs and matches a fresh session
    got = snapshot(sess.run(factors=factors, selectors=selectors))
    assert_bit_identical(got, snapshot(executable(b, mode).bind().run(factors=factors, selectors=selectors)))


def test_declared_but_unused_factor_is_still_checked(refusal_bundle):
    b = refusal_bundle
    factors, selectors = inputs(b)
    specs = b.factor_specs()
    unused = max(specs) + 1
    specs[unused] = specs[min(specs)]  # declared, never loaded by the programs
    exe = catbp_jit.compile(
        b.programs, b.semiring_runtime(), factor_specs=specs, selector_specs=b.selector_specs(), mode="loop"
    )
    sess = exe.bind()
    sess.run(factors=factors, selectors=selectors)
    with pytest.raises(InputMismatchError):
        sess.run(factors={unused: np.zeros((7, 7, 7), dtype=np.int8)})


# =====================================================================================
# Warm cache in a new process, strict policy
# =====================================================================================

STRICT_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import catbp_jit
    from catbp_jit.bundle import load_bundle
    from catbp_jit.executable import default_cache
    b = load_bundle(sys.argv[1])
    f = {k: np.ascontiguousarray(a, dtype=b.dtype) for k, (a, _) in b.factors.items()}
    s = {k: np.ascontiguousarray(a, dtype=b.dtype) for k, (a, _) in b.selectors.items()}
    out = {"policy": default_cache().policy, "dir": default_cache().directory, "runs": {}}
    for mode in ("compiled", "loop"):
        exe = catbp_jit.compile(b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(),
                                selector_specs=b.selector_specs(), mode=mode)
        z = exe.bind().run(factors=f, selectors=s)[("Z",)][0]
        out["runs"][mode] = {"stats": exe.cache_stats, "Z": float(z)}
    out["stats"] = default_cache().stats
    print(json.dumps(out))
""")


def test_warm_cache_new_process_strict(tmp_path):
    path = bench_path("grid6_d2__prob_float64")
    if not (path / "bundle.json").exists():
        pytest.skip("no bench bundle grid6_d2__prob_float64")
    b = bundle_at(path)
    factors, selectors = inputs(b)
    z_here = {}
    for mode in MODES:  # fills the session cache dir (if not done already)
        z_here[mode] = float(executable(b, mode).bind().run(factors=factors, selectors=selectors)[("Z",)][0])

    cache_dir = os.environ["CATBP_JIT_CACHE_DIR"]
    proc = run_child(STRICT_CHILD, [path], tmp_path, CATBP_JIT_CACHE="strict", CATBP_JIT_CACHE_DIR=cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print("strict child cache stats:", out["stats"], {m: r["stats"] for m, r in out["runs"].items()})
    assert out["policy"] == "strict"
    assert os.path.realpath(out["dir"]) == os.path.realpath(cache_dir)
    assert out["stats"]["misses"] == 0 and out["stats"]["compiled"] == 0, out["stats"]
    assert out["stats"]["rebuilt"] == 0, out["stats"]
    assert out["stats"]["hits"] > 0, out["stats"]
    for mode in MODES:
        assert out["runs"][mode]["stats"].get("misses", 0) == 0
        assert out["runs"][mode]["stats"].get("compiled", 0) == 0
        assert out["runs"][mode]["Z"] == z_here[mode]  # bit for bit, through JSON's repr


def test_cold_cache_strict_raises_naming_a_kernel(tmp_path):
    path = bench_path("grid6_d2__prob_float64")
    if not (path / "bundle.json").exists():
        path = CORPUS_BY_NAME["grid3_d2__prob_float64"]
    b = bundle_at(path)
    keys = {k.key for k in executable(b, "compiled").kernels}
    cold = KernelCache(str(tmp_path / "cold"), policy="strict")
    for mode in MODES:
        with pytest.raises(CacheMissError) as info:
            catbp_jit.compile(
                b.programs,
                b.semiring_runtime(),
                factor_specs=b.factor_specs(),
                selector_specs=b.selector_specs(),
                mode=mode,
                cache=cold,
            )
        msg = str(info.value)
        assert "kernel" in msg and "strict" in msg, msg
        assert any(k in msg for k in keys), msg
    assert cold.stats["compiled"] == 0


# =====================================================================================
# Executable API
# =====================================================================================


@pytest.fixture(scope="module")
def api_bundle():
    return bundle_at(CORPUS_BY_NAME["grid3_d2__prob_float64_normalized"])


@pytest.mark.parametrize("mode", MODES)
def test_as_text_mentions_every_step_and_kernel(api_bundle, mode):
    exe = executable(api_bundle, mode)
    text = exe.as_text()
    lines = text.splitlines()
    for i, k in enumerate(exe.kernels):
        assert any(line.strip().startswith(f"K{i} {k.pattern.name}") for line in lines), (i, k.pattern.name)
        assert k.key[:16] in text
    for i in range(len(exe.schedule.steps)):
        kid = exe.schedule.kernel_id(i)
        assert any(line.strip().startswith(f"[{i}] K{kid} ") for line in lines), i
    for key in exe.fused.outputs:
        assert repr(key) in text, key


def test_stats_counts(api_bundle):
    b = api_bundle
    exe = executable(b, "compiled")
    st = exe.stats()
    assert st["programs"] == len(b.programs)
    assert st["instructions"] == b.num_instructions()
    assert st["segments"] == len(exe.fused.segments) > 0
    assert st["steps"] == len(exe.schedule.steps) >= st["segments"]
    assert st["kernels"] == len(exe.kernels) == len(exe.schedule.patterns) > 0
    assert set(st["arena_bytes"]) == set(CLASSES)
    assert all(isinstance(v, int) and v >= 0 for v in st["arena_bytes"].values())
    assert st["arena_bytes"]["inputs"] > 0 and st["arena_bytes"]["slots"] > 0
    assert st["total_bytes"] == exe.memory.total_bytes >= sum(st["arena_bytes"].values())
    assert st["mode"] == "compiled" and st["target"] == "cpu"
    assert {"hits", "misses"} <= set(st["cache"])
    json.dumps(st)  # plain data


def test_kernel_source(api_bundle):
    exe = executable(api_bundle, "compiled")
    src = exe.kernel_source(0)
    assert "def kernel" in src
    builtins.compile(src, "<kernel 0>", "exec")  # valid Python
    for i, k in enumerate(exe.kernels):
        assert exe.kernel_source(k.pattern.name) == exe.kernel_source(i) == k.source
    assert exe.kernel_source("dispatcher")
    with pytest.raises(KeyError):
        exe.kernel_source(len(exe.kernels))


@pytest.mark.parametrize("mode", MODES)
def test_save_and_load_give_identical_slots(api_bundle, mode, tmp_path):
    b = api_bundle
    exe = executable(b, mode)
    path = tmp_path / "exe.json"
    exe.save(path)
    loaded = catbp_jit.load(path)
    assert loaded.mode == mode
    assert [k.key for k in loaded.kernels] == [k.key for k in exe.kernels]
    assert loaded.memory.total_bytes == exe.memory.total_bytes
    assert loaded.as_text() == exe.as_text()
    factors, selectors = inputs(b)
    a = snapshot(exe.bind().run(factors=factors, selectors=selectors))
    c = snapshot(loaded.bind().run(factors=factors, selectors=selectors))
    assert_bit_identical(a, c, "saved and loaded")
    specs = {k: s for k, (_, s) in loaded.bind().slots.items()}
    assert specs == {k: s for k, (_, s) in exe.bind().slots.items()}


def test_load_checks_the_saved_kernels_before_compiling(api_bundle, tmp_path):
    """A saved executable records what its kernels are; a file whose programs now plan to
    other kernels (edited, or saved by a catbp_jit that planned differently) is refused
    before anything is compiled, and nothing is left in the cache."""
    from catbp_jit.cache import KernelCache
    from catbp_jit.executable import SavedExecutableError

    path = tmp_path / "exe.json"
    executable(api_bundle, "compiled").save(path)
    doc = json.loads(path.read_text())
    assert doc["kernel_identities"] and len(doc["kernel_identities"]) == len(doc["kernels"])
    doc["kernel_identities"][0] = "0" * 64
    path.write_text(json.dumps(doc))
    empty = KernelCache(str(tmp_path / "cache"), policy="fallback")
    with pytest.raises(SavedExecutableError, match="kernels are not the ones"):
        catbp_jit.load(path, cache=empty)
    assert empty.stats.get("misses", 0) == 0 and empty.stats.get("compiled", 0) == 0


# =====================================================================================
# Whole-plan memory limit
# =====================================================================================

BIG_UNIT = """program big
  [0] UNIT dst=1 spec={G0: 1500000000}
  [1] STORE_SLOT args={'slot': ('Z',), 'src': 1}
"""


def test_plan_over_available_memory_is_refused_before_compiling(tmp_path, monkeypatch):
    from catbp_jit import memory
    from catbp_jit.ir.text import parse_programs

    monkeypatch.delenv("CATBP_JIT_MAX_BYTES", raising=False)
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 8 << 30)  # an 8 GiB host
    cold = KernelCache(str(tmp_path / "cold"), policy="fallback")
    with pytest.raises(memory.PlanTooLargeError) as info:
        catbp_jit.compile(
            parse_programs(BIG_UNIT), catbp_jit.make_semiring("prob", "float64"), factor_specs={}, cache=cold
        )
    msg = str(info.value)
    # 1.5e9 float64 values, planned twice (the constant and the slot it is stored to)
    assert "[big]" in msg and "24000000000 bytes" in msg and str(8 << 30) in msg, msg
    assert "constants 11.18 GiB" in msg and "slots 11.18 GiB" in msg, msg
    assert cold.stats["compiled"] == cold.stats["misses"] == 0
    assert not (tmp_path / "cold").exists()  # no kernel was even looked up


def test_explicit_total_memory_limit(tmp_path, monkeypatch):
    from catbp_jit.ir.text import parse_programs
    from catbp_jit.memory import PlanTooLargeError

    monkeypatch.setenv("CATBP_JIT_MAX_BYTES", "1")  # the argument wins over the environment
    progs = parse_programs(BIG_UNIT.replace("1500000000", "1000"))
    sr = catbp_jit.make_semiring("prob", "float64")
    with pytest.raises(PlanTooLargeError, match=r"16000 bytes.*limit of 15\.62 KiB \(15999 bytes\)"):
        catbp_jit.compile(progs, sr, factor_specs={}, max_total_bytes=15999)
    exe = catbp_jit.compile(progs, sr, factor_specs={}, max_total_bytes=16000)
    z = exe.bind().run()[("Z",)][0]
    assert z.shape == (1000,) and np.all(z == 1.0)


# =====================================================================================
# Drop-in run_program: a program mutated between calls
# =====================================================================================


def test_dropin_sees_a_program_mutated_in_place():
    from types import SimpleNamespace as NS

    from catbp_jit.ir.schema import Axis, AxisType, TensorSpec
    from catbp_jit.reference import run_program as reference_run_program

    sr = catbp_jit.make_semiring("prob", "float64")
    spec = TensorSpec((Axis(0, AxisType.GEOMETRIC, 3),))
    tables = {
        0: np.array([1.0, 2.0, 3.0]),
        1: np.array([10.0, 20.0, 30.0]),
        2: np.array([100.0, 200.0, 300.0]),
    }

    def fp(f):
        return (tables[f], spec)

    instructions = [
        NS(op="LOAD_FACTOR", dst=1, args={"factor_id": 0}, spec=None),
        NS(op="ELIMINATE", dst=2, args={"src": 1, "keep_keys": ()}, spec=None),
        NS(op="STORE_SLOT", dst=None, args={"slot": ("Z",), "src": 2}, spec=None),
    ]
    p = NS(instructions=instructions)

    def both(program):
        jit = float(catbp_jit.run_program(program, sr, fp, fp)[("Z",)][0])
        ref = float(reference_run_program(program, sr, fp, fp)[("Z",)][0])
        return jit, ref

    assert both(p) == (6.0, 6.0)
    p.instructions[0].args["factor_id"] = 1  # the args dict, in place
    assert both(p) == (60.0, 60.0)
    instructions[0] = NS(op="LOAD_FACTOR", dst=1, args={"factor_id": 2}, spec=None)
    assert both(instructions) == (600.0, 600.0)  # a list-based program, one entry replaced
    assert both(p) == (600.0, 600.0)  # p holds the same list
    p.instructions[0].args["factor_id"] = 0  # back to the first content: its cached plan
    assert both(p) == (6.0, 6.0)


def test_a_gatherer_reads_many_slots_at_once_and_allocates_nothing_per_call():
    """Session.gatherer(index): mem[index] as the last run left it, into a buffer made
    once; offsets outside the arena are refused when it is made (no kernel checks them)."""
    from catbp_jit.testing.alloc_counter import NumpyAllocCounter

    b = load_bundle(next(p for p in CORPUS if p.name == "z4_cycle__prob_float64"))
    exe = catbp_jit.compile(
        b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(), selector_specs=b.selector_specs()
    )
    sess = exe.bind()
    factors, selectors = inputs(b)
    results = [bd for bd in exe.plan.bindings if bd.kind == "result"]
    index = np.concatenate([np.arange(bd.offset, bd.offset + bd.size) for bd in results])
    gather = sess.gatherer(index[::-1])  # any order
    sess.run(factors=factors, selectors=selectors)
    with NumpyAllocCounter() as counted:
        got = gather()
    assert counted.allocations == 0 and got is gather()
    assert np.array_equal(got, sess.mem[index[::-1]])
    for bad in ([-1], [sess.mem.size], [0, sess.mem.size + 5]):
        with pytest.raises(ValueError, match="outside the arena"):
            sess.gatherer(np.array(bad))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_maxlog_parallel_kernels_give_the_reference_bits(dtype):
    """MAXLOG's max is exact in any order, so parallel steps (every segment cut in chunks
    here, GEMM steps parallel too) give the reference interpreter's bits, as serial ones
    do, in both modes; float32 too (its max and NORMALIZE stay float32, as numpy's)."""
    from catbp_jit.plan.options import PlanOptions

    name = "z4_cycle__maxlog_float64_normalized"
    if name not in CORPUS_BY_NAME:
        pytest.skip(f"no corpus bundle {name}")
    b = bundle_at(CORPUS_BY_NAME[name])
    sr = catbp_jit.make_semiring("MAXLOG", dtype)
    factors = {k: np.asarray(a, dtype=dtype) for k, (a, _) in b.factors.items()}
    selectors = {k: np.asarray(a, dtype=dtype) for k, (a, _) in b.selectors.items()}
    want: dict = {}
    with np.errstate(invalid="ignore"):
        for p in b.programs:
            want = catbp_jit.reference.run_program(
                p,
                sr,
                lambda f: (factors[f], b.factors[f][1]),
                lambda s: (selectors[s], b.selectors[s][1]),
                slots=want,
            )
    for mode in MODES:
        exe = catbp_jit.compile(
            b.programs,
            sr,
            factor_specs=b.factor_specs(),
            selector_specs=b.selector_specs(),
            mode=mode,
            options=PlanOptions(parallel_min_work=1, gemm_parallel_min_work=1),
        )
        assert any(exe.schedule.chunks(i) > 1 for i in range(len(exe.schedule.steps)))
        got = snapshot(exe.bind().run(factors=factors, selectors=selectors))
        assert_same_bits(got, {k: np.asarray(a) for k, (a, _) in want.items()}, f"{mode}, {dtype}")
