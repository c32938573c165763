"""Tenstorrent code generation: annotated TT IR -> reader/compute/writer kernels, host program, plan.

Input: a module lowered by ``configs/tenstorrent.yaml`` (its PrimFunc carries the ``tt.*``
annotations of ``tessera_tvm.target.tt.transform``). The generator reads only those annotations and the
loop structure around them; it matches no patterns and re-derives no schedule. Output, written
against tt-metal v0.62.2 (``TT_METAL_VERSION``):

    reader.cpp    data movement: DRAM tiles -> input circular buffers     (RISCV_1)
    compute.cpp   the Tensix math: matmul / binary / SFPU ops per tile      (compute)
    writer.cpp    data movement: output circular buffers -> DRAM tiles    (RISCV_0)
    main.cpp      host program: buffers, CBs, kernels, per-core runtime args, run, read back
    tt.plan.json  the plan (plan.schema.json): what main.cpp does, as data; ``run_plan`` executes it

    program = generate(lowered_module)
    program.files["compute.cpp"]; program.plan; program.write(out_dir)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tessera_tvm.target.tt import TT_METAL_VERSION

from ...codegen import kernel_name
from .. import ir
from .cexpr import CodegenError
from .host import render_host
from .kernels import kernel_info, render_kernels
from .plan import KERNEL_FILES, build_plan

__all__ = ["TTProgram", "generate", "CodegenError", "ARTIFACT_FILES", "TT_METAL_VERSION"]

#: Artifact key -> file name (the keys of ``LoweredModule.artifacts`` for Tenstorrent configs).
ARTIFACT_FILES = {**{role: name for role, name in KERNEL_FILES.items()}, "host": "main.cpp", "plan": "tt.plan.json"}


@dataclass
class TTProgram:
    """The five artifacts of one Tenstorrent kernel."""

    name: str
    reader: str
    compute: str
    writer: str
    host: str
    plan: dict
    metadata: dict = field(default_factory=dict)

    @property
    def plan_json(self) -> str:
        return json.dumps(self.plan, indent=2) + "\n"

    @property
    def files(self) -> dict[str, str]:
        """File name -> text, for the five artifacts."""
        texts = {
            "reader": self.reader,
            "compute": self.compute,
            "writer": self.writer,
            "host": self.host,
            "plan": self.plan_json,
        }
        return {ARTIFACT_FILES[key]: text for key, text in texts.items()}

    @property
    def source(self) -> str:
        """The three device kernels in one text (reader, compute, writer), each under a banner."""
        parts = []
        for role in ("reader", "compute", "writer"):
            parts.append(f"// ===== {KERNEL_FILES[role]} =====\n{getattr(self, role)}")
        return "\n".join(parts)

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write the five files into ``out_dir``; returns artifact key -> path."""
        from tessera_tvm.target.toolchain import write_text_atomic

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        texts = {
            "reader": self.reader,
            "compute": self.compute,
            "writer": self.writer,
            "host": self.host,
            "plan": self.plan_json,
        }
        paths = {}
        for key, text in texts.items():
            paths[key] = out / ARTIFACT_FILES[key]
            write_text_atomic(paths[key], text)
        return paths


def _epilogue(info) -> list[str] | None:
    """What the compute kernel applies to a matmul result, from the tt.compute ops (None: no matmul)."""
    from .kernels import annotations

    nodes = annotations(info.loop.body, ir.COMPUTE)
    first = next((k for k, node in enumerate(nodes) if node["tile_op"] == "matmul"), None)
    if first is None:
        return None
    kinds: list[str] = []
    for node in nodes[first + 1 :]:
        for op in node["ops"]:
            if op["op"] == "binary":
                kind = "bias" if op["bcast"] == "rows" and op["fn"] == "add" else op["fn"]
            elif op["op"] == "sfpu":
                kind = "gelu" if op["fn"].startswith("gelu") else op["fn"]
                kind = f"{op['mode']}_scalar" if kind == "binop_scalar" else kind
            else:
                continue
            if kind not in kinds:
                kinds.append(kind)
    return kinds


def _metadata(info, plan: dict) -> dict:
    func = info.func
    tile_info = ir.attr(func, "tessera.tile_info", {}) or {}
    epilogue = _epilogue(info)
    cbs = plan["circular_buffers"]
    return {
        "name": info.name,
        "tile": dict(tile_info.get("tile", {})),
        "fragments": {k: tile_info[k] for k in ("dtype_in", "dtype_acc") if k in tile_info},
        "resources": {
            "l1_bytes_per_core": sum(cb["num_pages"] * cb["page_size"] for cb in cbs),
            "circular_buffers": len(cbs),
        },
        "launch": {
            "arch": plan["arch"],
            "grid": plan["grid"],
            "cores": len(plan["cores"]),
            "tiles": plan["schedule"]["total_tiles"],
        },
        "epilogue": epilogue if epilogue is not None else list(tile_info.get("epilogue", [])),
    }


def generate(mod) -> TTProgram:
    """The artifacts of the one Tenstorrent kernel in ``mod`` (lowered with the tenstorrent config)."""
    funcs = list(ir.prim_funcs(mod))
    if len(funcs) != 1:
        names = [str(gv.name_hint) for gv, _ in funcs]
        raise CodegenError(f"the Tenstorrent code generator expects one kernel per module, found {names}")
    gv, func = funcs[0]
    info = kernel_info(kernel_name(gv, func), func)
    kernels = render_kernels(info)
    plan = build_plan(info)
    return TTProgram(
        name=info.name,
        reader=kernels["reader"],
        compute=kernels["compute"],
        writer=kernels["writer"],
        host=render_host(plan),
        plan=plan,
        metadata=_metadata(info, plan),
    )
