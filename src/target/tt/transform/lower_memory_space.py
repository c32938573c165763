"""tt.LowerMemorySpace: give every tile that moves between DRAM and a core an L1 circular buffer.

On Tenstorrent a reader kernel moves DRAM tiles into L1 circular buffers (CBs), the compute
kernel consumes and produces CB pages, and a writer kernel drains CBs back to DRAM. This pass
finds, in program order,

    T.copy(dram -> tile buffer)          an input CB for the tile buffer (the reader fills it)
    T.copy(tile buffer -> dram)          an output CB for the tile buffer (the writer drains it)
    dram[...] read inside a compute loop  an input CB named after the DRAM buffer (e.g. a bias row)
    dram[...] = ... in a compute loop     an output CB named after the DRAM buffer

and records them, ids following tt-metal's convention scaled to the arch's CB count (inputs from
c_0, outputs from c_16 of 32), with ``input_pages`` / ``output_pages`` pages (2: double
buffering) of one tile in the DRAM buffer's format:

    tt.circular_buffers = [{id, name, role, dram, tile, num_pages, page_size, data_format}, ...]

where ``tile`` is the tile buffer the CB holds ("" for a DRAM buffer read or written in a loop).

Tile buffers that got a CB move from ``shared``/``local.fragment`` to the ``tt.cb`` scope. The CBs
must fit one core: more CB ids than the arch has, or more L1 than ``resources.l1_bytes_per_core``,
is a ``TTResourceError`` naming the kernel, the amount and the limit.
"""

from __future__ import annotations

from tessera_tvm._tvm import tvm
from tessera_tvm.registry import BuildContext, Param, register_pass
from tessera_tvm.target.tt import DTYPE_TO_FORMAT

from . import common


def _dram_accesses(stmt, found: list) -> None:
    """Append ("input" | "output", dram buffer, tile buffer | None) in program order."""
    tirx = tvm.tirx
    op = common.tile_op(stmt)
    if op is not None:
        name, call = op
        if name == "tl.tileop.copy":
            src, dst = common.region(call.args[0]), common.region(call.args[1])
            if src is not None and dst is not None:
                if common.is_dram(src[0]) and not common.is_dram(dst[0]):
                    found.append(("input", src[0], dst[0]))
                elif common.is_dram(dst[0]) and not common.is_dram(src[0]):
                    found.append(("output", dst[0], src[0]))
        return
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _dram_accesses(s, found)
        return
    exprs, children = [], []
    if isinstance(stmt, tirx.BufferStore):
        exprs = [stmt.value, *stmt.indices]
    elif isinstance(stmt, tirx.Bind):
        exprs = [stmt.value]
    elif isinstance(stmt, tirx.IfThenElse):
        exprs, children = [stmt.condition], [stmt.then_case] + ([stmt.else_case] if stmt.else_case else [])
    elif isinstance(stmt, tirx.For):
        children = [stmt.body]
    elif isinstance(stmt, tirx.AttrStmt):
        children = [stmt.body]
    elif isinstance(stmt, tirx.SBlockRealize):
        children = [stmt.block.body]
    elif isinstance(stmt, tirx.SBlock):
        children = [stmt.body]
    loads: list = []
    for expr in exprs:
        tirx.stmt_functor.post_order_visit(
            tirx.Evaluate(expr), lambda n: loads.append(n) if isinstance(n, tirx.BufferLoad) else None
        )
    found.extend(("input", load.buffer, None) for load in loads if common.is_dram(load.buffer))
    if isinstance(stmt, tirx.BufferStore) and common.is_dram(stmt.buffer):
        found.append(("output", stmt.buffer, None))
    for child in children:
        _dram_accesses(child, found)


def plan_circular_buffers(name: str, func, input_pages: int, output_pages: int) -> tuple[list[dict], dict]:
    """The CB list of a kernel and the tile buffers that live in CBs (name -> buffer)."""
    arch = common.require_attr(func, common.ARCH, name, "tt.ApplyTTDefaults")
    shards = common.require_attr(func, common.SHARD, name, "tt.InferShard")
    accesses: list = []
    _dram_accesses(func.body, accesses)
    first_id = common.cb_ranges(arch["num_cbs"])
    next_id = dict(first_id)
    cbs: list[dict] = []
    tiles: dict = {}
    seen: dict[tuple[str, str], dict] = {}
    for role, dram, tile in accesses:
        key = (role, tile.name if tile is not None else None, dram.name)
        if key in seen:
            continue
        label = tile.name if tile is not None else dram.name
        taken = {cb["name"] for cb in cbs}
        if label in taken:  # e.g. a tile copied in from one buffer and out to another
            label = f"{label}_{role}"
        shard = shards[dram.name]
        cb = {
            "id": next_id[role],
            "name": label,
            "role": role,
            "dram": dram.name,
            "tile": tile.name if tile is not None else "",
            "num_pages": input_pages if role == "input" else output_pages,
            "page_size": shard["page_size"],
            "data_format": DTYPE_TO_FORMAT[shard["dtype"]],
        }
        next_id[role] += 1
        seen[key] = cb
        cbs.append(cb)
        if tile is not None:
            tiles[tile.name] = tile
    cbs.sort(key=lambda cb: cb["id"])
    return cbs, tiles


def retag_buffers(body, buffers: dict, scope: str):
    """``body`` with the given allocated buffers moved to storage scope ``scope``."""
    tirx = tvm.tirx
    remap = {}
    for buf in buffers.values():
        if buf.scope() != scope:
            remap[buf] = tirx.decl_buffer(buf.shape, buf.dtype, buf.name, scope=scope)
    if not remap:
        return body

    def new(buf):
        return remap.get(buf, buf)

    def post(node):
        if isinstance(node, tirx.BufferLoad) and node.buffer in remap:
            return tirx.BufferLoad(new(node.buffer), node.indices)
        if isinstance(node, tirx.BufferStore) and node.buffer in remap:
            return tirx.BufferStore(new(node.buffer), node.value, node.indices)
        if isinstance(node, tirx.AllocBuffer) and node.buffer in remap:
            return tirx.AllocBuffer(new(node.buffer), node.annotations)
        if isinstance(node, tirx.SBlock) and any(b in remap for b in node.alloc_buffers):
            return tirx.SBlock(
                node.iter_vars,
                node.reads,
                node.writes,
                node.name_hint,
                node.body,
                node.init,
                [new(b) for b in node.alloc_buffers],
                node.match_buffers,
                node.annotations,
            )
        return None

    return tirx.stmt_functor.ir_transform(
        body, None, post, ["tirx.BufferLoad", "tirx.BufferStore", "tirx.AllocBuffer", "tirx.SBlock"]
    )


@register_pass(
    "tt.LowerMemorySpace",
    params={
        "input_pages": Param(int, 2, "pages of each input CB (2: the reader runs one tile ahead)"),
        "output_pages": Param(int, 2, "pages of each output CB (2: the writer drains one tile behind)"),
    },
    doc="give DRAM<->core tiles L1 circular buffers (ids, pages, page size) within the L1 budget",
)
def lower_memory_space(ctx: BuildContext, input_pages: int = 2, output_pages: int = 2):
    if input_pages < 1 or output_pages < 1:
        raise common.TTLoweringError(
            f"tt.LowerMemorySpace: pages must be >= 1, got input_pages={input_pages}, output_pages={output_pages}"
        )

    def lower(name, func):
        cbs, tiles = plan_circular_buffers(name, func, input_pages, output_pages)
        common.check_circular_buffers(name, cbs, common.attr(func, common.ARCH), ctx.config.name)
        func = func.with_body(retag_buffers(func.body, tiles, common.CB_SCOPE))
        return func.with_attr(common.CIRCULAR_BUFFERS, cbs)

    return common.module_pass(lower, name="tt.LowerMemorySpace")
