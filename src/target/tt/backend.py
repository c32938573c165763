"""The Tenstorrent backend's manifest (codegen kind ``tt``; TVM target kind ``c``): 32x32 tile programs
and the five tt-metal artifacts of every kernel (reader, compute, writer, host, plan).

No toolchain runs here: the artifacts build against a tt-metal install, and the emulator
(:mod:`tessera_tvm.target.tt.emulate`) runs a plan on request, not a compiled kernel's calls.
"""

from __future__ import annotations

from ..backend import Backend, register_backend

TT = register_backend(
    Backend(
        kind="tt",
        tvm_kind="c",
        title="Tenstorrent",
        section="tt",
        parse_section="tessera_tvm.target.tt.config:parse_section",
        source_suffix=".tt.cpp",
        device="tenstorrent",
        thread_blocks=False,
        # One generator for every family: it builds GEMM and element-wise kernels and names what it refuses.
        tile_programs=dict.fromkeys(
            ("gemm", "elementwise", "reduce", "softmax", "norm", "attention"),
            "tessera_tvm.target.tt.tile_programs:tt_program",
        ),
        # One fixed 32x32 schedule: no program reads a field, nothing to choose.
        program_fields=dict.fromkeys(("gemm", "elementwise", "reduce", "softmax", "norm", "attention"), ()),
        default_config="tenstorrent",
        fixed_schedule="tessera_tvm.target.tt.tile_programs:TT_SCHEDULE",
        passes="tessera_tvm.target.tt.transform",  # tt.ApplyTTDefaults ... tt.VerifyTTIR
        program_generator="tessera_tvm.target.tt.codegen:generate",
        program_files=("reader", "compute", "writer", "host", "plan"),
        runner_hook="tessera_tvm.target.tt.runner:EMULATOR_RUNNER",
        block_note="tessera_tvm.target.tt.runner:block_note",
        not_runnable=(
            " (Tenstorrent); its kernels do not run in this process: the reader/compute/writer/host/plan files "
            "are the result (.artifacts; tessera_tvm.target.tt.emulate.run_plan runs a plan)"
        ),
        tuning_refused="Tenstorrent kernels have fixed 32x32 tiles; there is no schedule to tune",
        # sqrt and 1/x run on the SFPU; rsqrt, sigmoid (1 / (1 + exp(-x))) and silu (x * sigmoid) compose
        # them. No tanh, abs, log, max, min or pow (no clip: max_scalar/min_scalar) yet.
        unary_ops=("exp", "relu", "gelu_erf", "gelu_tanh", "sqrt", "rsqrt", "sigmoid", "silu", "neg", "cast"),
        binary_ops=("add", "sub", "mul", "div"),  # of tiles, and with a scalar (binop_with_scalar on the SFPU)
        epilogue_ops=(
            *("bias", "residual", "gate", "scale", "add_scalar"),
            *("relu", "gelu_erf", "gelu_tanh", "exp", "sigmoid", "silu", "cast"),
        ),
        # Rows reduced in 32x32 tiles: softmax and the norms run as reductions and element-wise kernels.
        decomposed_anchors=("softmax", "layer_norm", "rms_norm"),
        relax_refused=(
            "(Tenstorrent) cannot be used from Relax: its kernels are tt-metal programs (reader/compute/writer "
            "+ host), not TVM runtime modules. Use tessera_tvm.lower(program, 'tenstorrent') for them."
        ),
    )
)
