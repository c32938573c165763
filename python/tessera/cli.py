"""The ``tessera`` command line.

tessera passes --target hopper          print a config's expanded pass list
tessera passes --check                  compare every config with tests/golden/passes/<name>.txt
tessera passes --update                 rewrite the golden files (commit the diff on purpose)
tessera passes --list                   every registered pass with its arguments
tessera lower FILE.py:FACTORY --target T [--arg N=V ...] [--out DIR] [--dump DIR]
                                        lower a TileLang tile program and write its artifacts
tessera compile FILE.py[:KERNEL] --target T [--shapes M=4096,N=4096] [--dump graph,sched,tile,target]
                [--out DIR] [--autotune] compile a @tessera.kernel and write its stages
tessera tune FILE.py[:KERNEL] --target T [--shapes M=512,N=512] [--space JSON] [--workers N]
             [--max-candidates N] [--repeats N] [--compile-timeout S] [--no-cache] [--dry-run] [--json FILE]
                                        autotune its schedules; prints every candidate and the best
tessera export FILE.py[:KERNEL] [--target cpu] [--shapes M=128,N=64 [--shapes M=256,N=64]] --out DIR
                                        write <kernel>.so (tvm-ffi entry), <kernel>.h, <kernel>.tsrb, metadata.json
tessera runtime --out DIR [--sanitize]  build libtessera_rt.so, the tsr* C runtime (include/tessera/tsr.h)
tessera metrics FILE.jsonl|FILE.csv [--prometheus OUT]
                                        p50/p95/max per kernel of a TESSERA_METRICS file
tessera pack-repro CAPTURE_DIR [-o OUT.tar.gz]
tessera pack-repro FILE.py[:KERNEL] [--target cpu] [--shapes M=128,..] [-o OUT.tar.gz]
                                        bundle a crash capture, or a kernel with sample inputs and outputs
tessera replay PACK.tar.gz|CAPTURE_DIR [--run] [--json]
                                        reproduce the pack's failure or check its outputs (0: reproduced)
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

_GOLDEN = Path("tests") / "golden" / "passes"


def _find_golden_dir(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    for base in [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[2]]:
        if (base / _GOLDEN).is_dir():
            return base / _GOLDEN
    raise SystemExit("tessera passes: cannot find tests/golden/passes; run from the repository or pass --golden-dir")


def _cmd_passes(args: argparse.Namespace) -> int:
    from tessera_tvm import registry
    from tessera_tvm.config import available_configs, load_config
    from tessera_tvm.pipeline import ensure_registered, format_pass_list

    ensure_registered()
    if args.list:
        for spec in registry.list_passes():
            params = ", ".join(f"{n}: {p.type_name()} = {p.default!r}" for n, p in spec.params.items())
            print(f"{spec.name}({params})  [{spec.ir}] {spec.doc}")
        for pred in registry.list_predicates():
            print(f"ir.{pred.name}  (condition) {pred.doc}")
        return 0
    if args.check or args.update:
        golden_dir = _find_golden_dir(args.golden_dir)
        names = [args.target] if args.target else available_configs()
        failed = []
        for name in names:
            text = format_pass_list(load_config(name))
            path = golden_dir / f"{load_config(name).name}.txt"
            if args.update:
                path.write_text(text)
                print(f"wrote {path}")
                continue
            expected = path.read_text() if path.is_file() else ""
            if expected != text:
                failed.append(name)
                diff = difflib.unified_diff(
                    expected.splitlines(True), text.splitlines(True), fromfile=str(path), tofile=f"{name} (current)"
                )
                sys.stdout.writelines(diff)
            else:
                print(f"ok      {name}")
        if failed:
            print(
                f"\npass lists changed for: {', '.join(failed)}.\nIf the change is deliberate, run "
                "`tessera passes --update` and commit the golden files.",
                file=sys.stderr,
            )
            return 1
        return 0
    if not args.target:
        print("tessera passes: give --target NAME_OR_PATH, --check, --update or --list", file=sys.stderr)
        return 2
    print(format_pass_list(load_config(args.target)), end="")
    return 0


def _parse_value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _cmd_lower(args: argparse.Namespace) -> int:
    import importlib.util

    import tessera_tvm

    path, _, factory_name = args.program.partition(":")
    if not factory_name:
        print("tessera lower: PROGRAM is FILE.py:FACTORY (a function returning a TileLang PrimFunc)", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or not Path(path).is_file():
        print(f"tessera lower: no such file {path!r}", file=sys.stderr)
        return 2
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    factory = getattr(module, factory_name, None)
    if factory is None:
        print(f"tessera lower: {path} has no {factory_name!r}", file=sys.stderr)
        return 2
    kwargs = dict(item.split("=", 1) for item in args.arg)
    program = factory(**{k: _parse_value(v) for k, v in kwargs.items()})
    lowered = tessera_tvm.lower(program, args.target, out_dir=args.out, dump_dir=args.dump)
    print(
        f"{lowered.name}: {len(lowered.pass_log)} passes for {lowered.config.name} "
        f"in {sum(r.seconds for r in lowered.pass_log):.2f} s"
    )
    for key, file in lowered.artifacts.items():
        print(f"  {key:<9} {file}")
    for note in lowered.notes:
        print(f"  note: {note}")
    return 0


class _Usage(Exception):
    """A command-line mistake: printed, exit status 2."""


def _load_kernel(program: str, command: str):
    """FILE.py[:KERNEL] -> (the @tessera.kernel, the module it came from)."""
    import importlib.util

    import tessera as ts

    path, _, kernel_name = program.partition(":")
    if not Path(path).is_file():
        raise _Usage(f"tessera {command}: no such file {path!r}")
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernels = {name: obj for name, obj in vars(module).items() if isinstance(obj, ts.Kernel)}
    if kernel_name:
        if kernel_name not in kernels:
            raise _Usage(
                f"tessera {command}: {path} has no kernel {kernel_name!r}; kernels: {', '.join(kernels) or 'none'}"
            )
        return kernels[kernel_name], module
    if len(kernels) == 1:
        return next(iter(kernels.values())), module
    raise _Usage(
        f"tessera {command}: {path} defines {len(kernels)} kernels ({', '.join(kernels) or 'none'}); "
        "name one as FILE.py:KERNEL"
    )


def _shapes(args: argparse.Namespace, kernel, module, command: str, text: str | None = None) -> dict[str, int]:
    """The file's SHAPES dict, then --shapes NAME=INT,... (``text``: one of several --shapes)."""
    defaults = getattr(module, "SHAPES", {}) or {}
    shapes = {k: v for k, v in defaults.items() if k in kernel.symbols}
    given = args.shapes if text is None else text
    for item in filter(None, (given or "").split(",")):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise _Usage(f"tessera {command}: --shapes expects NAME=INT[,NAME=INT...], found {item!r}")
        shapes[name.strip()] = int(value)
    return shapes


def _json_arg(text: str | None, option: str, command: str):
    """A JSON value given inline or as a file name."""
    import json

    if not text:
        return None
    try:
        return json.loads(Path(text).read_text()) if Path(text).is_file() else json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Usage(f"tessera {command}: {option} is not JSON (or a JSON file): {exc}") from None


def _cmd_compile(args: argparse.Namespace) -> int:
    """tessera compile FILE.py[:KERNEL] --target T[,T...] [--shapes M=..] [--dump stages] [--out DIR]"""
    import tessera as ts

    kernel, module = _load_kernel(args.program, "compile")
    shapes = _shapes(args, kernel, module, "compile")
    schedule = _json_arg(args.schedule, "--schedule", "compile")
    dump = args.dump.split(",") if args.dump else (["graph", "sched", "tile", "target"] if args.out else None)
    targets = [t for t in args.target.split(",") if t]
    for target in targets:
        out = Path(args.out) / target if args.out and len(targets) > 1 else (Path(args.out) if args.out else None)
        compiled = ts.compile(
            kernel,
            target=target,
            shapes=shapes,
            schedule=schedule,
            dump=dump,
            dump_dir=out,
            build=not args.no_build,
            autotune=args.autotune,
        )
        bound = ", ".join(f"{k}={v}" for k, v in compiled.shapes.items())
        print(f"{kernel.name} for {compiled.target} ({bound}): {len(compiled.graph.groups)} device kernel(s)")
        if not compiled.lowered:
            print("  (dims not all bound: give --shapes to schedule and lower)")
            continue
        for sched in compiled.schedules:
            print("  " + sched.text().replace("\n", "\n  ").rstrip())
        for name, files in compiled.artifacts.items():
            for key, file in files.items():
                print(f"  {name}: {key:<9} {file}")
        for note in compiled.notes:
            print(f"  note: {note}")
        if out is not None and dump:
            print(f"  stages written to {out}/ ({', '.join(dump)}; passes/<kernel>/ per-pass IR)")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    """tessera tune FILE.py[:KERNEL] --target T [--shapes M=..] [--space JSON] [--workers N] ..."""
    import json

    import tessera as ts

    kernel, module = _load_kernel(args.program, "tune")
    shapes = _shapes(args, kernel, module, "tune")
    result = ts.autotune(
        kernel,
        target=args.target,
        shapes=shapes,
        space=_json_arg(args.space, "--space", "tune"),
        schedule=_json_arg(args.schedule, "--schedule", "tune"),
        max_candidates=args.max_candidates,
        workers=args.workers,
        repeats=args.repeats,
        progress=not args.quiet,
        cache=not args.no_cache,
        measure=not args.dry_run,
        compile_timeout=args.compile_timeout,
    )
    print(result.table())
    if args.dry_run:
        for tuning in result.kernels:
            print("  " + tuning.summary_line())
    else:
        if args.quiet or result.cached:  # else autotune has printed it on stderr
            print(result.summary(), end="")
        for schedule in result.best.values():
            print("\n" + schedule.text(), end="")
        print(f"\nschedule overrides (tessera compile --schedule '...'): {json.dumps(result.schedule)}")
    if args.json:
        Path(args.json).write_text(result.to_json() + "\n")
        print(f"wrote {args.json}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    """tessera export FILE.py[:KERNEL] --target T [--shapes M=..] --out DIR"""
    import tessera as ts

    kernel, module = _load_kernel(args.program, "export")
    sets = [_shapes(args, kernel, module, "export", text) for text in (args.shapes or [None])]
    for shapes in sets:
        missing = [s for s in kernel.symbols if s not in shapes]
        if missing:
            raise _Usage(f"tessera export: bind every dim of {kernel.name}; {', '.join(missing)} not given (--shapes)")
    schedule = _json_arg(args.schedule, "--schedule", "export")
    compiled = ts.compile(kernel, target=args.target, shapes=sets[0], schedule=schedule)
    files = compiled.export(args.out, shapes=sets if len(sets) > 1 else None)
    bound = " | ".join(", ".join(f"{k}={v}" for k, v in shapes.items()) for shapes in sets)
    print(f"{kernel.name} for {compiled.target} ({bound}) exported:")
    for key, file in files.items():
        print(f"  {key:<9} {file}")
    return 0


def _cmd_pack_repro(args: argparse.Namespace) -> int:
    """tessera pack-repro CAPTURE_DIR | FILE.py[:KERNEL] --target T [--shapes ..] -o OUT.tar.gz"""
    import tessera as ts

    source = Path(args.source).expanduser()
    if source.is_dir():
        if args.target or args.shapes or args.schedule:
            raise _Usage("tessera pack-repro: --target, --shapes and --schedule are for a kernel file, not a capture")
        out = Path(args.out or f"{source.name}.tar.gz")
        ts.pack_repro(source, out)
        print(f"wrote {out} (crash capture {source}); replay: tessera replay {out}")
        return 0
    kernel, module = _load_kernel(args.source, "pack-repro")
    shapes = _shapes(args, kernel, module, "pack-repro")
    missing = [s for s in kernel.symbols if s not in shapes]
    if missing:
        raise _Usage(f"tessera pack-repro: bind every dim of {kernel.name}; {', '.join(missing)} not given (--shapes)")
    compiled = ts.compile(
        kernel,
        target=args.target or "cpu",
        shapes=shapes,
        schedule=_json_arg(args.schedule, "--schedule", "pack-repro"),
    )
    out = Path(args.out or f"{kernel.name}.repro.tar.gz")
    ts.pack_repro(compiled, out, seed=args.seed)
    bound = ", ".join(f"{k}={v}" for k, v in shapes.items())
    print(f"wrote {out} ({kernel.name} for {compiled.target}, {bound}: graph, config, inputs, outputs)")
    print(f"replay: tessera replay {out}   (or: tar xzf {out} && python <dir>/replay.py)")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    """tessera replay PACK [--run] [--json]"""
    from .repro_replay import main as replay_main

    return replay_main([args.pack, *(["--run"] if args.run_binaries else []), *(["--json"] if args.json else [])])


def _cmd_runtime(args: argparse.Namespace) -> int:
    """tessera runtime --out DIR: build libtessera_rt.so, the tsr* C runtime."""
    from tessera_tvm.target.cpu.build import RUNTIME_INCLUDE_DIR
    from tessera_tvm.target.tsr import build_runtime

    library = build_runtime(args.out, sanitize=args.sanitize)
    print(f"built {library}")
    print(f"  header: {RUNTIME_INCLUDE_DIR / 'tessera' / 'tsr.h'} (compile with -I{RUNTIME_INCLUDE_DIR})")
    return 0


def _cmd_metrics(args: argparse.Namespace) -> int:
    """tessera metrics FILE [--prometheus OUT]: summarise a metrics file (tessera_tvm/metrics.py)."""
    from tessera_tvm.metrics import prometheus_text, read_rows, summarize, summary_table

    path = Path(args.file)
    if not path.is_file():
        raise _Usage(f"tessera metrics: {path} is not a file (write one with TESSERA_METRICS={path})")
    try:
        rows = read_rows(path)
    except ValueError as exc:
        raise _Usage(f"tessera metrics: {exc}") from None
    if not rows:
        raise _Usage(f"tessera metrics: {path} holds no calls")
    summary = summarize(rows)
    print(summary_table(summary), end="")
    if args.prometheus:
        Path(args.prometheus).write_text(prometheus_text(summary))
        print(f"wrote {args.prometheus} (Prometheus text format)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera", description="Tessera tile-kernel compiler")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("passes", help="print, check or update the pass lists of target configs")
    p.add_argument("--target", help="a config name in configs/ or a path to a YAML file")
    p.add_argument("--check", action="store_true", help="compare with the golden files; non-zero on a diff")
    p.add_argument("--update", action="store_true", help="rewrite the golden files")
    p.add_argument("--list", action="store_true", help="list every registered pass and IR condition")
    p.add_argument("--golden-dir", help="where the golden files are (default: tests/golden/passes)")
    p.set_defaults(run=_cmd_passes)

    p = sub.add_parser("lower", help="lower a TileLang tile program for a target")
    p.add_argument("program", help="FILE.py:FACTORY, FACTORY(**args) returns a TileLang PrimFunc")
    p.add_argument("--target", required=True, help="a config name or a path to a YAML file")
    p.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE", help="factory argument")
    p.add_argument("--out", help="directory for source, binaries, metadata.json and passes.txt")
    p.add_argument("--dump", help="directory for the IR after every pass and a timing table")
    p.set_defaults(run=_cmd_lower)

    p = sub.add_parser("compile", help="compile a @tessera.kernel for a target and write its stages")
    p.add_argument("program", help="FILE.py[:KERNEL] (KERNEL may be omitted when the file defines one)")
    p.add_argument("--target", required=True, help="config name(s) or YAML path(s), comma-separated")
    p.add_argument("--shapes", help="NAME=INT,... (default: the file's SHAPES dict)")
    p.add_argument("--dump", help="stages to write: graph,sched,tile,target (default with --out: all)")
    p.add_argument("--out", help="directory for the stages, per-pass IR and build outputs")
    p.add_argument("--schedule", help="schedule overrides as JSON (or a JSON file)")
    p.add_argument("--no-build", action="store_true", help="write sources only (skip nvcc/g++)")
    p.add_argument(
        "--autotune",
        action="store_true",
        help="use tuned schedules (tunes first unless the tuning cache has them; see `tessera tune`)",
    )
    p.set_defaults(run=_cmd_compile)

    p = sub.add_parser("export", help="write a kernel's AOT bundle: tvm-ffi library, C header, metadata.json")
    p.add_argument("program", help="FILE.py[:KERNEL] (KERNEL may be omitted when the file defines one)")
    p.add_argument("--target", default="cpu", help="a config name or a path to a YAML file (default: cpu)")
    p.add_argument(
        "--shapes",
        action="append",
        help="NAME=INT,... (default: the file's SHAPES dict); every dim must be bound. Repeat it for one library "
        "that takes each set of dims, bound from the arguments' shapes at each call",
    )
    p.add_argument("--schedule", help="schedule overrides as JSON (or a JSON file)")
    p.add_argument("--out", required=True, help="directory for <kernel>.so, <kernel>.h and metadata.json")
    p.set_defaults(run=_cmd_export)

    p = sub.add_parser("runtime", help="build libtessera_rt.so, the tsr* C runtime that loads exported images")
    p.add_argument("--out", required=True, help="directory for libtessera_rt.so")
    p.add_argument("--sanitize", action="store_true", help="build with AddressSanitizer and UBSan")
    p.set_defaults(run=_cmd_runtime)

    p = sub.add_parser("tune", help="autotune the schedules of a @tessera.kernel on a target")
    p.add_argument("program", help="FILE.py[:KERNEL] (KERNEL may be omitted when the file defines one)")
    p.add_argument("--target", default="cpu", help="a config name or a path to a YAML file (default: cpu)")
    p.add_argument("--shapes", help="NAME=INT,... (default: the file's SHAPES dict); every dim must be bound")
    p.add_argument("--space", help="the search space as JSON, e.g. '{\"block_m\": [32, 64]}' (default: the config's)")
    p.add_argument("--schedule", help="fixed schedule fields as JSON (not searched)")
    p.add_argument("--max-candidates", type=int, help="at most N candidates compiled per fused kernel")
    p.add_argument("--workers", type=int, help="compile processes (default: the CPU count; 0: in this process)")
    p.add_argument("--repeats", type=int, default=5, help="timed samples per candidate (default 5)")
    p.add_argument(
        "--compile-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="seconds one candidate may compile in a worker before it is killed and counted as failed (default 300)",
    )
    p.add_argument("--no-cache", action="store_true", help="tune again, without reading or writing the tuning cache")
    p.add_argument("--dry-run", action="store_true", help="prune only: list the candidates, compile nothing")
    p.add_argument("--json", help="write the result (every candidate, the best schedules) to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=_cmd_tune)

    p = sub.add_parser("metrics", help="summarise a TESSERA_METRICS file: p50/p95/max per kernel")
    p.add_argument("file", help="the .jsonl or .csv file the calls were recorded to")
    p.add_argument("--prometheus", metavar="OUT", help="also write the summary in Prometheus text format")
    p.set_defaults(run=_cmd_metrics)

    p = sub.add_parser("pack-repro", help="bundle a crash capture, or a kernel with sample inputs, into a .tar.gz")
    p.add_argument("source", help="a crash capture directory, or FILE.py[:KERNEL]")
    p.add_argument("-o", "--out", help="the pack to write (default: <capture>.tar.gz or <kernel>.repro.tar.gz)")
    p.add_argument("--target", help="for a kernel: a config name or a path to a YAML file (default: cpu)")
    p.add_argument("--shapes", help="for a kernel: NAME=INT,... (default: the file's SHAPES dict)")
    p.add_argument("--schedule", help="for a kernel: schedule overrides as JSON (or a JSON file)")
    p.add_argument("--seed", type=int, default=0, help="for a kernel: the seed of its random sample inputs")
    p.set_defaults(run=_cmd_pack_repro)

    p = sub.add_parser(
        "replay", help="replay a repro pack or crash capture: reproduce its failure or check its outputs"
    )
    p.add_argument("pack", help="a .tar.gz made by tessera pack-repro, or a capture directory")
    p.add_argument(
        "--run",
        dest="run_binaries",
        action="store_true",
        help="also run the pack's prebuilt library (code from the pack)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=_cmd_replay)

    args = parser.parse_args(argv)
    from tessera_tvm.errors import TesseraError

    try:
        return args.run(args)
    except _Usage as exc:
        print(exc, file=sys.stderr)
        return 2
    except TesseraError as exc:
        print(f"tessera: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
