"""The reader, compute and writer kernels of one annotated Tenstorrent PrimFunc.

Each kernel is a visitor over the ``tt.persistent`` loop of the function. It prints the loop
structure the annotations live in (the per-core tile loop, the block-index bindings and serial
loops such as the K loop, as far as the kernel needs them) and turns annotations into API calls:

    reader   tt.read     cb_reserve_back / noc_async_read_tile / barrier / cb_push_back
    compute  tt.compute  tile_regs_acquire, matmul_tiles / add_tiles / copy_tile / exp_tile ...,
                         tile_regs_commit + tile_regs_wait, pack_tile, tile_regs_release
    writer   tt.write    cb_wait_front / noc_async_write_tile / barrier / cb_pop_front

Nothing else in the IR is read: the element-wise loops and tile-op calls the annotations wrap
are never printed, and no pattern is matched here (``tt.Tensorize`` did that).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tessera_tvm._tvm import tvm
from tessera_tvm.target.tt import TT_METAL_VERSION

from .. import ir
from .cexpr import CodegenError, Names, cxx, used_vars

INDENT = "    "


def f32_bits(value: float) -> int:
    """The IEEE float32 bit pattern of ``value`` (how kernels receive a scalar)."""
    return struct.unpack("<I", struct.pack("<f", value))[0]


ROLE_ANNOTATION = {"reader": ir.READ, "writer": ir.WRITE, "compute": ir.COMPUTE}
_RESERVED = {"kernel_main", "MAIN", "NAMESPACE", "uint32_t", "ALWI"}


@dataclass
class KernelInfo:
    """What the three kernels share, read once from the function's annotations."""

    name: str
    func: object
    loop: object  # the tt.persistent For
    cbs: list[dict]
    shards: dict
    compute_init: dict
    compute_config: dict
    reads: list[str]  # DRAM buffers the reader reads, in order of first read
    writes: list[str]  # DRAM buffers the writer writes, in order of first write

    def cb(self, cb_id: int) -> dict:
        for cb in self.cbs:
            if cb["id"] == cb_id:
                return cb
        raise CodegenError(f"kernel {self.name!r}: CB {cb_id} is not in tt.circular_buffers")


def annotations(stmt, key: str) -> list[dict]:
    """Payloads of the ``key`` AttrStmts under ``stmt``, in program order."""
    found: list = []

    def visit(node):
        if isinstance(node, tvm.tirx.AttrStmt) and node.attr_key == key:
            found.append(ir.to_python(node.node))

    tvm.tirx.stmt_functor.pre_order_visit(stmt, lambda n: visit(n) is None)
    return found


def kernel_info(name: str, func) -> KernelInfo:
    loop = ir.persistent_loop(func)
    if loop is None:
        raise CodegenError(f"kernel {name!r} has no tt.persistent loop; lower it with the tenstorrent config")
    init = ir.attr(func, ir.COMPUTE_INIT)
    if init is None:
        raise CodegenError(f"kernel {name!r} has no tt.compute_init; run tt.Tensorize and tt.VerifyTTIR first")

    def ordered(key):
        out: list[str] = []
        for node in annotations(loop.body, key):
            if node["buffer"] and node["buffer"] not in out:  # "": a tile the reader generates
                out.append(node["buffer"])
        return out

    return KernelInfo(
        name=name,
        func=func,
        loop=loop,
        cbs=ir.attr(func, ir.CIRCULAR_BUFFERS),
        shards=ir.attr(func, ir.SHARD),
        compute_init=init,
        compute_config=ir.attr(func, ir.COMPUTE_CONFIG, {}),
        reads=ordered(ir.READ),
        writes=ordered(ir.WRITE),
    )


# ---------------------------------------------------------------------------------------------
# The shared walk
# ---------------------------------------------------------------------------------------------


class _Kernel:
    role = ""

    def __init__(self, info: KernelInfo):
        self.info = info
        self.names = Names(_RESERVED)
        self.lines: list[str] = []
        self.cb_names: dict[int, str] = {}
        self.pending: list[int] = []  # reader: CBs read but not yet pushed (one barrier per group)
        self.needed = self._needed_vars()

    # ---- which statements and variables this kernel needs ----------------------------------
    def _relevant(self, stmt) -> bool:
        key = ROLE_ANNOTATION[self.role]
        return any(self._keeps(node) for node in annotations(stmt, key))

    def _keeps(self, node: dict) -> bool:
        return self.role != "compute" or bool(node["ops"])

    def _needed_vars(self) -> list:
        """Variables whose definitions this kernel must print (uses first, then Bind closure)."""
        tirx = tvm.tirx
        needed: list = []
        binds: list = []
        key = ROLE_ANNOTATION[self.role]

        def visit(node):
            if isinstance(node, tirx.AttrStmt) and node.attr_key == key and "page" in ir.to_python(node.node):
                needed.extend(used_vars(ir.to_python(node.node)["page"]))
            elif isinstance(node, tirx.AttrStmt) and node.attr_key == key and "cond" in ir.to_python(node.node):
                gen = ir.to_python(node.node)
                local = (gen["row"], gen["col"])
                needed.extend(v for v in used_vars(gen["cond"]) if not any(v.same_as(x) for x in local))
            elif isinstance(node, tirx.For) and self._relevant(node):
                needed.extend(used_vars(node.min) + used_vars(node.extent))
            elif isinstance(node, tirx.Bind):
                binds.append(node)

        tirx.stmt_functor.post_order_visit(self.info.loop.body, visit)
        for bind in reversed(binds):  # a Bind is printed when a later use (or Bind) needs it
            if any(v.same_as(bind.var) for v in needed):
                needed.extend(used_vars(bind.value))
        return needed

    def _needs(self, var) -> bool:
        return any(v.same_as(var) for v in self.needed)

    # ---- output helpers ---------------------------------------------------------------------
    def emit(self, depth: int, text: str) -> None:
        self.lines.append(INDENT * depth + text if text else "")

    def cb_name(self, cb_id: int) -> str:
        if cb_id not in self.cb_names:
            self.cb_names[cb_id] = self.names.fresh(f"cb_{self.info.cb(cb_id)['name']}")
        return self.cb_names[cb_id]

    def cb_constants(self, depth: int, ids: list[int]) -> None:
        for cb_id in ids:
            self.emit(depth, f"constexpr uint32_t {self.cb_name(cb_id)} = tt::CBIndex::c_{cb_id};")

    def runtime_args(self, depth: int, first: int) -> None:
        loop = self.info.loop
        for k, (expr, hint) in enumerate(((loop.min, "start_tile"), (loop.extent, "num_tiles"))):
            if not isinstance(expr, tvm.tirx.Var):
                raise CodegenError(
                    f"kernel {self.info.name!r}: the tt.persistent loop must run from a start_tile "
                    f"runtime argument over num_tiles tiles, found {expr}"
                )
            self.emit(depth, f"const uint32_t {self.names.bind(expr, hint)} = get_arg_val<uint32_t>({first + k});")

    def tile_loop(self, depth: int) -> None:
        loop = self.info.loop
        tile = self.names.bind(loop.loop_var)
        start = cxx(loop.min, self.names)
        self.emit(
            depth, f"for (uint32_t {tile} = {start}; {tile} < {start} + {cxx(loop.extent, self.names)}; ++{tile}) {{"
        )
        self.walk(loop.body, depth + 1)
        self.flush(depth + 1)
        self.emit(depth, "}")

    def walk(self, stmt, depth: int) -> None:
        tirx = tvm.tirx
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self.walk(s, depth)
        elif isinstance(stmt, tirx.SBlockRealize):
            self.walk(stmt.block.body, depth)
        elif isinstance(stmt, tirx.Bind) and not stmt.var.dtype.startswith("float"):
            if self._needs(stmt.var):
                self.flush(depth)
                value = cxx(stmt.value, self.names)
                self.emit(depth, f"const uint32_t {self.names.bind(stmt.var)} = {value};")
        elif isinstance(stmt, tirx.AttrStmt) and stmt.attr_key in (ir.READ, ir.WRITE, ir.COMPUTE):
            if stmt.attr_key == ROLE_ANNOTATION[self.role]:
                node = ir.to_python(stmt.node)
                if self._keeps(node):
                    self.annotation(node, depth)
            self.walk(stmt.body, depth)
        elif isinstance(stmt, tirx.For) and self._relevant(stmt):
            self.flush(depth)
            var = self.names.bind(stmt.loop_var)
            lo, extent = cxx(stmt.min, self.names), cxx(stmt.extent, self.names)
            bound = extent if lo == "0" else f"{lo} + {extent}"
            self.emit(depth, f"for (uint32_t {var} = {lo}; {var} < {bound}; ++{var}) {{")
            self.walk(stmt.body, depth + 1)
            self.flush(depth + 1)
            self.emit(depth, "}")
        # anything else is the computation the annotations describe: not printed

    def flush(self, depth: int) -> None:
        """Reader: one barrier for the reads issued so far, then push their pages."""
        if self.pending:
            self.emit(depth, "noc_async_read_barrier();")
            for cb_id in self.pending:
                self.emit(depth, f"cb_push_back({self.cb_name(cb_id)}, 1);")
            self.pending = []

    def annotation(self, node: dict, depth: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def header(self, what: str, detail: list[str]) -> list[str]:
        out = [
            f"// {what} kernel of '{self.info.name}', generated by Tessera. Pinned API: tt-metal {TT_METAL_VERSION}."
        ]
        out += [f"// {line}" for line in detail]
        return out


# ---------------------------------------------------------------------------------------------
# Data movement: reader and writer
# ---------------------------------------------------------------------------------------------


class _DataMovement(_Kernel):
    buffers: list[str]

    def accessor_setup(self, depth: int) -> None:
        previous = None
        self.accessors: dict[str, str] = {}
        for buffer in self.buffers:
            name = self.names.fresh(buffer)
            args = self.names.fresh(f"{buffer}_args")
            offset = "0" if previous is None else f"{previous}.next_compile_time_args_offset()"
            page_cb = self.cb_name(self._first_cb(buffer))
            self.emit(depth, f"constexpr auto {args} = TensorAccessorArgs<{offset}>();")
            self.emit(
                depth, f"const auto {name} = TensorAccessor({args}, {self.addr[buffer]}, get_tile_size({page_cb}));"
            )
            self.accessors[buffer] = name
            previous = args

    def _first_cb(self, buffer: str) -> int:
        key = ROLE_ANNOTATION[self.role]
        return next(node["cb"] for node in annotations(self.info.loop.body, key) if node["buffer"] == buffer)

    def render(self) -> str:
        self.addr = {b: self.names.fresh(f"{b}_addr") for b in self.buffers}
        body: list[str] = []
        self.lines = body
        for k, buffer in enumerate(self.buffers):
            self.emit(1, f"const uint32_t {self.addr[buffer]} = get_arg_val<uint32_t>({k});")
        self.runtime_args(1, len(self.buffers))
        self.emit(0, "")
        key = ROLE_ANNOTATION[self.role]
        constants = [cb for cb in self.info.cbs if cb["role"] == "constant"] if self.role == "reader" else []
        ids = {node["cb"] for node in annotations(self.info.loop.body, key)} | {cb["id"] for cb in constants}
        self.cb_constants(1, sorted(ids))
        self.emit(0, "")
        self.accessor_setup(1)
        if self.buffers:
            self.emit(0, "")
        for cb in constants:
            self.fill_constant(1, cb)
        self.tile_loop(1)
        args = ", ".join(self.buffers) or "none"
        runtime = ", ".join([self.addr[b] for b in self.buffers] + ["start_tile", "num_tiles"])
        detail = [f"Runtime args: {runtime}.", f"Compile-time args: TensorAccessorArgs of {args}."]
        out = self.header(self.title, detail)
        out += ["#include <cstdint>", "", '#include "dataflow_api.h"', "", "void kernel_main() {", *body, "}", ""]
        return "\n".join(out)


class ReaderKernel(_DataMovement):
    role = "reader"
    title = "Reader (DRAM -> circular buffers)"

    def __init__(self, info: KernelInfo):
        super().__init__(info)
        self.buffers = info.reads

    def fill_constant(self, depth: int, cb: dict) -> None:
        """One tile of ``cb['value']`` written into the CB's L1 page, pushed once before the tile loop
        (a reduce's scaler tile: every element the scale, so any face layout reads it the same)."""
        name = self.cb_name(cb["id"])
        value = float(cb["value"])
        word, (bits,) = _tile_words(cb["data_format"], [value])
        ptr = self.names.fresh(f"{cb['name']}_ptr")
        self.emit(depth, f"cb_reserve_back({name}, 1);")
        self.emit(depth, f"volatile {word}* {ptr} = reinterpret_cast<volatile {word}*>(get_write_ptr({name}));")
        self.emit(depth, f"for (uint32_t i = 0; i < 1024; ++i) {{  // {value!r} in every element of the tile")
        self.emit(depth + 1, f"{ptr}[i] = {bits};")
        self.emit(depth, "}")
        self.emit(depth, f"cb_push_back({name}, 1);")
        self.emit(0, "")

    def generate(self, node: dict, depth: int) -> None:
        """A tile whose element (i, j) is ``values[0]`` where ``cond`` holds and ``values[1]`` elsewhere
        (a causal mask), written in face order straight into the CB's page."""
        name = self.cb_name(node["cb"])
        cb = self.info.cb(node["cb"])
        i, j = self.names.bind(node["row"], "i"), self.names.bind(node["col"], "j")
        word, bits = _tile_words(cb["data_format"], node["values"])
        ptr = self.names.fresh(f"{cb['name']}_ptr")
        self.flush(depth)
        self.emit(depth, f"cb_reserve_back({name}, 1);")
        self.emit(depth, f"volatile {word}* {ptr} = reinterpret_cast<volatile {word}*>(get_write_ptr({name}));")
        self.emit(depth, f"for (uint32_t {i} = 0; {i} < 32; ++{i}) {{")
        self.emit(depth + 1, f"for (uint32_t {j} = 0; {j} < 32; ++{j}) {{")
        self.emit(depth + 2, f"// face ({i} / 16, {j} / 16), row-major inside it")
        self.emit(
            depth + 2,
            f"{ptr}[(({i} >> 4) * 2 + ({j} >> 4)) * 256 + ({i} & 15) * 16 + ({j} & 15)] = "
            f"({cxx(node['cond'], self.names)}) ? {bits[0]} : {bits[1]};",
        )
        self.emit(depth + 1, "}")
        self.emit(depth, "}")
        self.emit(depth, f"cb_push_back({name}, 1);")

    def annotation(self, node: dict, depth: int) -> None:
        if "cond" in node:
            self.generate(node, depth)
            return
        if node["cb"] in self.pending:  # a second tile for the same CB: push the first one before
            self.flush(depth)
        cb = self.cb_name(node["cb"])
        self.emit(depth, f"cb_reserve_back({cb}, 1);")
        self.emit(
            depth,
            f"noc_async_read_tile({cxx(node['page'], self.names)}, {self.accessors[node['buffer']]}, "
            f"get_write_ptr({cb}));",
        )
        self.pending.append(node["cb"])


class WriterKernel(_DataMovement):
    role = "writer"
    title = "Writer (circular buffers -> DRAM)"

    def __init__(self, info: KernelInfo):
        super().__init__(info)
        self.buffers = info.writes

    def annotation(self, node: dict, depth: int) -> None:
        cb = self.cb_name(node["cb"])
        self.emit(depth, f"cb_wait_front({cb}, 1);")
        self.emit(
            depth,
            f"noc_async_write_tile({cxx(node['page'], self.names)}, {self.accessors[node['buffer']]}, "
            f"get_read_ptr({cb}));",
        )
        self.emit(depth, "noc_async_write_barrier();")
        self.emit(depth, f"cb_pop_front({cb}, 1);")


# ---------------------------------------------------------------------------------------------
# Compute
# ---------------------------------------------------------------------------------------------

_BINARY = {"add": "add_tiles", "sub": "sub_tiles", "mul": "mul_tiles"}
_BINARY_INIT = {"add": "add_tiles_init", "sub": "sub_tiles_init", "mul": "mul_tiles_init"}
_BCAST = {  # (broadcast, fn) -> (short init, op): row 0 / column 0 of the second tile across the first
    ("rows", "add"): ("add_bcast_rows_init_short", "add_tiles_bcast_rows"),
    ("rows", "mul"): ("mul_bcast_rows_init_short", "mul_tiles_bcast_rows"),
    ("cols", "add"): ("add_bcast_cols_init_short", "add_tiles_bcast_cols"),
    ("cols", "mul"): ("mul_bcast_cols_init_short", "mul_tiles_bcast_cols"),
    ("cols", "sub"): ("sub_bcast_cols_init_short", "sub_tiles_bcast_cols"),  # no row form in v0.62.2
}
_UNPACK_TO_DST = {  # op -> (call, header)
    "copy": ("copy_tile", "compute_kernel_api/tile_move_copy.h"),
    "transpose": ("transpose_wh_tile", "compute_kernel_api/transpose_wh.h"),
}
_SFPU = {  # fn -> (init call, op call, header)
    "exp": ("exp_tile_init()", "exp_tile", "compute_kernel_api/eltwise_unary/exp.h"),
    "gelu": ("gelu_tile_init<false>()", "gelu_tile<false>", "compute_kernel_api/eltwise_unary/gelu.h"),
    "gelu_tanh": ("gelu_tile_init<true>()", "gelu_tile<true>", "compute_kernel_api/eltwise_unary/gelu.h"),
    "relu": ("relu_tile_init()", "relu_tile", "compute_kernel_api/eltwise_unary/relu.h"),
    "sqrt": ("sqrt_tile_init()", "sqrt_tile", "compute_kernel_api/eltwise_unary/sqrt.h"),
    "recip": ("recip_tile_init()", "recip_tile", "compute_kernel_api/eltwise_unary/recip.h"),
    # one init for every mode; the call is <mode>_unary_tile(idst, the scalar's fp32 bits)
    "binop_scalar": ("binop_with_scalar_tile_init()", None, "compute_kernel_api/eltwise_unary/binop_with_scalar.h"),
    "max": ("binary_max_tile_init()", "binary_max_tile", "compute_kernel_api/binary_max_min.h"),
}


def _scalar_call(op: dict) -> str:
    """``mul_unary_tile(0, 0x40000000u)  // * 2``: the scalar travels as its fp32 bit pattern."""
    value = op["value"]
    bits = f32_bits(value)
    what = {"add": f"x + {value!r}", "sub": f"x - {value!r}", "mul": f"x * {value!r}", "div": f"x / {value!r}"}
    return f"{op['mode']}_unary_tile({op['dst']}, 0x{bits:08x}u);  // {what.get(op['mode'], f'{value!r} - x')}"


class ComputeKernel(_Kernel):
    role = "compute"

    def __init__(self, info: KernelInfo):
        super().__init__(info)
        self.headers: set[str] = {"compute_kernel_api/common.h"}

    def mode_init(self, mode: dict, out: str | None = None) -> str:
        """The short init that puts the FPU (unpacker + math) in ``mode``."""
        kind = mode["kind"]
        if kind == "reduce":
            self.headers.add("compute_kernel_api/reduce.h")
            if out is None and mode.get("out") is not None:
                out = self.cb_name(mode["out"])
            return f"reduce_init<{_reduce_args(mode)}>({self.cb_name(mode['in0'])}, {self.cb_name(mode['scaler'])}, {out});"
        if kind == "matmul":
            self.headers.add("compute_kernel_api/matmul.h")
            return f"mm_init_short({self.cb_name(mode['in0'])}, {self.cb_name(mode['in1'])}, {mode['transpose']});"
        if kind == "copy":
            self.headers.add("compute_kernel_api/tile_move_copy.h")
            return f"copy_tile_to_dst_init_short({self.cb_name(mode['cb'])});"
        if kind == "transpose":
            self.headers.add("compute_kernel_api/transpose_wh.h")
            return f"transpose_wh_init_short({self.cb_name(mode['cb'])});"
        in0, in1 = self.cb_name(mode["in0"]), self.cb_name(mode["in1"])
        if mode["bcast"] != "none":
            self.headers.add("compute_kernel_api/bcast.h")
            return f"{_BCAST[mode['bcast'], mode['fn']][0]}({in0}, {in1});"
        self.headers.add("compute_kernel_api/eltwise_binary.h")
        return f"{_BINARY_INIT[mode['fn']]}({in0}, {in1});"

    def hw_init(self, depth: int) -> None:
        init = self.info.compute_init
        hw, fpu, sfpu = init.get("hw"), init.get("fpu"), init.get("sfpu")
        if hw is not None:
            out = self.cb_name(hw["out"]) if hw.get("out") is not None else self.cb_name(hw.get("in0", hw.get("cb")))
            if hw["kind"] == "reduce":
                self.emit(
                    depth,
                    f"compute_kernel_hw_startup({self.cb_name(hw['in0'])}, {self.cb_name(hw['scaler'])}, {out});",
                )
                self.emit(depth, self.mode_init(hw, out))
                fpu = None if fpu is not None and fpu["kind"] == "reduce" else fpu
            elif hw["kind"] == "matmul":
                self.headers.add("compute_kernel_api/matmul.h")
                self.emit(
                    depth, f"mm_init({self.cb_name(hw['in0'])}, {self.cb_name(hw['in1'])}, {out}, {hw['transpose']});"
                )
                fpu = None if fpu is not None and fpu["kind"] == "matmul" else fpu
            elif hw["kind"] == "transpose":
                self.headers.add("compute_kernel_api/transpose_wh.h")
                self.emit(depth, f"transpose_wh_init({self.cb_name(hw['cb'])}, {out});")
                fpu = None if fpu is not None and fpu["kind"] == "transpose" else fpu
            elif hw["kind"] == "copy":
                self.headers.add("compute_kernel_api/eltwise_unary/eltwise_unary.h")
                self.emit(depth, f"init_sfpu({self.cb_name(hw['cb'])}, {out});")
                fpu = None if fpu is not None and fpu["kind"] == "copy" else fpu
            else:
                self.headers.add("compute_kernel_api/eltwise_binary.h")
                self.emit(depth, f"binary_op_init_common({self.cb_name(hw['in0'])}, {self.cb_name(hw['in1'])}, {out});")
        if fpu is not None:
            self.emit(depth, self.mode_init(fpu))
        if sfpu is not None:
            self.headers.add(_SFPU[sfpu][2])
            self.emit(depth, f"{_SFPU[sfpu][0]};")

    def waits(self, depth: int, op: dict) -> None:
        for cb in op.get("wait", []):
            self.emit(depth, f"cb_wait_front({self.cb_name(cb)}, 1);")

    def pops(self, depth: int, op: dict) -> None:
        for cb in op.get("pop", []):
            self.emit(depth, f"cb_pop_front({self.cb_name(cb)}, 1);")

    def annotation(self, node: dict, depth: int) -> None:
        for op in node["ops"]:
            kind = op["op"]
            if kind == "acquire":
                if op.get("uninit"):
                    self.emit(depth, "reduce_uninit();")
                if op.get("init"):
                    self.emit(depth, self.mode_init(op["init"]))
                self.emit(depth, "tile_regs_acquire();")
            elif kind == "matmul":
                self.headers.add("compute_kernel_api/matmul.h")
                self.waits(depth, op)
                self.emit(
                    depth,
                    f"matmul_tiles({self.cb_name(op['in0'])}, {self.cb_name(op['in1'])}, 0, 0, "
                    f"{op['dst']}, {op['transpose']});",
                )
                self.pops(depth, op)
            elif kind == "binary":
                self.waits(depth, op)
                call = _BCAST[op["bcast"], op["fn"]][1] if op["bcast"] != "none" else _BINARY[op["fn"]]
                self.headers.add(
                    "compute_kernel_api/bcast.h" if op["bcast"] != "none" else "compute_kernel_api/eltwise_binary.h"
                )
                self.emit(depth, f"{call}({self.cb_name(op['in0'])}, {self.cb_name(op['in1'])}, 0, 0, {op['dst']});")
                self.pops(depth, op)
            elif kind == "reduce":
                self.headers.add("compute_kernel_api/reduce.h")
                self.waits(depth, op)
                self.emit(
                    depth,
                    f"reduce_tile<{_reduce_args(op)}>({self.cb_name(op['in0'])}, {self.cb_name(op['scaler'])}, "
                    f"0, 0, {op['dst']});",
                )
                self.pops(depth, op)
            elif kind in _UNPACK_TO_DST:  # a CB tile into DST: copied, or transposed on the way
                call, header = _UNPACK_TO_DST[kind]
                self.headers.add(header)
                self.waits(depth, op)
                self.emit(depth, f"{call}({self.cb_name(op['cb'])}, 0, {op['dst']});")
                self.pops(depth, op)
            elif kind == "sfpu":
                init, call, header = _SFPU[op["fn"]]
                self.headers.add(header)
                if op.get("init"):
                    self.emit(depth, f"{init};")
                if op["fn"] == "max":  # DST[dst] = max(DST[dst], DST[dst + 1])
                    self.emit(depth, f"{call}({op['dst']}, {op['dst'] + 1});")
                else:
                    self.emit(depth, _scalar_call(op) if call is None else f"{call}({op['dst']});")
            elif kind == "discard":  # a carried tile nothing reads after its loop
                self.waits(depth, op)
                self.pops(depth, op)
            elif kind == "pack":
                if op["commit"]:
                    self.emit(depth, "tile_regs_commit();")
                    self.emit(depth, "tile_regs_wait();")
                cb = self.cb_name(op["cb"])
                self.emit(depth, f"cb_reserve_back({cb}, 1);")
                restore = op.get("restore_format")  # a tile of the kernel's own in a kernel that changes format
                if restore is not None:
                    self.emit(depth, f"pack_reconfig_data_format({cb});")
                self.emit(depth, f"pack_tile({op['dst']}, {cb});")
                if restore is not None:
                    self.emit(depth, f"pack_reconfig_data_format({self.cb_name(restore)});")
                self.emit(depth, f"cb_push_back({cb}, 1);")
            elif kind == "release":
                self.emit(depth, "tile_regs_release();")
            else:
                raise CodegenError(f"kernel {self.info.name!r}: unknown compute op {kind!r}")

    def render(self) -> str:
        body: list[str] = []
        self.lines = body
        self.runtime_args(1, 0)
        self.emit(0, "")
        used = sorted(
            {
                cb
                for node in annotations(self.info.loop.body, ir.COMPUTE)
                for op in node["ops"]
                for key in ("cb", "in0", "in1")
                if key in op
                for cb in [op[key]]
            }
            | {
                c
                for part in self.info.compute_init.values()
                if isinstance(part, dict)
                for key in ("cb", "in0", "in1", "out")
                if part.get(key) is not None
                for c in [part[key]]
            }
        )
        constants = [cb["id"] for cb in self.info.cbs if cb["role"] == "constant"]
        self.cb_constants(1, sorted(set(used) | set(constants)))
        self.emit(0, "")
        self.hw_init(1)
        for cb_id in constants:  # the reader pushed it once; it stays until the last tile
            self.emit(1, f"cb_wait_front({self.cb_name(cb_id)}, 1);")
        self.emit(0, "")
        self.tile_loop(1)
        for cb_id in constants:
            self.emit(1, f"cb_pop_front({self.cb_name(cb_id)}, 1);")
        roles = ", ".join(f"c_{cb['id']} = {cb['name']}" for cb in self.info.cbs if cb["id"] in used)
        out = self.header(
            "Compute", ["Runtime args: start_tile, num_tiles (this core's output tiles).", f"CBs: {roles}."]
        )
        out += ["#include <cstdint>", ""]
        out += [f'#include "{h}"' for h in sorted(self.headers)]
        out += ["", "namespace NAMESPACE {", "void MAIN {", *body, "}", "}  // namespace NAMESPACE", ""]
        return "\n".join(out)


def _half_bits(data_format: str, value: float) -> int:
    """The 16-bit pattern of ``value`` in a CB of ``data_format`` (bfloat16: float32's upper half;
    Float16: IEEE half)."""
    if data_format == "Float16":
        return struct.unpack("<H", struct.pack("<e", value))[0]
    return f32_bits(value) >> 16


def _tile_words(data_format: str, values) -> tuple[str, list[str]]:
    """The C type of one element of a CB page in ``data_format`` and ``values`` as its literals."""
    if data_format == "Float32":
        return "uint32_t", [f"0x{f32_bits(v):08x}u" for v in values]
    return "uint16_t", [f"0x{_half_bits(data_format, v):04x}u" for v in values]  # Float16_b or Float16


def _reduce_args(mode: dict) -> str:
    return f"PoolType::{mode['type'].upper()}, ReduceDim::REDUCE_ROW"


def render_kernels(info: KernelInfo) -> dict[str, str]:
    """``{"reader": ..., "compute": ..., "writer": ...}`` C++ sources."""
    return {
        "reader": ReaderKernel(info).render(),
        "compute": ComputeKernel(info).render(),
        "writer": WriterKernel(info).render(),
    }
