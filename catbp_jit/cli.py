"""`catbp-jit`: run and list catbp-bundles, and solve model files, from the command line.

    catbp-jit run BUNDLE_DIR [--engine jit|reference] [--mode compiled|loop] [--tier auto|compiled]
                             [--repeat N] [--quiet]
    catbp-jit list BUNDLE_DIR
    catbp-jit solve MODEL [--evidence FILE] [--observe VAR=STATE] [--semiring S] [--format text|uai|json]
    catbp-jit plan MODEL [--no-listing]

Exit status: 0 on success (and every expected slot matching); 1 when some expected slot
does not match (run) or no answer exists (solve: Z = 0, the evidence is impossible); 2 on
a usage or input error, a bad CATBP_JIT_* environment variable included (one line on
stderr). A kernel cache directory that cannot be written is not an error under the
default policy: kernels are compiled in memory, with one warning line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from .bundle import Bundle, load_bundle
from .cli_errors import CliError, check_kernel_cache
from .codegen.workers import KernelCompileError, WorkerOptionError
from .environment import EnvironmentSettingError, check_all
from .errors import CatbpError, bounded
from .semiring import SEMIRING_NAMES

if TYPE_CHECKING:
    from .executable import Executable
    from .ir import TensorSpec

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2
MAX_LISTED_MISMATCHES = 5

Slots = Mapping[tuple, tuple[np.ndarray, object]]


def _kernel_cache_refused(e: BaseException) -> bool:
    """Whether `e` is the kernel cache refusing its directory (CATBP_JIT_CACHE_DIR) or,
    under CATBP_JIT_CACHE=strict, a compile: raised from deep inside the first compile."""
    cache = sys.modules.get("catbp_jit.cache")  # not loaded: it cannot have raised
    return cache is not None and isinstance(e, (cache.CacheDirError, cache.CacheMissError))


# ---------------------------------------------------------------------------------------
# Engines: each turns a bundle into a function that runs all its programs and returns the
# final slots. Setup (compilation, for a JIT) happens here, outside the timed runs.


def _reference_engine(bundle: Bundle) -> Callable[[], Slots]:
    from .reference import run_program  # imported lazily: the CLI must start without it

    sr = bundle.semiring_runtime()

    def run() -> Slots:
        slots = None
        for p in bundle.programs:
            slots = run_program(p, sr, bundle.factor_provider, bundle.selector_provider, slots=slots)
        return slots if slots is not None else {}

    return run


@dataclass(frozen=True)
class _JitRun:
    """The jit engine's run (called: every program, the final slots) and what cmd_run
    reports of it: the executable, when compile() began, and a summary line."""

    run: Callable[[], Slots]
    exe: Executable
    started: float
    summary: str

    def __call__(self) -> Slots:
        return self.run()


def _jit_engine(
    bundle: Bundle, mode: str = "compiled", target: str = "cpu", tier: str | None = None, quiet: bool = True
) -> _JitRun:
    from .compiler import compile  # imported lazily: numba takes a moment to load
    from .executable import Executable
    from .progress import close, command_lines

    check_kernel_cache()
    t0 = time.perf_counter()
    progress = command_lines(quiet)  # lines on stderr once compiling takes a while
    try:
        exe = compile(
            bundle.programs,
            bundle.semiring_runtime(),
            factor_specs=bundle.factor_specs(),
            selector_specs=bundle.selector_specs(),
            mode=mode,
            target=target,
            tier=tier,
            progress=progress,
        )
    finally:
        close(progress)
    assert isinstance(exe, Executable)  # nothing batched: one executable
    session = exe.bind()
    factors = {fid: arr for fid, (arr, _) in bundle.factors.items()}
    selectors = {sid: arr for sid, (arr, _) in bundle.selectors.items()}
    stats = exe.stats()
    ready = time.perf_counter() - t0
    summary = (
        f"{'ready' if exe.tier == 'numpy' else 'compiled'} in {ready:.2f} s: "
        f"{stats['segments']} segments, {stats['kernels']} kernels (cache: "
        f"{stats['cache'].get('hits', 0)} hits, {stats['cache'].get('misses', 0)} "
        f"misses), arenas {stats['total_bytes']} bytes"
    )

    def run() -> Slots:
        slots = session.run(factors=factors, selectors=selectors)
        session.fetch()  # a GPU run is timed until its results are back on the host
        return slots

    return _JitRun(run, exe, t0, summary)


ENGINES: dict[str, Callable[..., Callable[[], Slots]]] = {
    "jit": _jit_engine,
    "reference": _reference_engine,
}


# ---------------------------------------------------------------------------------------
# Comparison with the bundle's expected slots


def _rtol_for(*dtypes: np.dtype) -> float:
    return 1e-5 if any(np.dtype(d) == np.float32 for d in dtypes) else 1e-9


def compare_slot(got: np.ndarray, want: np.ndarray, bundle_dtype: np.dtype) -> str | None:
    """None when `got` matches `want`, else a short reason."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != expected {want.shape}"
    if want.dtype.kind in "fc" or got.dtype.kind in "fc":
        rtol = _rtol_for(got.dtype, want.dtype, bundle_dtype)
        if np.allclose(got, want, rtol=rtol, atol=0, equal_nan=True):
            return None
        # inf - inf and NaN differences are NaN: ignore them when reporting the size.
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            err = np.nanmax(diff) if diff.size else 0.0
        return f"values differ (max abs diff {err:.3g}, rtol {rtol:g})"
    # bool and int semirings are exact (COUNT wraps around exactly like numpy's int64)
    if np.array_equal(got, want):
        return None
    return f"values differ ({int(np.count_nonzero(got != want))} of {want.size} entries)"


def compare_slots(got: Slots, bundle: Bundle) -> list[tuple[tuple, str]]:
    """(key, reason) for every expected slot that is missing or differs."""
    bad = []
    for key, (want, _) in (bundle.expected_slots or {}).items():
        if key not in got:
            bad.append((key, "missing"))
            continue
        reason = compare_slot(got[key][0], want, bundle.dtype)
        if reason is not None:
            bad.append((key, reason))
    return bad


# ---------------------------------------------------------------------------------------
# Subcommands


def _format_value(arr: Any) -> str:
    a = np.asarray(arr)
    return repr(a.item()) if a.size == 1 else np.array2string(a, threshold=8)


def _load(path: str) -> Bundle:
    try:
        return load_bundle(path)
    except (OSError, ValueError, KeyError) as e:
        raise CliError(str(e)) from None


def cmd_run(args: argparse.Namespace) -> int:
    bundle = _load(args.bundle)
    if args.repeat < 1:
        raise CliError(f"--repeat must be at least 1, got {args.repeat}")
    out = (lambda *a: None) if args.quiet else print
    jit_only = [f"--{name}" for name in ("mode", "target", "tier") if getattr(args, name) is not None]
    if args.engine != "jit" and jit_only:
        raise CliError(f"{', '.join(jit_only)} apply to the jit engine only, not --engine {args.engine}")
    from .target import get as get_target

    # (a target without the numpy tier compiles its kernels before the first run: CUDA)
    if args.tier is not None and args.target is not None and not get_target(args.target).tiers:
        raise CliError(
            "--tier applies to the CPU target only; --target cuda compiles its kernels before the first run"
        )
    args.mode, args.target = args.mode or "compiled", args.target or "cpu"

    run: Callable[[], Slots]
    jit: _JitRun | None = None  # the jit engine's
    try:
        if args.engine == "jit":
            run = jit = _jit_engine(bundle, args.mode, args.target, args.tier, args.quiet)
        else:
            run = ENGINES[args.engine](bundle)
        times: list[float] = []
        slots: Slots = {}
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            slots = run()
            times.append(time.perf_counter() - t0)
    except CatbpError as e:  # a malformed program or input: the bundle's fault, not ours
        raise CliError(f"bundle {bundle.name!r}: {e}") from None
    except (KernelCompileError, WorkerOptionError) as e:  # our environment's, named so
        raise CliError(f"bundle {bundle.name!r}: {e}") from None

    counts = ", ".join(f"{p.name} {len(p)}" for p in bundle.programs)
    out(f"bundle:    {bundle.name}")
    out(
        f"semiring:  {bundle.semiring} ({bundle.dtype.name})"
        + (", normalized messages" if bundle.normalized_messages else "")
    )
    out(f"programs:  {len(bundle.programs)} ({counts}); {bundle.num_instructions()} instructions")
    z = slots.get(("Z",))
    out(f"Z:         {_format_value(z[0]) if z is not None else '(no Z slot)'}")
    if bundle.Z_bruteforce is not None:
        out(f"Z (exact): {bundle.Z_bruteforce!r}")
    out(f"slots:     {len(slots)}")
    ms = [t * 1e3 for t in times]
    engine = args.engine + (f", {args.mode} mode, target {args.target}" if args.engine == "jit" else "")
    out(
        f"time:      best {min(ms):.3f} ms, median {statistics.median(ms):.3f} ms "
        f"over {len(ms)} run{'s' if len(ms) != 1 else ''} ({engine} engine)"
    )
    if jit is not None:  # args.engine == "jit"
        out(f"jit:       {jit.summary}")
        if jit.exe.tier == "numpy":
            out(
                "tier:      numpy (the kernels' results, computed by numpy while the kernels "
                "compile in the background)"
            )
            slots, failed = _compiled_tier(jit, slots, out)
            if failed:
                print(f"compiled tier: {failed}")
                return EXIT_MISMATCH

    if bundle.expected_slots is None:
        return EXIT_OK
    bad = compare_slots(slots, bundle)
    total = len(bundle.expected_slots)
    if not bad:
        out(f"expected slots: {total}/{total} match")
        return EXIT_OK
    # Mismatches are printed even with --quiet: they are the result.
    print(f"expected slots: {total - len(bad)}/{total} match, {len(bad)} MISMATCH")
    for key, reason in bad[:MAX_LISTED_MISMATCHES]:
        print(f"  {key!r}: {reason}")
    if len(bad) > MAX_LISTED_MISMATCHES:
        print(f"  ... and {len(bad) - MAX_LISTED_MISMATCHES} more")
    return EXIT_MISMATCH


def _compiled_tier(run: _JitRun, numpy_slots: Slots, out: Callable[..., None]) -> tuple[Slots, str]:
    """Wait for the kernels, run once more with them: (their slots, "" when they are the
    numpy tier's very bits, else what differs)."""
    exe = run.exe
    try:
        exe.wait()
    except KernelCompileError as e:
        raise CliError(str(e)) from None
    kept = {k: np.array(v, copy=True) for k, (v, _) in numpy_slots.items()}
    t0 = time.perf_counter()
    slots = run()
    took = time.perf_counter() - t0
    differ = [
        k
        for k, v in kept.items()
        if not np.array_equal(
            np.asarray(slots[k][0]).reshape(-1).view(np.uint8), v.reshape(-1).view(np.uint8)
        )
    ]
    out(
        f"compiled:  kernels ready {time.perf_counter() - run.started:.2f} s after "
        f"compile() began; a run with them took {took * 1e3:.3f} ms and gave "
        + ("the same bits" if not differ else f"other bits in {len(differ)} slots")
    )
    return slots, (f"{len(differ)} slots differ from the numpy tier's, e.g. {differ[0]!r}" if differ else "")


def cmd_list(args: argparse.Namespace) -> int:
    bundle = _load(args.bundle)
    try:
        from .ir.text import format_programs  # lazily: the listing module is optional here
    except ImportError as e:
        raise CliError(f"program listing is unavailable: {e}") from None
    print(format_programs(bundle.programs))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="catbp-jit", description="Run and inspect CatBP program bundles.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run a bundle's programs and check the expected slots")
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="bundle directory (or its bundle.json)")
    p.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default="jit",
        help="executor to run the programs with (default: jit)",
    )
    # --mode, --target and --tier default to None so that the reference engine can refuse them
    p.add_argument(
        "--mode",
        choices=("compiled", "loop"),
        default=None,
        help="jit dispatch: one compiled dispatcher, or a Python loop (default: compiled)",
    )
    p.add_argument(
        "--target",
        choices=("cpu", "cuda"),
        default=None,
        help="jit target: the CPU (default) or an NVIDIA GPU (needs numba-cuda: pip install -e '.[cuda]')",
    )
    p.add_argument(
        "--tier",
        choices=("auto", "compiled"),
        default=None,
        help="jit: auto (default, or $CATBP_JIT_TIER) answers at once from numpy "
        "while cold kernels compile, then checks a run with them; compiled "
        "waits for the kernels first",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="number of timed runs; best and median are reported (default: 3)",
    )
    p.add_argument(
        "--quiet", "-q", action="store_true", help="print nothing unless some expected slot does not match"
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("list", help="print a bundle's programs")
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="bundle directory (or its bundle.json)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "aot",
        help="plan every bucket, compile every kernel into the cache, save the profile",
        description="Compile ahead of time: afterwards catbp_jit.load(PROFILE) (or the same "
        "model solved again) compiles nothing, even with CATBP_JIT_CACHE=strict.",
    )
    p.add_argument(
        "input", metavar="INPUT", help="a catbp-bundle directory, or a model (.uai, .bif, a bnlearn name)"
    )
    p.add_argument(
        "--buckets",
        metavar="N,N,...",
        help="batch sizes to plan (with --batched-factors/--evidence-vars); "
        "default: no batch axis (a bundle), 1,64,1024 (a model)",
    )
    p.add_argument("--batched-factors", metavar="ID,ID,...", help="bundle factor ids that get a batch axis")
    p.add_argument(
        "--batched-selectors", metavar="ID,ID,...", help="bundle selector ids that get a batch axis"
    )
    p.add_argument(
        "--evidence-vars",
        metavar="VAR,VAR,...",
        help="a model's evidence variables (their indicators are batched)",
    )
    # --semiring defaults to None so that a bundle (which has its own) can refuse it
    p.add_argument(
        "--semiring",
        choices=[s.lower() for s in SEMIRING_NAMES],
        default=None,
        help="a model's semiring (default prob)",
    )
    p.add_argument("--mode", choices=("compiled", "loop"), default="compiled")
    p.add_argument(
        "--target",
        choices=("cpu", "cuda"),
        default="cpu",
        help="compile for the CPU (default) or this machine's NVIDIA GPU",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="PROFILE",
        help="where to save the executable (JSON; default INPUT's name + .profile.json)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    from .frontend.commands import add_commands, guarded

    p.set_defaults(func=guarded(cmd_aot))
    add_commands(sub)
    return parser


def _id_list(text: str | None, what: str) -> tuple:
    if not text:
        return ()
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CliError(f"{what} must be comma-separated integers, got {text!r}") from None


def _refuse_other_kinds_options(args: argparse.Namespace, is_bundle: bool) -> None:
    """aot: a bundle brings its own semiring and factors, a model its own variables: an
    option for the other kind of input would be silently ignored, so it is an error."""

    def given(*names: str) -> list[str]:
        return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is not None]

    if is_bundle and given("semiring", "evidence_vars"):
        raise CliError(
            f"{', '.join(given('semiring', 'evidence_vars'))}: for a model only; "
            f"{args.input} is a bundle (it has its own semiring; batch it with "
            "--batched-factors/--batched-selectors)"
        )
    if not is_bundle and given("batched_factors", "batched_selectors"):
        raise CliError(
            f"{', '.join(given('batched_factors', 'batched_selectors'))}: for a "
            f"bundle only; {args.input} is a model (batch it with --evidence-vars)"
        )
    batched = args.batched_factors or args.batched_selectors or args.evidence_vars
    if args.buckets is not None and not batched:
        raise CliError(
            "--buckets: there is no batch axis to plan them for; give "
            + ("--batched-factors or --batched-selectors" if is_bundle else "--evidence-vars")
        )


def cmd_aot(args: argparse.Namespace) -> int:
    """catbp-jit aot: see catbp_jit/aot.py."""
    from tqdm import tqdm

    from .aot import compile_ahead
    from .executable import model_options
    from .frontend.commands import read_model
    from .target import get as get_target

    buckets = _id_list(args.buckets, "--buckets") or None
    path = Path(args.input)
    model_entry = None
    fspecs: Mapping[int, TensorSpec]
    exact: bool | None = None  # a bundle: compile()'s mode and options
    options = None
    is_bundle = (path / "bundle.json").exists() or path.name == "bundle.json"
    _refuse_other_kinds_options(args, is_bundle)
    if is_bundle:
        bundle = _load(args.input)
        programs, sr = bundle.programs, bundle.semiring_runtime()
        fspecs, sspecs = bundle.factor_specs(), bundle.selector_specs()
        bf = _id_list(args.batched_factors, "--batched-factors")
        bs = _id_list(args.batched_selectors, "--batched-selectors")
        name = bundle.name
    else:
        from .frontend.build import build_model

        graph = read_model(args.input)  # CommandError for what is no model
        ev = tuple(v for v in (args.evidence_vars or "").split(",") if v)
        args.semiring = args.semiring or "prob"
        # the plan and programs only (the reference target compiles nothing)
        built = build_model(graph, args.semiring, evidence_vars=ev, target="reference")
        programs, sr, fspecs, sspecs = list(built.programs), built.sr, built.factor_specs, {}
        bf, bs = built.batched_factor_ids(), ()
        from .frontend.model_source import DEFAULT_BUCKETS, profile_entry

        buckets = (buckets or DEFAULT_BUCKETS) if bf else None
        name = graph.name
        model_entry = profile_entry(args.input, args.semiring, ev, buckets, args.target)
        # the mode compile_model runs the model in there (the CPU's reassociating mode),
        # and its options: its kernels, not exact mode's
        exact = get_target(args.target).model_exact
        options = model_options(args.target, exact)
    out = Path(args.output) if args.output else Path(f"{name}.profile.json")
    if out.is_dir():  # before compiling, not after
        raise CliError(f"-o {out}: is a directory; the profile is a file")

    def bar(total: int) -> Any:  # a tqdm bar
        return tqdm(
            total=total,
            unit="kernel",
            desc=f"compiling {name}",
            file=sys.stderr,
            disable=args.quiet,
            dynamic_ncols=True,
        )

    exe, report = compile_ahead(
        programs,
        sr,
        factor_specs=fspecs,
        selector_specs=sspecs,
        batched_factors=bf,
        batched_selectors=bs,
        buckets=buckets,
        mode=args.mode,
        target=args.target,
        bar=bar,
        exact=exact,
        options=options,
    )
    from .atomic import replacing

    with replacing(out) as tmp:  # the old profile stays until the new one is whole
        exe.save(tmp)
        if model_entry is not None:  # which model, so that catbp_jit.dask can compile it again
            from .frontend.model_source import add_profile_entry

            add_profile_entry(tmp, model_entry)
    print(
        f"{name}: {report.kernels} kernels ({report.compiled} compiled now, "
        f"{report.kernels - report.compiled} already cached) in {report.cache_dir}"
    )
    print(
        f"profile: {out} ({args.mode} mode"
        + (f", buckets {','.join(map(str, report.buckets))}" if report.buckets else "")
        + f"), {report.seconds:.1f} s"
    )
    return EXIT_OK


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: IO[str] | None = None,
    line: str | None = None,
) -> None:
    """A warning (a CPT that does not sum to 1, a cache bypassed) is one line on stderr, as
    an error is, without Python's file, line and source."""
    print(f"catbp-jit: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _report(e: BaseException) -> int:
    """The error as one line on stderr, however its message was built (a library's text
    may end in a newline; a path or a value quoted from a file may be long)."""
    message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    print(f"catbp-jit: error: {bounded(message)}", file=sys.stderr)
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings():  # restores Python's own display when main returns
        warnings.showwarning = _one_line_warning
        return _main(argv)


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits on --help (0) and on usage errors (2)
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    try:
        check_all()  # a bad environment variable is one line, whatever the subcommand
        return args.func(args)
    except (CliError, EnvironmentSettingError) as e:
        return _report(e)
    except RuntimeError as e:
        if not _kernel_cache_refused(e):
            raise
        return _report(e)
    except BrokenPipeError:  # output piped into `head`: stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
