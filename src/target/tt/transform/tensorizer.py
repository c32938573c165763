"""The statement-by-statement recogniser behind tt.Tensorize.

``_Tensorizer`` walks the body of a kernel's persistent loop once and records, per statement, the
reader pushes, compute ops and writer pops it maps to (a ``_Record``), tracking where each tile
lives (an input CB, an intermediate CB after a spill, or DST) and which FPU mode each DST phase
uses. Element-wise loop nests are mapped by ``_ElementwiseNests`` (tensorize_eltwise.py);
``finish`` (``_AfterTheWalk``, tensorize_finish.py) then decides each push's wait and pop and plans
the compute inits. A statement it cannot map raises ``_Unsupported`` and is recorded as such
(tensorize_records.py holds the records); ``tensorize`` turns the records into annotations.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.target.tt import TILE_HEIGHT, TILE_WIDTH

from . import common
from .tensorize_eltwise import _ElementwiseNests
from .tensorize_finish import _AfterTheWalk
from .tensorize_records import VIRTUAL, _Event, _mode_key, _Operand, _Record, _Unsupported
from .tile_exprs import _is_zero, _strip_casts


class _Tensorizer(_ElementwiseNests, _AfterTheWalk):
    def __init__(self, name: str, func):
        self.name = name
        self.arch = common.require_attr(func, common.ARCH, name, "tt.ApplyTTDefaults")
        self.shards = common.require_attr(func, common.SHARD, name, "tt.InferShard")
        self.cbs = common.require_attr(func, common.CIRCULAR_BUFFERS, name, "tt.LowerMemorySpace")
        self.analyzer = tvm.arith.Analyzer()
        self.tile = (TILE_HEIGHT, TILE_WIDTH)
        self.records: list[_Record] = []
        self.events: list[_Event] = []
        self.location: dict[str, _Operand] = {}
        self.phase: str | None = None  # None, "math" or "packed"
        self.dst_holds: str | None = None
        self.acquire: dict | None = None
        self.loops: list = []  # serial loops (e.g. the K loop) around the current statement
        self.lets: dict = {}  # Bind var -> value inside the current element-wise loop
        self.ij: tuple = ()  # (row, column) loop variables of the current element-wise loop
        self.leaf_cache: list = []  # DRAM loads of the current statement already given a read
        self.pending: dict[str, int] = {}  # tile buffer -> loads of it still ahead in the current store
        self.columns: set[str] = set()  # (32, 1) tile buffers: row-reduction accumulators (column 0 of a tile)
        self.constants: dict[float, int] = {}  # constant-tile CBs the reader fills once (reduce scalers)
        self.dst_bcast = "none"  # the DST value is a broadcast row/column transformed on the SFPU
        self.column_loop = False  # the current element-wise loop is over a (32, 1) column
        self.fill_pending: tuple | None = None  # (buffer, value, ops list, acquire op) of a fill nothing used yet
        self.carry_events: list[_Event] = []  # carried values after their loop (popped unused at the end)
        self.group: dict[str, int] = {}  # accumulators of a GEMM sub-block: buffer -> DST tile
        # Spills get virtual ids from VIRTUAL up; finish() maps them onto physical CBs whose tiles are not
        # live at the same time. Carried values and constant tiles keep their own CBs.
        self.next_virtual = VIRTUAL
        self.next_intermediate = common.cb_ranges(self.arch["num_cbs"])["intermediate"]
        self.stopped = False
        # The unpacker reads one format and the packer writes one (compute_kernel_hw_startup configures
        # both): the inputs share a format, the outputs share one, which may differ (a cast). The
        # tiles the kernel keeps in CBs of its own take the inputs' format.
        inputs = {cb["data_format"] for cb in self.cbs if cb["role"] != "output"}
        outputs = {cb["data_format"] for cb in self.cbs if cb["role"] == "output"}
        if len(inputs) > 1 or len(outputs) > 1:
            raise common.UnsupportedTTOperationError(
                f"kernel {name!r} mixes data formats {sorted(inputs | outputs)} across its "
                f"{'inputs' if len(inputs) > 1 else 'outputs'}; the Tenstorrent target needs one format for the "
                "inputs and one for the outputs of a kernel (bfloat16, float16 or float32)"
            )
        source = [cb for cb in self.cbs if cb["role"] != "output"] or self.cbs
        first = source[0] if source else {"data_format": "Float16_b", "page_size": 2048}
        self.format, self.page_size = first["data_format"], first["page_size"]
        self.out_format = next(iter(outputs), self.format)

    # ---- CB lookup --------------------------------------------------------------------------
    def _cb(self, role: str, dram: str, tile: str = "") -> int:
        for cb in self.cbs:
            if cb["role"] == role and cb["dram"] == dram and cb.get("tile", "") == tile:
                return cb["id"]
        raise _Unsupported("copy", f"no {role} circular buffer for {tile or dram!r} (run tt.LowerMemorySpace)")

    # ---- DST phases -------------------------------------------------------------------------
    def _release(self, ops: list) -> None:
        if self.phase == "math":
            raise _Unsupported(
                "compute", f"tile {self.dst_holds!r} is computed in DST but never copied to a DRAM buffer or used"
            )
        if self.phase == "packed":
            ops.append({"op": "release"})
        self.phase, self.dst_holds = None, None

    def _settle_fill(self) -> None:
        """A filled tile nothing used in DST: drop its acquire; it is read from a constant CB instead."""
        if self.fill_pending is None:
            return
        name, value, ops, op = self.fill_pending
        self.fill_pending = None
        if self.phase == "math" and self.acquire is op and op["fpu"] is None and self.dst_holds == name:
            ops.remove(op)
            self.location[name] = _Operand("const", const_cb=self._constant(value))
            self.phase, self.dst_holds = None, None

    def _acquire(self, ops: list, holds: str) -> dict:
        self._settle_fill()
        self._close_group(ops)
        if self.phase == "math":
            self._spill(ops)
        self._release(ops)
        op = {"op": "acquire", "init": None, "fpu": None}
        ops.append(op)
        self.phase, self.dst_holds, self.acquire = "math", holds, op
        self.dst_bcast = "none"
        return op

    def _set_mode(self, mode: dict) -> None:
        if self.acquire["fpu"] is None:
            self.acquire["fpu"] = mode
        elif _mode_key(self.acquire["fpu"]) != _mode_key(mode):  # CBs of one format need no re-init
            raise _Unsupported(
                "compute", f"two FPU modes in one DST phase ({self.acquire['fpu']['kind']} and {mode['kind']})"
            )

    def _pack(self, ops: list, cb: int) -> None:
        if self.phase is None:
            raise _Unsupported("copy", "packs a tile that is not in DST")
        ops.append({"op": "pack", "dst": 0, "cb": cb, "commit": self.phase == "math"})
        self.phase = "packed"

    def _spill(self, ops: list) -> _Operand:
        """The DST value packed to a new intermediate CB (a virtual id until finish()), as a CB operand."""
        self.fill_pending = None
        cb_id = self._new_spill(self.dst_holds or "value")
        self._pack(ops, cb_id)
        operand = self._pushed(cb_id, self.dst_bcast)
        self.dst_bcast = "none"
        if self.dst_holds is not None and self.location.get(self.dst_holds, _Operand("none")).kind == "dst":
            self.location[self.dst_holds] = operand
        return operand

    def _new_spill(self, holder: str) -> int:
        """A new intermediate CB (a virtual id until finish()) for a spilled tile."""
        cb_id = self.next_virtual
        self.next_virtual += 1
        self.cbs.append(
            {
                "id": cb_id,
                "name": f"{holder}_tmp",  # + the physical id finish() gives it
                "role": "intermediate",
                "dram": "",
                "tile": "",
                "num_pages": 1,
                "page_size": self.page_size,
                "data_format": self.format,
            }
        )
        return cb_id

    def _use(self, operand: _Operand, op: dict) -> None:
        if operand.event is None:  # a constant tile: waited for once before the tile loop
            return
        pushed = operand.event.loops
        if len(pushed) != len(self.loops) or not all(a.same_as(b) for a, b in zip(pushed, self.loops, strict=True)):
            raise _Unsupported("compute", "a tile is pushed outside the loop that uses it; load it in the same loop")
        operand.event.uses.append(op)

    # ---- reads ------------------------------------------------------------------------------
    def _page(self, buffer_name: str, row0, col0):
        shard = self.shards[buffer_name]
        parts = []
        for what, start, size in (("row", row0, self.tile[0]), ("column", col0, self.tile[1])):
            if not self.analyzer.can_prove_equal(tvm.tirx.floormod(start, size), 0):
                raise _Unsupported(
                    "copy",
                    f"{buffer_name}: {what} offset {start} is not a multiple of {size}; "
                    "Tenstorrent moves whole 32x32 tiles",
                )
            parts.append(self.analyzer.simplify(tvm.tirx.floordiv(start, size)))
        return self.analyzer.simplify(parts[0] * shard["tiles"][1] + parts[1])

    def _read(self, record: _Record, buffer_name: str, tile: str, page) -> _Operand:
        cb = self._cb("input", buffer_name, tile)
        record.reads.append({"cb": cb, "buffer": buffer_name, "page": page})
        return self._pushed(cb)

    def _pushed(self, cb: int, bcast: str = "none") -> _Operand:
        """A tile pushed into ``cb`` here (inside the current loops), as a CB operand: its uses decide
        its wait and pop."""
        event = _Event(cb, tuple(self.loops))
        self.events.append(event)
        return _Operand("cb", event, bcast)

    # ---- statements -------------------------------------------------------------------------
    def run(self, body) -> None:
        self._stmt(body)
        if not self.stopped:
            last = next((r for r in reversed(self.records) if r.unsupported is None and r.ops is not None), None)
            try:
                self._release(last.ops if last is not None else [])
            except _Unsupported as exc:
                if last is not None:
                    last.unsupported = (exc.op, exc.reason)

    def _stmt(self, stmt) -> None:
        if self.stopped:
            return
        tirx = tvm.tirx
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self._stmt(s)
        elif isinstance(stmt, tirx.SBlockRealize):
            self._stmt(stmt.block.body)
        elif isinstance(stmt, tirx.SBlock):
            self._stmt(stmt.body)
        elif isinstance(stmt, tirx.Bind) and not stmt.var.dtype.startswith("float"):
            pass  # index arithmetic: the kernels print it where they use it
        elif isinstance(stmt, tirx.AllocBuffer | tirx.DeclBuffer):
            pass
        elif isinstance(stmt, tirx.For) and self._elementwise_nest(stmt) is None:
            carried = self._carried(stmt)
            try:
                self._open_group(stmt)
                cbs = self._carry_in(carried) if carried else {}
            except _Unsupported as exc:
                self._stop(exc)
                return
            self.loops.append(stmt.loop_var)
            for name, cb in cbs.items():  # this iteration's value: the previous one's (or the initial)
                self.location[name] = self._pushed(cb)
            self._stmt(stmt.body)
            try:
                if cbs and not self.stopped:
                    self._carry_out(cbs)
            except _Unsupported as exc:
                self._stop(exc)
            self.loops.pop()
            for name, cb in cbs.items():  # after the loop: the last iteration's value
                operand = self._pushed(cb)
                self.location[name] = operand
                self.carry_events.append((operand.event, len(self.records)))
        else:
            self._leaf(stmt)

    # ---- GEMM sub-blocks: several accumulators in DST at once ----------------------------------
    def _open_group(self, loop) -> None:
        """A K loop whose T.gemm calls accumulate into several cleared tiles: one DST phase holds them
        all, each in its own DST tile (``matmul_tiles(..., idst)``), until they are packed."""
        accs: list[str] = []

        def visit(node):
            op = common.tile_op(node) if isinstance(node, tvm.tirx.Evaluate) else None
            if op is not None and op[0] == "tl.tileop.gemm":
                name = common.region(op[1].args[2])[0].name
                if name not in accs:
                    accs.append(name)

        tvm.tirx.stmt_functor.post_order_visit(loop.body, visit)
        accs = [a for a in accs if a in self.location]  # cleared before the loop, accumulated through it
        if len(accs) < 2:
            return
        limit = max(1, self.arch["dst_tiles"] // 2)  # tile_regs_acquire gives math half of DST
        if len(accs) > limit:
            raise _Unsupported(
                "T.gemm",
                f"{len(accs)} accumulators in DST at once; DST holds {limit} tiles per phase here "
                f"(dst_tiles={self.arch['dst_tiles']}, half for math): use a smaller block",
            )
        self._settle_fill()
        for name in accs:
            operand = self.location.get(name)
            if operand is None or operand.kind != "const" or operand.cb != self.constants.get(0.0):
                raise _Unsupported("T.gemm", f"accumulator {name!r} must be cleared (T.clear) before its K loop")
        ops = self._carry_record("just before").ops
        op = self._acquire(ops, accs[0])  # tile_regs_acquire: DST starts at zero
        self.group = {name: k for k, name in enumerate(accs)}
        for name, k in self.group.items():
            self.location[name] = _Operand("dst", slot=k)
        op["zeroed"] = accs[0]

    def _close_group(self, ops: list) -> None:
        """The sub-block's accumulators still in DST packed to CBs of their own (before DST is reused)."""
        if not self.group:
            return
        group, self.group = self.group, {}
        for name, k in group.items():
            operand = self.location.get(name)
            if operand is None or operand.kind != "dst" or operand.slot != k:
                continue
            cb = self._new_spill(name)
            ops.append({"op": "pack", "dst": k, "cb": cb, "commit": self.phase == "math"})
            self.phase = "packed"
            self.location[name] = self._pushed(cb)
        self._release(ops)

    # ---- values carried from one loop iteration to the next --------------------------------------
    def _stop(self, exc: _Unsupported) -> None:
        if self.records:
            self.records[-1].unsupported = (exc.op, exc.reason)
        self.stopped = True

    def _carried(self, loop) -> list[str]:
        """Tile buffers with a value before ``loop`` that its body reads and then stores (or copies
        into): their value travels between iterations through a CB of its own."""
        read, written = set(), set()

        def visit(node):
            if isinstance(node, tvm.tirx.BufferStore):
                written.add(node.buffer.name)
            elif isinstance(node, tvm.tirx.BufferLoad):
                read.add(node.buffer.name)
            op = common.tile_op(node) if isinstance(node, tvm.tirx.Evaluate) else None
            if op is not None:
                regions = [common.region(a) for a in op[1].args]
                names = [r[0].name for r in regions if r is not None]
                read.update(names[:-1] if op[0] == "tl.tileop.copy" else names)
                if op[0] == "tl.tileop.copy" and names:
                    written.add(names[-1])

        tvm.tirx.stmt_functor.post_order_visit(loop.body, visit)
        return [n for n in self.location if n in read and n in written]

    def _carry_record(self, what: str) -> _Record:
        record = self.records[-1] if self.records else None
        if record is None or record.loops != tuple(self.loops) or record.unsupported is not None:
            raise _Unsupported(
                "loop",
                f"a value carried through a loop needs a statement {what} the loop at its level "
                "(not inside an inner loop) to move it into its circular buffer",
            )
        return record

    def _carry_in(self, carried: list[str]) -> dict[str, int]:
        """Before the loop: each carried value packed into its own CB (a filled tile from its constant)."""
        ops = self._carry_record("just before").ops
        self._settle_fill()
        order = sorted(carried, key=lambda n: self.dst_holds != n)  # the DST value first
        cbs = {name: self._new_cb(f"{name}_carry", "intermediate") for name in order}
        self._pack_carried(ops, cbs, "before the loop that carries it")
        return cbs

    def _pack_carried(self, ops: list, cbs: dict[str, int], when: str) -> None:
        """Each carried value packed into its CB (the one in DST first; the others through DST)."""
        self._settle_fill()
        for name in sorted(cbs, key=lambda n: self.dst_holds != n):
            operand = self.location[name]
            if operand.kind == "dst":
                if self.dst_holds != name or self.phase != "math":
                    raise _Unsupported("loop", f"tile {name!r} left DST {when}")
            else:
                self._to_dst(ops, operand, name)
            self._pack(ops, cbs[name])
        self._release(ops)

    def _carry_out(self, cbs: dict[str, int]) -> None:
        """At the end of the body: each carried value's new tile packed into its CB for the next iteration."""
        ops = self._carry_record("at the end of").ops
        for name, cb in cbs.items():
            operand = self.location[name]
            if operand.kind == "cb" and operand.event.cb == cb:
                raise _Unsupported("loop", f"tile {name!r} is read in the loop but never given a new value")
        self._pack_carried(ops, cbs, "before the end of the loop body")
        for name, cb in cbs.items():
            event = next(e for e in reversed(self.events) if e.cb == cb)
            if not event.uses:
                raise _Unsupported("loop", f"tile {name!r} is carried through the loop but not read in it")

    def _new_cb(self, name: str, role: str, **extra) -> int:
        """A CB of its own (carried values, constants, generated tiles): the next intermediate id, then
        the highest id inputs and outputs leave free."""
        if self.next_intermediate < self.arch["num_cbs"]:
            cb_id = self.next_intermediate
            self.next_intermediate += 1
        else:
            taken = {cb["id"] for cb in self.cbs}
            cb_id = max((i for i in range(self.arch["num_cbs"]) if i not in taken), default=None)
            if cb_id is None:
                raise _Unsupported("tile", f"more tiles than the {self.arch['num_cbs']} circular buffers of a core")
        self.cbs.append(
            {
                "id": cb_id,
                "name": name,
                "role": role,
                "dram": "",
                "tile": "",
                "num_pages": 1,
                "page_size": self.page_size,
                "data_format": self.format,
                **extra,
            }
        )
        return cb_id

    def _leaf(self, stmt) -> None:
        op = common.tile_op(stmt)
        label = op[0].removeprefix("tl.tileop.") if op else type(stmt).__name__
        record = _Record(label, tuple(self.loops))
        self.records.append(record)
        try:
            if op is not None:
                self._tile_op(record, *op)
            elif isinstance(stmt, tvm.tirx.For):
                record.tile_op = "elementwise"
                self._elementwise(record, stmt)
            elif isinstance(stmt, tvm.tirx.IfThenElse):
                raise _Unsupported(
                    "if",
                    f"a condition ({stmt.condition}) around tile computation; only masks of "
                    "buffer edges are supported (tt.TilePad removes those)",
                )
            else:
                raise _Unsupported(type(stmt).__name__, f"{type(stmt).__name__} statement in a tile body")
        except _Unsupported as exc:
            record.unsupported = (exc.op, exc.reason)
            self.stopped = True

    def _tile_op(self, record: _Record, name: str, call) -> None:
        short = name.removeprefix("tl.tileop.")
        if name == "tl.tileop.copy":
            self._copy(record, call)
        elif name == "tl.tileop.fill":
            self._fill(record, call)
        elif name == "tl.tileop.gemm":
            self._gemm(record, call)
        elif name == "tl.tileop.reduce":
            self._reduce(record, call)
        else:
            raise _Unsupported(f"T.{short}", f"T.{short} has no Tenstorrent lowering yet")

    def _tile_region(self, reg, what: str, op: str = "T.copy", column: bool = False):
        """(buffer, starts) of a whole-tile region (``column``: or a (32, 1) column of one)."""
        buffer, starts, extents = reg
        sizes = [common.const_int(e) for e in extents]
        if column and len(extents) == 2 and sizes == [self.tile[0], 1]:
            return buffer, starts
        if sizes[-2:] != list(self.tile) or len(extents) != 2:
            raise _Unsupported(
                op,
                f"{what} {buffer.name} is a {'x'.join(str(e) for e in extents)} region; "
                "the Tenstorrent target moves 32x32 tiles (use 32x32 blocks)",
            )
        return buffer, starts

    def _copy(self, record: _Record, call) -> None:
        src, dst = common.region(call.args[0]), common.region(call.args[1])
        if src is None or dst is None:
            raise _Unsupported("T.copy", "copy operands are not buffer regions")
        column = src[0].name in self.columns  # a row reduction's (32, 1) result
        src_buf, src_start = self._tile_region(src, "source", column=column)
        dst_buf, dst_start = self._tile_region(dst, "destination", column=column)
        if common.is_dram(src_buf) and not common.is_dram(dst_buf):
            record.tile_op = "copy_in"
            page = self._page(src_buf.name, *src_start)
            self.location[dst_buf.name] = self._read(record, src_buf.name, dst_buf.name, page)
        elif common.is_dram(dst_buf) and not common.is_dram(src_buf):
            record.tile_op = "copy_out"
            self._to_dram(record, src_buf.name, dst_buf.name, self._page(dst_buf.name, *dst_start))
        elif not common.is_dram(src_buf) and not common.is_dram(dst_buf):
            record.tile_op = "alias"
            if src_buf.name not in self.location:
                raise _Unsupported("T.copy", f"copies tile {src_buf.name!r} before it has a value")
            self.location[dst_buf.name] = self.location[src_buf.name]
            if self.dst_holds == src_buf.name:
                self.dst_holds = dst_buf.name
        else:
            raise _Unsupported("T.copy", "a DRAM-to-DRAM copy; copy through a tile buffer")

    def _to_dram(self, record: _Record, value: str | _Operand, dram: str, page, tile: str | None = None) -> None:
        """Pack a tile value (a tile buffer's, or an operand) to the output CB of ``dram`` and write it."""
        tile_name = value if isinstance(value, str) else ""
        operand = self.location.get(value) if isinstance(value, str) else value
        if operand is None:
            raise _Unsupported("T.copy", f"copies tile {value!r} to {dram!r} before it has a value")
        cb = self._cb("output", dram, tile if tile is not None else tile_name)
        if operand.kind == "dst" and tile_name in self.group and self.phase in ("math", "packed"):
            record.ops.append({"op": "pack", "dst": operand.slot, "cb": cb, "commit": self.phase == "math"})
            self.phase = "packed"
            record.writes.append({"cb": cb, "buffer": dram, "page": page})
            self.location[tile_name] = _Operand("packed")  # written out; its DST tile is free
            return
        if operand.kind in ("cb", "const"):
            self._to_dst(record.ops, operand, tile_name or dram)
        elif self.phase is None or (tile_name and self.dst_holds != tile_name):
            raise _Unsupported("T.copy", f"tile {tile_name!r} is no longer in DST")
        self._pack(record.ops, cb)
        record.writes.append({"cb": cb, "buffer": dram, "page": page})

    def _to_dst(self, ops: list, operand: _Operand, holds: str, keep_bcast: bool = False) -> None:
        """Copy a CB tile into DST (``keep_bcast``: a broadcast row/column an SFPU op then transforms
        as a whole tile; the result stays a broadcast operand, ``self.dst_bcast``)."""
        if operand.bcast != "none" and not keep_bcast:
            raise _Unsupported("compute", f"a broadcast {operand.bcast[:-1]} used on its own; combine it with a tile")
        self._acquire(ops, holds)
        mode = {"kind": "copy", "cb": operand.cb}
        self._set_mode(mode)
        op = {"op": "copy", "cb": operand.cb, "dst": 0, "wait": [], "pop": []}
        self._use(operand, op)
        ops.append(op)

    def _fill(self, record: _Record, call) -> None:
        reg = common.region(call.args[0])
        column = reg is not None and [common.const_int(e) for e in reg[2]] == [self.tile[0], 1]
        # 0 clears an accumulator; -inf starts a max, whose first reduce_tile in a DST phase writes it.
        value = _strip_casts(call.args[1])
        minus_inf = isinstance(value, tvm.tirx.FloatImm) and value.value == float("-inf")
        if reg is None or not (_is_zero(call.args[1]) or minus_inf):
            raise _Unsupported("T.fill", "T.fill with a value other than 0 or -inf (accumulator starts)")
        buffer, _ = self._tile_region(reg, "filled tile", "T.fill", column=column)
        if column:
            self.columns.add(buffer.name)
        op = self._acquire(record.ops, buffer.name)
        self.location[buffer.name] = _Operand("dst")
        self.acquire["zeroed"] = buffer.name
        self.fill_pending = (buffer.name, float("-inf") if minus_inf else 0.0, record.ops, op)

    def _gemm(self, record: _Record, call) -> None:
        a, b, c = (common.region(arg) for arg in call.args[:3])
        trans_a, trans_b = bool(common.const_int(call.args[3])), bool(common.const_int(call.args[4]))
        sizes = [common.const_int(arg) for arg in call.args[5:8]]
        record.tile_op = "matmul"
        if None in (a, b, c) or sizes != [self.tile[0], self.tile[1], self.tile[1]]:
            raise _Unsupported("T.gemm", f"a {sizes} gemm; the Tenstorrent target multiplies 32x32x32 tiles")
        if trans_a:
            raise _Unsupported("T.gemm", "transpose_A is not supported on the Tenstorrent target yet")
        if len(call.args) > 9 and bool(common.const_int(call.args[9])):
            raise _Unsupported("T.gemm", "clear_accum=True; clear the accumulator with T.clear before the K loop")
        acc = c[0].name
        in_group = acc in self.group and self.phase == "math"
        if not in_group and (
            self.dst_holds != acc or self.phase != "math" or self.location.get(acc, _Operand("none")).kind != "dst"
        ):
            raise _Unsupported(
                "T.gemm",
                f"accumulator {acc!r} must be cleared with T.clear (T.fill 0) before its K loop and stay in DST",
            )
        operands = []
        for reg in (a, b):
            operand = self.location.get(reg[0].name)
            if operand is None or operand.kind != "cb" or operand.bcast != "none":
                raise _Unsupported("T.gemm", f"operand {reg[0].name!r} must be a tile in a circular buffer")
            operands.append(operand)
        self.fill_pending = None
        mode = {"kind": "matmul", "in0": operands[0].cb, "in1": operands[1].cb, "transpose": int(trans_b)}
        self._set_mode(mode)
        op = {
            "op": "matmul",
            "in0": operands[0].cb,
            "in1": operands[1].cb,
            "dst": self.group.get(acc, 0),
            "transpose": int(trans_b),
            "wait": [],
            "pop": [],
        }
        for operand in operands:
            self._use(operand, op)
        record.ops.append(op)

    def _constant(self, value: float) -> int:
        """The id of a CB holding one tile of ``value`` everywhere (the reader fills it once)."""
        if value not in self.constants:
            name = "scaler" if value == 1.0 else "zeros" if value == 0.0 else "neg_inf" if value < 0 else "const"
            self.constants[value] = self._new_cb(name, "constant", value=value)
        return self.constants[value]

    def _reduce(self, record: _Record, call) -> None:
        """``T.reduce`` of a 32x32 tile along its rows into a (32, 1) accumulator kept in DST:
        ``reduce_tile<SUM|MAX, REDUCE_ROW>`` with a constant scaler tile of 1.0."""
        src, dst = common.region(call.args[0]), common.region(call.args[1])
        kind = getattr(call.args[2], "value", str(call.args[2]))  # a StringImm
        dim, clear = common.const_int(call.args[3]), bool(common.const_int(call.args[4]))
        record.tile_op = "reduce"
        if kind not in ("sum", "max"):
            raise _Unsupported("T.reduce", f"reduce {kind!r}; the Tenstorrent target reduces with sum or max")
        if src is None or dst is None or dim != 1:
            raise _Unsupported("T.reduce", f"a reduction over dim {dim}; the Tenstorrent target reduces rows (dim=1)")
        src_buf, _ = self._tile_region(src, "reduced tile", "T.reduce")
        acc = dst[0].name
        if acc not in self.columns or [common.const_int(e) for e in dst[2]] != [self.tile[0], 1]:
            raise _Unsupported("T.reduce", f"the result {acc!r} must be a (32, 1) buffer filled before its loop")
        if clear or self.dst_holds != acc or self.phase != "math":
            raise _Unsupported(
                "T.reduce",
                f"accumulator {acc!r} must be filled (T.fill) before its loop, reduced with clear=False, and stay in DST",
            )
        operand = self.location.get(src_buf.name)
        if operand is None or operand.kind != "cb" or operand.bcast != "none":
            raise _Unsupported("T.reduce", f"the reduced tile {src_buf.name!r} must be a tile in a circular buffer")
        self.fill_pending = None
        scaler = self._constant(1.0)
        self._set_mode({"kind": "reduce", "type": kind, "in0": operand.cb, "scaler": scaler})
        op = {"op": "reduce", "type": kind, "in0": operand.cb, "scaler": scaler, "dst": 0, "wait": [], "pop": []}
        self._use(operand, op)
        record.ops.append(op)
