"""Element-wise loop nests for tt.Tensorize's recogniser: each tile expression mapped onto FPU and SFPU
ops on tiles in CBs and DST (a mixin of ``_Tensorizer``: it reads and updates the walk's state)."""

from __future__ import annotations

from tessera_tvm._tvm import tvm

from . import common
from .tensorize_records import _Operand, _Record, _Unsupported
from .tile_exprs import _describe, _is_zero, _strip_casts, match_gelu, same_expr


class _ElementwiseNests:
    # ---- element-wise loop nests ------------------------------------------------------------
    def _elementwise_nest(self, loop):
        """``(row var, col var, body)`` of a two-level loop nest whose body only computes, else None."""
        inner = loop.body
        if not isinstance(inner, tvm.tirx.For):
            return None
        body = inner.body
        stmts = list(body.seq) if isinstance(body, tvm.tirx.SeqStmt) else [body]
        if any(common.tile_op(s) or isinstance(s, tvm.tirx.For) for s in stmts):
            return None
        return loop.loop_var, inner.loop_var, stmts

    def _elementwise(self, record: _Record, loop) -> None:
        self._close_group(record.ops)
        row, col, stmts = self._elementwise_nest(loop)
        # a store simplified away (x = x * 1 of a mean over one column) leaves a no-op Evaluate
        stmts = [
            st for st in stmts if not (isinstance(st, tvm.tirx.Evaluate) and common.const_int(st.value) is not None)
        ]
        if not stmts:
            return
        extents = [common.const_int(loop.extent), common.const_int(loop.body.extent)]
        column = extents == [self.tile[0], 1] and all(
            isinstance(st, tvm.tirx.BufferStore)
            and not common.is_dram(st.buffer)
            and (st.buffer.name in self.columns or [common.const_int(e) for e in st.buffer.shape] == [self.tile[0], 1])
            for st in stmts
            if not isinstance(st, tvm.tirx.Bind)
        )  # (32, 1) columns (row statistics): computed as whole tiles whose column 0 matters
        if column:
            self.columns.update(st.buffer.name for st in stmts if isinstance(st, tvm.tirx.BufferStore))
        self.column_loop = column
        if extents != list(self.tile) and not column:
            raise _Unsupported(
                "T.Parallel",
                f"an element-wise loop over {extents[0]}x{extents[1]}; the Tenstorrent "
                "target computes 32x32 tiles (use 32x32 blocks)",
            )
        self.ij = (row, col)
        self.lets = {}
        self.leaf_cache: list = []
        for stmt in stmts:
            if isinstance(stmt, tvm.tirx.Bind):
                self.lets[stmt.var] = stmt.value
            elif isinstance(stmt, tvm.tirx.BufferStore):
                self._store(record, stmt)
            elif isinstance(stmt, tvm.tirx.IfThenElse):
                raise _Unsupported(
                    "if",
                    f"a condition ({stmt.condition}) in an element-wise loop; only masks of "
                    "buffer edges are supported (tt.TilePad removes those)",
                )
            else:
                raise _Unsupported(type(stmt).__name__, f"{type(stmt).__name__} in an element-wise loop")

    def _offsets(self, indices, buffer_name: str):
        """(row0, col0, bcast) when ``indices`` address a whole tile (or a broadcast row) at (i, j)."""
        i, j = self.ij
        sub = {i: tvm.tirx.IntImm(i.dtype, 0), j: tvm.tirx.IntImm(j.dtype, 0)}
        starts = [self.analyzer.simplify(tvm.tirx.stmt_functor.substitute(e, sub)) for e in indices]

        def is_plus(expr, start, var) -> bool:
            return self.analyzer.can_prove_equal(expr - start - var, 0)

        zero = tvm.tirx.IntImm("int32", 0)
        if len(indices) == 2 and is_plus(indices[0], starts[0], i) and is_plus(indices[1], starts[1], j):
            return starts[0], starts[1], "none"
        rows = self.shards.get(buffer_name, {}).get("shape", [0])
        if len(indices) == 1 and is_plus(indices[0], starts[0], j):
            return zero, starts[0], "rows"
        if (
            len(indices) == 2
            and rows[0] == 1
            and is_plus(indices[1], starts[1], j)
            and self.analyzer.can_prove_equal(indices[0], 0)
        ):
            return zero, starts[1], "rows"
        if (
            len(indices) == 2
            and len(rows) == 2
            and rows[1] == 1
            and is_plus(indices[0], starts[0], i)
            and self.analyzer.can_prove_equal(indices[1], 0)
        ):
            return starts[0], zero, "cols"  # a column vector [rows, 1]: column 0 of its tiles
        raise _Unsupported(
            "load",
            f"{buffer_name}[{', '.join(str(e) for e in indices)}] is not a whole 32x32 tile "
            f"at ({i}, {j}), a row vector indexed by {j} or a column vector indexed by {i}",
        )

    def _store(self, record: _Record, store) -> None:
        i, j = self.ij
        name = store.buffer.name
        if common.is_dram(store.buffer):
            row0, col0, bcast = self._offsets(store.indices, name)
            if bcast != "none":
                raise _Unsupported("store", f"stores to {name} as a row vector; outputs are whole tiles")
            self.pending = self._tile_loads(store.value)
            value = self._emit(record, store.value)
            self._to_dram(record, value, name, self._page(name, row0, col0), tile="")
            return
        if not self._at_ij(name, store.indices):
            raise _Unsupported(
                "store",
                f"stores {name}[{', '.join(str(e) for e in store.indices)}]; tile stores must be {name}[{i}, {j}]",
            )
        self.pending = self._tile_loads(store.value)
        value = self._emit(record, store.value)
        if value.kind == "cb":
            self._to_dst(record.ops, value, name)
        self.dst_holds = name
        self.location[name] = _Operand("dst")

    def _at_ij(self, name: str, indices) -> bool:
        """Whether ``indices`` address element (i, j) of tile ``name`` (a (32, 1) accumulator: (i, 0))."""
        i, j = self.ij
        if len(indices) != 2 or not indices[0].same_as(i):
            return False
        return indices[1].same_as(j) or (name in self.columns and _is_zero(indices[1]))

    def _tile_loads(self, expr) -> dict[str, int]:
        """How many times each tile buffer (not DRAM) is read by ``expr``, through its lets."""
        counts: dict[str, int] = {}

        def visit(node):
            if isinstance(node, tvm.tirx.BufferLoad) and not common.is_dram(node.buffer):
                counts[node.buffer.name] = counts.get(node.buffer.name, 0) + 1
            elif isinstance(node, tvm.tirx.Var) and node in self.lets:
                tvm.tirx.stmt_functor.post_order_visit(tvm.tirx.Evaluate(self.lets[node]), visit)

        tvm.tirx.stmt_functor.post_order_visit(tvm.tirx.Evaluate(expr), visit)
        return counts

    def _emit(self, record: _Record, expr) -> _Operand:
        """Lower an element-wise expression; returns where its tile ends up (a CB or DST)."""
        tirx = tvm.tirx
        expr = _strip_casts(expr)
        if isinstance(expr, tirx.Var) and expr in self.lets:
            return self._emit(record, self.lets[expr])
        if isinstance(expr, tirx.BufferLoad):
            return self._load(record, expr)
        gelu = match_gelu(expr)
        if gelu is not None:
            return self._sfpu(record, gelu[0], gelu[1])
        if common.op_name(expr) == "tirx.exp":
            return self._sfpu(record, "exp", expr.args[0])
        if common.op_name(expr) == "tirx.sqrt":
            return self._sfpu(record, "sqrt", expr.args[0])
        if common.op_name(expr) == "tirx.rsqrt":  # 1 / sqrt(x): two SFPU ops
            return self._sfpu_on(record, "recip", self._sfpu(record, "sqrt", expr.args[0]))
        if isinstance(expr, tirx.Max) and (_is_zero(expr.a) or _is_zero(expr.b)):
            return self._sfpu(record, "relu", expr.b if _is_zero(expr.a) else expr.a)
        constant = (tirx.FloatImm, tirx.IntImm)
        if isinstance(expr, tirx.Max) and not any(isinstance(_strip_casts(x), constant) for x in (expr.a, expr.b)):
            return self._sfpu_binary(record, "max", expr.a, expr.b)
        if common.op_name(expr) == "tirx.if_then_else":
            return self._generated(record, expr)
        fn = {tirx.Add: "add", tirx.Sub: "sub", tirx.Mul: "mul", tirx.Div: "div"}.get(type(expr))
        if fn is not None:
            a_const = isinstance(_strip_casts(expr.a), tirx.FloatImm | tirx.IntImm)
            b_const = isinstance(_strip_casts(expr.b), tirx.FloatImm | tirx.IntImm)
            if b_const and not a_const:  # tile (op) scalar
                return self._scalar(record, fn, expr.a, float(_strip_casts(expr.b).value))
            if a_const and not b_const and fn in ("add", "mul", "sub"):  # scalar (op) tile
                return self._scalar(record, "rsub" if fn == "sub" else fn, expr.b, float(_strip_casts(expr.a).value))
            if a_const and not b_const:  # c / tile: the SFPU's reciprocal, then * c
                value = self._sfpu(record, "recip", expr.b)
                c = float(_strip_casts(expr.a).value)
                if c != 1.0:
                    value = self._sfpu_on(record, "binop_scalar", value)
                    record.ops[-1]["mode"], record.ops[-1]["value"] = "mul", c
                return value
            if not a_const and not b_const and fn == "div":  # tile / tile: * the reciprocal
                return self._binary(record, "mul", expr.a, expr.b, recip_b=True)
            if not a_const and not b_const:
                return self._binary(record, fn, expr.a, expr.b)
        raise _Unsupported(
            _describe(expr),
            f"{_describe(expr)} ({expr}) has no Tenstorrent tile operation; supported: + - * / of tiles, "
            "+ - * / with a scalar, exp, sqrt, rsqrt, gelu, relu",
        )

    def _load(self, record: _Record, load) -> _Operand:
        name = load.buffer.name
        if not common.is_dram(load.buffer):
            i, j = self.ij
            indices = load.indices
            if name not in self.columns and len(indices) == 2 and indices[0].same_as(j) and indices[1].same_as(i):
                return self._transpose(record, name)
            if not self._at_ij(name, load.indices):
                raise _Unsupported(
                    "load",
                    f"reads {name}[{', '.join(str(e) for e in load.indices)}]; tile reads must be {name}[{i}, {j}]",
                )
            operand = self.location.get(name)
            if operand is None:
                raise _Unsupported("load", f"reads tile {name!r} before it has a value")
            self.pending[name] = self.pending.get(name, 1) - 1
            if operand.kind == "dst" and self.dst_holds != name:
                raise _Unsupported("load", f"tile {name!r} left DST before this use")
            if name in self.columns and not self.column_loop:  # a row statistic across the tile's columns
                if operand.kind == "dst":
                    operand = self._spill(record.ops)
                return operand.as_bcast("cols")
            return operand
        for cached, operand in self.leaf_cache:  # the same DRAM tile read twice in one statement: one push
            if same_expr(cached, load):
                return operand
        row0, col0, bcast = self._offsets(load.indices, name)
        operand = self._read(record, name, "", self._page(name, row0, col0))
        operand.bcast = bcast
        self.leaf_cache.append((load, operand))
        return operand

    def _generated(self, record: _Record, expr) -> _Operand:
        """``if_then_else(cond, a, b)`` of constants on a condition of the tile's row/column and loop
        indices (e.g. a causal mask): a tile the reader writes into an input CB for each use."""
        tirx = tvm.tirx
        cond, then, other = expr.args
        values = [_strip_casts(v) for v in (then, other)]
        loads: list = []
        tirx.stmt_functor.post_order_visit(
            tirx.Evaluate(cond), lambda n: loads.append(n) if isinstance(n, tirx.BufferLoad) else None
        )
        if loads or not all(isinstance(v, tirx.FloatImm | tirx.IntImm) for v in values):
            raise _Unsupported(
                "if_then_else",
                f"{expr}: a select is supported between two constants on a condition of indices only "
                "(a mask tile the reader generates)",
            )
        cond = tirx.stmt_functor.substitute(cond, self.lets) if self.lets else cond
        cb = self._new_cb(f"mask{self.next_intermediate}", "generated")
        # the reader evaluates cond for row i, column j of the tile
        record.reads.append(
            {
                "cb": cb,
                "buffer": "",
                "cond": cond,
                "row": self.ij[0],
                "col": self.ij[1],
                "values": [float(v.value) for v in values],
            }
        )
        return self._pushed(cb)

    def _sfpu_binary(self, record: _Record, fn: str, a, b) -> _Operand:
        """``fn(a, b)`` of two tiles on the SFPU: ``a`` copied to DST 0, ``b`` to DST 1, the result in DST 0."""
        left = self._emit(record, a)
        if left.kind == "dst":
            left = self._spill(record.ops)
        right = self._emit(record, b)
        if right.kind == "dst":
            right = self._spill(record.ops)
        if left.bcast != "none" or right.bcast != "none":
            raise _Unsupported("max", "the maximum of a tile and a broadcast row or column")
        self._to_dst(record.ops, left, "value")
        op = {"op": "copy", "cb": right.cb, "dst": 1, "wait": [], "pop": []}
        self._use(right, op)
        record.ops.append(op)
        record.ops.append({"op": "sfpu", "fn": fn, "dst": 0, "init": False})
        self.dst_holds = "value"
        return _Operand("dst")

    def _transpose(self, record: _Record, name: str) -> _Operand:
        """``tile[j, i]``: the tile transposed on its way into DST (``transpose_wh_tile``)."""
        operand = self.location.get(name)
        if operand is None:
            raise _Unsupported("load", f"reads tile {name!r} before it has a value")
        self.pending[name] = self.pending.get(name, 1) - 1
        if operand.kind == "dst":
            operand = self._spill(record.ops)
        if operand.bcast != "none":
            raise _Unsupported("transpose", f"a transposed broadcast {operand.bcast[:-1]}")
        self._acquire(record.ops, "value")
        self._set_mode({"kind": "transpose", "cb": operand.cb})
        op = {"op": "transpose", "cb": operand.cb, "dst": 0, "wait": [], "pop": []}
        self._use(operand, op)
        record.ops.append(op)
        return _Operand("dst")

    def _sfpu(self, record: _Record, fn: str, arg) -> _Operand:
        return self._sfpu_on(record, fn, self._emit(record, arg))

    def _sfpu_on(self, record: _Record, fn: str, value: _Operand) -> _Operand:
        """SFPU ``fn`` on a value already emitted (in a CB, or in DST), in DST. A tile the statement
        reads again later is packed to a CB first: the SFPU works in place."""
        if value.kind == "dst" and self.pending.get(self.dst_holds or "", 0) > 0:
            value = self._spill(record.ops)
        if value.kind in ("cb", "const"):
            self._to_dst(record.ops, value, "value", keep_bcast=True)
            self.dst_bcast = value.bcast  # e.g. 1 / a column: still a column
        elif self.phase != "math":
            self._to_dst(record.ops, self._spill(record.ops), "value")
        record.ops.append({"op": "sfpu", "fn": fn, "dst": 0, "init": False})
        self.dst_holds = "value"
        return _Operand("dst")

    def _scalar(self, record: _Record, mode: str, arg, value: float) -> _Operand:
        """``tile (mode) value`` on the SFPU, in DST (``binop_with_scalar``: add, sub, mul, div, rsub)."""
        value_in_dst = self._sfpu(record, "binop_scalar", arg)
        op = record.ops[-1]
        op["mode"], op["value"] = mode, value
        return value_in_dst

    def _binary(self, record: _Record, fn: str, a, b, recip_b: bool = False) -> _Operand:
        """``a fn b`` of two tiles on the FPU (``recip_b``: ``b`` through the SFPU's reciprocal first)."""
        left = self._emit(record, a)
        if left.kind == "dst":
            left = self._spill(record.ops)
        right = self._sfpu(record, "recip", b) if recip_b else self._emit(record, b)
        if right.kind == "dst":
            right = self._spill(record.ops)
        if left.bcast != "none" and fn in ("add", "mul"):
            left, right = right, left
        if left.bcast != "none":
            raise _Unsupported(
                "binary", f"{fn} with a broadcast {left.bcast[:-1]} as the first operand (a tile must come first)"
            )
        if right.bcast == "rows" and fn == "sub":
            raise _Unsupported(
                "binary", "subtracting a broadcast row (tt-metal v0.62.2 has sub_tiles_bcast_cols, no row form)"
            )
        self._acquire(record.ops, "value")
        mode = {"kind": "binary", "fn": fn, "bcast": right.bcast, "in0": left.cb, "in1": right.cb}
        self._set_mode(mode)
        op = {
            "op": "binary",
            "fn": fn,
            "bcast": right.bcast,
            "in0": left.cb,
            "in1": right.cb,
            "dst": 0,
            "wait": [],
            "pop": [],
        }
        self._use(left, op)
        self._use(right, op)
        record.ops.append(op)
        self.dst_holds = "value"
        return _Operand("dst")
