"""tessera.FuseEpilogues / FuseKernels / OutlineKernels (graph phase): the groups travel in the IR."""

from __future__ import annotations

from tvm.script import ir as I  # noqa: E741
from tvm.script import relax as R

from tessera_tvm.graph.outline_kernels import read_kernels
from tessera_tvm.pipeline import ensure_registered
from tessera_tvm.registry import BuildContext, get_pass


def run(name: str, mod):
    ensure_registered()
    return get_pass(name).factory(BuildContext(None, None))(mod)


@I.ir_module
class Linear:
    @R.function
    def k(x: R.Tensor((8, 16), "float32"), w: R.Tensor((16, 4), "float32"), b: R.Tensor((4,), "float32")) -> R.Tensor(
        (8, 4), "float32"
    ):
        with R.dataflow():
            mm = R.matmul(x, w, out_dtype="float32")
            biased = R.add(mm, b)
            act = R.nn.relu(biased)
            total = R.sum(act, axis=[1], keepdims=True)
            out = R.divide(act, total)
            R.output(out)
        return out


def groups(mod) -> list[dict]:
    return [
        {"family": str(g["family"]), "name": str(g["name"]), "bindings": [str(b) for b in g["bindings"]]}
        for g in mod["k"].attrs["tessera.kernel_groups"]
    ]


def test_fuse_epilogues_writes_the_gemm_group_with_its_epilogue():
    mod = run("tessera.FuseEpilogues", Linear)
    assert groups(mod) == [{"family": "gemm", "name": "", "bindings": ["mm", "biased", "act"]}]
    assert list(mod["k"].body.blocks[0].bindings) == list(Linear["k"].body.blocks[0].bindings)  # only the attr


def test_fuse_kernels_adds_the_rest_and_names_every_group():
    mod = run("tessera.FuseKernels", run("tessera.FuseEpilogues", Linear))
    assert groups(mod) == [
        {"family": "gemm", "name": "fused_matmul_add_relu", "bindings": ["mm", "biased", "act"]},
        {"family": "reduce", "name": "sum", "bindings": ["total"]},
        {"family": "elementwise", "name": "div", "bindings": ["out"]},
    ]


def test_without_fuse_epilogues_the_matmul_is_a_kernel_of_its_own():
    mod = run("tessera.FuseKernels", Linear)
    assert [(g["family"], g["bindings"]) for g in groups(mod)] == [
        ("gemm", ["mm"]),
        ("elementwise", ["biased", "act"]),
        ("reduce", ["total"]),
        ("elementwise", ["out"]),
    ]


def test_outline_kernels_calls_one_private_function_per_group_and_reads_back_the_same_groups():
    mod = run("tessera.OutlineKernels", run("tessera.FuseKernels", run("tessera.FuseEpilogues", Linear)))
    calls = [str(b.value.op.name_hint) for b in mod["k"].body.blocks[0].bindings]
    assert calls == ["fused_matmul_add_relu", "sum", "div"]
    assert "tessera.kernel_groups" not in mod["k"].attrs
    assert str(mod["sum"].attrs["tessera.family"]) == "reduce"
    flat, read = read_kernels(mod, "k")
    assert [(g.family, g.name, [n.op for n in g.nodes]) for g in read] == [
        ("gemm", "fused_matmul_add_relu", ["matmul", "add", "nn.relu"]),
        ("reduce", "sum", ["sum"]),
        ("elementwise", "div", ["divide"]),
    ]
    # Each group reads the kernel's parameters or an earlier group's output.
    assert read[0].inputs() == list(flat.params)
    assert read[1].inputs() == [read[0].output] and read[2].inputs() == [read[0].output, read[1].output]
    assert flat.outputs == [read[2].output]
