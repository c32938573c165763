"""tt.VerifyTTIR: fail the compile when the annotated Tenstorrent IR breaks any invariant.

Runs last in OptimizeForTarget. Every check reads the annotations the earlier passes wrote:

- every tile operation and compute loop of the tile body was tensorized; a statement marked
  ``tt.unsupported`` (or not annotated at all) is an ``UnsupportedTTOperationError`` naming the
  operation, the reason, and where it is (kernel, enclosing loops, statement);
- circular buffers: ids unique and below the arch's CB count, L1 total within
  ``resources.l1_bytes_per_core`` (``TTResourceError``), every CB an annotation names exists;
- the schedule: every output tile assigned to exactly one core, no more cores than the arch
  grid, core coordinates inside the grid and distinct;
- per tile: every output page written exactly once over the whole schedule, every page read or
  written inside its buffer, DST indices below the DST capacity, the acquire/commit/pack/release
  cycle in order, and pages pushed equal to pages popped on every CB.

Anything else is a ``TTVerificationError``. The pass never changes the IR.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, register_pass
from tessera_tvm.target.tt import format_ranges

from . import common
from .tensorize import UNSUPPORTED

_ANNOTATIONS = (common.READ, common.WRITE, common.COMPUTE, UNSUPPORTED)


# ---------------------------------------------------------------------------------------------
# Evaluating index expressions over every tile at once
# ---------------------------------------------------------------------------------------------


def evaluate(expr, env: dict) -> np.ndarray:
    """Integer ``expr`` over numpy arrays bound to its variables (``env``: Var -> array)."""
    tirx = tvm.tirx
    if isinstance(expr, int):  # a constant page comes back from the attr as a Python int
        return np.int64(expr)
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    if isinstance(expr, tirx.Var):
        for var, value in env.items():
            if var.same_as(expr):
                return value
        raise common.TTVerificationError(f"index expression uses {expr}, which is not defined in the tile loop")
    if isinstance(expr, tirx.Cast):
        return evaluate(expr.value, env)
    binary = {
        tirx.Add: np.add,
        tirx.Sub: np.subtract,
        tirx.Mul: np.multiply,
        tirx.FloorDiv: np.floor_divide,
        tirx.FloorMod: np.mod,
        tirx.Min: np.minimum,
        tirx.Max: np.maximum,
    }
    if type(expr) in binary:
        return binary[type(expr)](evaluate(expr.a, env), evaluate(expr.b, env))
    raise common.TTVerificationError(f"cannot evaluate index expression {expr} ({type(expr).__name__})")


# ---------------------------------------------------------------------------------------------
# The walk
# ---------------------------------------------------------------------------------------------


class _Verifier:
    def __init__(self, name: str, func, config_name: str):
        self.name = name
        self.func = func
        self.config_name = config_name
        need = [
            (common.ARCH, "tt.ApplyTTDefaults"),
            (common.SCHEDULE, "tt.InferSchedule"),
            (common.SHARD, "tt.InferShard"),
            (common.CORE_MAP, "tt.ShardToCoreMap"),
            (common.CIRCULAR_BUFFERS, "tt.LowerMemorySpace"),
        ]
        for key, producer in need:
            common.require_attr(func, key, name, producer)
        self.arch = common.attr(func, common.ARCH)
        self.schedule = common.attr(func, common.SCHEDULE)
        self.shards = common.attr(func, common.SHARD)
        self.core_map = common.attr(func, common.CORE_MAP)
        self.cbs = common.attr(func, common.CIRCULAR_BUFFERS)
        self.cb_ids = {cb["id"] for cb in self.cbs}
        total = self.schedule["total_tiles"]
        self.env: dict = {}
        self.tile_count = total
        self.pushes: Counter = Counter()
        self.pops: Counter = Counter()
        self.written: dict[str, list] = {}
        self.phase: str | None = None

    def fail(self, message: str) -> common.TTVerificationError:
        return common.TTVerificationError(f"kernel {self.name!r} (config {self.config_name!r}): {message}")

    # ---- whole-kernel checks ----------------------------------------------------------------
    def check_circular_buffers(self) -> None:
        ids = [cb["id"] for cb in self.cbs]
        dup = sorted(i for i, n in Counter(ids).items() if n > 1)
        if dup:
            raise self.fail(f"circular-buffer ids {dup} are used twice")
        common.check_circular_buffers(self.name, self.cbs, self.arch, self.config_name)
        for cb in self.cbs:
            if cb["page_size"] <= 0 or cb["num_pages"] <= 0:
                raise self.fail(f"CB {cb['id']} ({cb['name']}) has {cb['num_pages']} pages of {cb['page_size']} B")

    def check_schedule(self) -> None:
        total = self.schedule["total_tiles"]
        workers = self.arch["grid"][0] * self.arch["grid"][1]
        assignments = self.schedule["assignments"]
        if len(assignments) > workers:
            raise self.fail(f"{len(assignments)} cores scheduled but arch {self.arch['name']!r} has {workers} workers")
        owner: dict[int, int] = {}
        for core, start, count in assignments:
            for tile in range(start, start + count):
                if tile >= total or tile < 0:
                    raise self.fail(f"core {core} is assigned tile {tile}, beyond the {total} output tiles")
                if tile in owner:
                    raise self.fail(f"output tile {tile} is assigned to cores {owner[tile]} and {core}")
                owner[tile] = core
        missing = sorted(set(range(total)) - set(owner))
        if missing:
            raise self.fail(f"output tiles {format_ranges(missing)} are assigned to no core")
        cores = [tuple(xy) for xy in self.core_map["cores"]]
        if len(cores) != len(assignments):
            raise self.fail(f"tt.core_map places {len(cores)} cores but the schedule has {len(assignments)}")
        gx, gy = self.arch["grid"]
        for core, (x, y) in enumerate(cores):
            if not (0 <= x < gx and 0 <= y < gy):
                raise self.fail(f"core {core} is mapped to ({x}, {y}), outside the {gx}x{gy} worker grid")
        twice = [xy for xy, n in Counter(cores).items() if n > 1]
        if twice:
            raise self.fail(f"worker core {twice[0]} runs two schedule entries")

    # ---- the tile body ----------------------------------------------------------------------
    def check_body(self) -> None:
        loop = common.persistent_loop(self.func)
        if loop is None:
            raise self.fail("no tt.persistent loop (run tt.GridToPersistent)")
        outside = []

        def visit(node):
            if common.tile_op(node) is not None:
                outside.append(node)

        tvm.tirx.stmt_functor.post_order_visit(self.func.body, visit)
        inside: list = []
        tvm.tirx.stmt_functor.post_order_visit(loop.body, lambda n: inside.append(n) if common.tile_op(n) else None)
        if len(outside) != len(inside):
            raise self.fail("tile operations outside the tt.persistent loop")
        # Axes: enclosing loops (innermost first), then the tile axis last, so arrays broadcast.
        self.env = {loop.loop_var: np.arange(self.tile_count, dtype=np.int64)}
        self.shape = [self.tile_count]
        self._walk(loop.body, ["tile body"])
        if self.phase is not None:
            raise self.fail(f"the tile ends with DST {self.phase} (missing tile_regs_release)")
        for cb in sorted(set(self.pushes) | set(self.pops)):
            if self.pushes[cb] != self.pops[cb]:
                raise self.fail(f"CB {cb}: {self.pushes[cb]} page(s) pushed but {self.pops[cb]} popped per tile")
        for buffer, pages in self.written.items():
            counts = np.bincount(np.concatenate(pages).ravel(), minlength=self._pages(buffer))
            twice, never = np.flatnonzero(counts > 1), np.flatnonzero(counts == 0)
            if len(twice):
                raise self.fail(f"output {buffer!r}: tiles {format_ranges(list(twice))} are written more than once")
            if len(never):
                raise self.fail(f"output {buffer!r}: tiles {format_ranges(list(never))} are never written")

    @property
    def trips(self) -> int:
        """Iterations of the enclosing loops per tile."""
        return int(np.prod(self.shape[:-1], dtype=np.int64))

    def _pages(self, buffer: str) -> int:
        rows, cols = self.shards[buffer]["tiles"]
        return rows * cols

    def _walk(self, stmt, path: list) -> None:
        tirx = tvm.tirx
        if isinstance(stmt, tirx.SeqStmt):
            counted = [s for s in stmt.seq if not isinstance(s, tirx.Bind | tirx.AllocBuffer | tirx.DeclBuffer)]
            for s in stmt.seq:
                k = next((n for n, c in enumerate(counted) if c.same_as(s)), None)
                where = path if k is None or len(counted) == 1 else [*path, f"statement {k + 1} of {len(counted)}"]
                self._walk(s, where)
        elif isinstance(stmt, tirx.SBlockRealize):
            self._walk(stmt.block.body, path)
        elif isinstance(stmt, tirx.Bind) and not stmt.var.dtype.startswith("float"):
            self.env[stmt.var] = evaluate(stmt.value, self.env)
        elif isinstance(stmt, tirx.AllocBuffer | tirx.DeclBuffer):
            pass
        elif isinstance(stmt, tirx.AttrStmt) and stmt.attr_key in _ANNOTATIONS:
            self._annotated(stmt, path)
        elif isinstance(stmt, tirx.For) and not _computes(stmt):
            extent = common.const_int(stmt.extent)
            if extent is None and common.const_int(stmt.min) is not None:
                # an extent that depends on the tile (a causal key loop): checked at its largest, which
                # counts pushes and pops alike and checks the pages of every iteration any tile runs
                try:
                    extent = int(np.max(evaluate(stmt.extent, self.env)))
                except Exception:  # noqa: BLE001 - anything evaluate cannot reduce to numbers
                    extent = None
            if extent is None or common.const_int(stmt.min) is None:
                raise self.fail(f"loop over {stmt.loop_var} at {' › '.join(path)} has a symbolic range")
            lo = common.const_int(stmt.min)
            axis = np.arange(lo, lo + extent, dtype=np.int64)
            self.env[stmt.loop_var] = axis.reshape((extent,) + (1,) * len(self.shape))
            self.shape.insert(0, extent)
            entry = self.phase
            where = [*path, f"for {stmt.loop_var} in range({lo}, {lo + extent})"]
            self._walk(stmt.body, where)
            if self.phase != entry:
                raise self.fail(
                    f"{' › '.join(where)}: DST is {entry or 'released'} when an iteration starts but "
                    f"{self.phase or 'released'} when it ends"
                )
            self.shape.pop(0)
        else:
            what = common.tile_op(stmt)
            op = f"T.{what[0].removeprefix('tl.tileop.')}" if what else type(stmt).__name__
            raise common.UnsupportedTTOperationError(
                f"kernel {self.name!r}: unsupported operation {op} at {' › '.join(path)}: `{common.first_line(stmt)}` "
                "was not tensorized for Tenstorrent"
            )

    def _annotated(self, stmt, path: list) -> None:
        node = common.to_python(stmt.node)
        where = " › ".join(path)
        if stmt.attr_key == UNSUPPORTED:
            inner = stmt.body
            raise common.UnsupportedTTOperationError(
                f"kernel {self.name!r}: unsupported operation {node['op']} at {where}: {node['reason']} "
                f"(`{common.first_line(inner)}`)"
            )
        if stmt.attr_key in (common.READ, common.WRITE):
            self._page_access(stmt.attr_key, node, where)
        else:
            self._compute(node["ops"], where)
        body = stmt.body
        if isinstance(body, tvm.tirx.AttrStmt) and body.attr_key in _ANNOTATIONS:
            self._annotated(body, path)

    def _known_cb(self, cb: int, where: str) -> None:
        if cb not in self.cb_ids:
            raise self.fail(f"{where} uses CB {cb}, which tt.circular_buffers does not declare")

    def _page_access(self, key: str, node: dict, where: str) -> None:
        cb, buffer = node["cb"], node["buffer"]
        self._known_cb(cb, where)
        if "cond" in node:  # a tile the reader generates (a mask)
            self.pushes[cb] += self.trips
            return
        if buffer not in self.shards:
            raise self.fail(f"{where}: {key} of unknown buffer {buffer!r}")
        pages = np.broadcast_to(evaluate(node["page"], self.env), tuple(self.shape)).ravel()
        limit = self._pages(buffer)
        bad = pages[(pages < 0) | (pages >= limit)]
        if bad.size:
            raise self.fail(f"{where}: {key} of {buffer!r} touches page {int(bad.flat[0])} but it has {limit} pages")
        if key == common.READ:
            self.pushes[cb] += self.trips
        else:
            self.pops[cb] += self.trips
            self.written.setdefault(buffer, []).append(pages)

    def _compute(self, ops: list, where: str) -> None:
        dst_tiles = self.arch["dst_tiles"]
        for op in ops:
            kind = op["op"]
            if "dst" in op and not 0 <= op["dst"] < dst_tiles:
                raise self.fail(f"{where}: {kind} uses DST tile {op['dst']} but DST holds {dst_tiles} tiles")
            for key in ("cb", "in0", "in1", "scaler"):
                if key in op:
                    self._known_cb(op[key], where)
            for cb in op.get("pop", []):
                self.pops[cb] += self.trips
            if kind == "acquire":
                if self.phase is not None:
                    raise self.fail(f"{where}: tile_regs_acquire while DST is {self.phase}")
                self.phase = "math"
            elif kind == "discard":
                pass
            elif kind in ("matmul", "binary", "copy", "transpose", "sfpu", "reduce"):
                if self.phase != "math":
                    raise self.fail(f"{where}: {kind} while DST is {self.phase or 'released'}")
            elif kind == "pack":
                if self.phase is None:
                    raise self.fail(f"{where}: pack_tile while DST is released")
                if op["commit"] != (self.phase == "math"):
                    raise self.fail(f"{where}: pack_tile {'without' if op['commit'] else 'with a second'} commit")
                self.phase = "packed"
                self.pushes[op["cb"]] += self.trips
            elif kind == "release":
                if self.phase != "packed":
                    raise self.fail(f"{where}: tile_regs_release while DST is {self.phase or 'released'}")
                self.phase = None
            else:
                raise self.fail(f"{where}: unknown compute op {kind!r}")


def _computes(loop) -> bool:
    """A two-level loop nest with only compute in its body (tensorize's element-wise statement)."""
    inner = loop.body
    if not isinstance(inner, tvm.tirx.For):
        return False
    body = inner.body
    stmts = list(body.seq) if isinstance(body, tvm.tirx.SeqStmt) else [body]
    return not any(common.tile_op(s) or isinstance(s, tvm.tirx.For) for s in stmts)


def verify_kernel(name: str, func, config_name: str) -> None:
    """Raise a TesseraError subclass for the first invariant kernel ``func`` violates."""
    verifier = _Verifier(name, func, config_name)
    verifier.check_body()  # unsupported operations first: they explain everything after them
    verifier.check_circular_buffers()
    verifier.check_schedule()
    if common.attr(func, common.COMPUTE_INIT) is None:
        raise verifier.fail("no tt.compute_init (run tt.Tensorize)")


@register_pass("tt.VerifyTTIR", doc="fail on unsupported ops, CB/L1/DST over the arch limits, or a bad schedule")
def verify_tt_ir(ctx: BuildContext):
    def verify(name, func):
        verify_kernel(name, func, ctx.config.name)
        return func

    return common.module_pass(verify, name="tt.VerifyTTIR")
