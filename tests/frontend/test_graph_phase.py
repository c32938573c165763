"""The graph phase: registered Relax passes, listed by configs, controlled by PassContext."""

from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops
from tessera.cli import main
from tessera_tvm import ConfigError, TesseraError
from tessera_tvm._tvm import tvm
from tessera_tvm.config import load_config
from tessera_tvm.graph import graph_pass_names
from tests.pipeline.test_pass_context import _Names

from .helpers import assert_close, random_array

SHARED = [
    "relax.CanonicalizeBindings",
    "tessera.Simplify",
    "relax.DeadCodeElimination",
    "tessera.InsertCollectives",
    "tessera.FuseEpilogues",
    "tessera.FuseKernels",
    "tessera.OutlineKernels",
]


@ts.kernel
def mlp(x: Tensor["M", "K", ts.f32], w: Tensor["K", "N", ts.f32], b: Tensor["N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.softmax(ops.relu(ops.matmul(x, w) + b))


SHAPES = {"M": 24, "K": 16, "N": 40}


def families(graph) -> list[tuple[str, str]]:
    return [(g.family, g.describe()) for g in graph.groups]


def test_every_config_lists_the_shared_graph_phase():
    assert graph_pass_names() == SHARED
    for name in ("cpu", "hopper", "ampere", "rocm"):
        assert graph_pass_names(name) == SHARED, name
    # Tenstorrent first decomposes softmax and the norms into what it lowers, then runs the shared list.
    assert graph_pass_names("tenstorrent") == ["tessera.DecomposeRowOps", *SHARED]


def test_tessera_passes_prints_the_graph_phase_first(capsys):
    assert main(["passes", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    graph = out[out.index("[Graph]") : out.index("[LowerAndLegalize]")]
    assert graph.splitlines()[0] == "[Graph]  # 7 passes" and graph.split()[4:] == SHARED


def test_tessera_passes_list_says_what_each_pass_transforms(capsys):
    assert main(["passes", "--list"]) == 0
    lines = {line.split("(")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "[relax]" in lines["tessera.FuseEpilogues"] and "[relax]" in lines["relax.DeadCodeElimination"]
    assert "[tir]" in lines["tl.LayoutInference"]


def test_the_pass_log_holds_each_graph_pass_with_what_it_did():
    graph = mlp.graph(SHAPES, target="cpu")
    assert [(r.phase, r.name) for r in graph.records] == [("graph", n) for n in SHARED]
    status = {r.name: r.status for r in graph.records}
    assert status["tessera.FuseEpilogues"] == "ran (1 kernel)"
    assert status["tessera.FuseKernels"] == "ran (+1, 2 kernels in all)"


def test_instruments_see_the_graph_passes_in_order():
    rec = _Names()
    with tvm.transform.PassContext(instruments=[rec]):
        mlp.graph(SHAPES, target="cpu")
    assert "tessera.Graph" in rec.names
    assert [n for n in dict.fromkeys(rec.names) if n in SHARED] == SHARED  # (each also names its inner pass)


def test_disabling_fuse_epilogues_leaves_the_epilogue_to_element_wise_kernels():
    fused = families(mlp.graph(SHAPES, target="cpu"))
    assert fused == [("gemm", "matmul + add + relu"), ("softmax", "softmax")]
    with tvm.transform.PassContext(disabled_pass=["tessera.FuseEpilogues"]):
        unfused = mlp.graph(SHAPES, target="cpu")
    assert families(unfused) == [("gemm", "matmul"), ("elementwise", "add + relu"), ("softmax", "softmax")]
    assert "tessera.FuseEpilogues" not in [r.name for r in unfused.records]
    assert families(mlp.graph(SHAPES, target="cpu")) == fused  # the PassContext is part of the cache key


def test_an_unfused_compile_computes_the_same_result():
    rng = np.random.default_rng(0)
    x, w, b = (random_array(rng, s, ts.f32) for s in ((24, 16), (16, 40), (40,)))
    with tvm.transform.PassContext(disabled_pass=["tessera.FuseEpilogues"]):
        unfused = ts.compile(mlp, target="cpu", shapes=SHAPES)
    assert [dk.name for dk in unfused.device_kernels] == ["matmul", "fused_add_relu", "softmax"]
    assert_close(unfused(x, w, b), mlp.reference(x, w, b), ts.f32)


def test_disabling_fuse_kernels_is_a_clear_error():
    with tvm.transform.PassContext(disabled_pass=["tessera.FuseKernels"]):
        with pytest.raises(TesseraError, match=r"out = nn.softmax belong\(s\) to no kernel group; tessera.FuseKernels"):
            mlp.graph(SHAPES, target="cpu")
    with tvm.transform.PassContext(disabled_pass=["tessera.FuseKernels", "tessera.FuseEpilogues"]):
        with pytest.raises(TesseraError, match=r"no kernel groups to outline"):
            mlp.graph(SHAPES, target="cpu")


def test_without_outlining_the_groups_come_from_the_ir():
    with tvm.transform.PassContext(disabled_pass=["tessera.OutlineKernels"]):
        graph = mlp.graph(SHAPES, target="cpu")
    assert families(graph) == [("gemm", "matmul + add + relu"), ("softmax", "softmax")]
    assert '"tessera.kernel_groups"' in graph.text()


def _config_with_graph(tmp_path, graph: str):
    text = open(load_config("cpu").source).read().replace("  graph: shared", f"  graph: {graph}", 1)
    path = tmp_path / "cpu_variant.yaml"
    path.write_text(text.replace("name: cpu", "name: cpu_variant", 1))
    return path


def test_a_config_takes_a_prefix_of_the_shared_graph_list(tmp_path):
    path = _config_with_graph(
        tmp_path, "[{shared: true, until: tessera.FuseEpilogues}, tessera.FuseKernels, tessera.OutlineKernels]"
    )
    assert graph_pass_names(path) == [*SHARED[:4], "tessera.FuseKernels", "tessera.OutlineKernels"]
    assert [g.family for g in mlp.graph(SHAPES, target=path).groups] == ["gemm", "elementwise", "softmax"]


def test_a_tir_pass_in_the_graph_phase_is_a_config_error(tmp_path):
    path = _config_with_graph(tmp_path, "[tessera.Simplify, tl.LayoutInference]")
    with pytest.raises(ConfigError, match=r"cpu_variant.yaml.*pipeline.graph\[1\].*transforms TIR.*Graph phase"):
        load_config(path)


def test_a_relax_pass_in_a_tir_phase_is_a_config_error(tmp_path):
    text = open(load_config("cpu").source).read().replace("    - tl.LowerIntrin\n", "    - tessera.FuseKernels\n")
    path = tmp_path / "cpu_variant.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"pipeline.codegen_prep\[\d\].*transforms RELAX.*belongs in graph"):
        load_config(path)
