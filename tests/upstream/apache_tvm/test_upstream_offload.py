"""Tessera offload from upstream apache-tvm 0.27: the user's own TVM partitions through Tessera's
toolchain process, builds what is left with its LLVM, exports one library, and gets numpy's and
torch's results. Run by ``./tessera.sh apache-tvm`` (the main suite runs it through
tests/upstream/test_apache_tvm_venv.py)."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

import tessera_tvm

# isort: split
import tvm
from tvm import relax

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_LIBRARIES = tempfile.TemporaryDirectory(prefix="tessera-upstream-")

#: What these tests leave to upstream's LLVM is built without LLVM's optimisations: the values are the
#: same and the build takes a third of the time (the torch-import value test: 10.3 -> 3.4 s). The relax
#: example's test builds with plain "llvm", the user's default.
LLVM = tvm.target.Target({"kind": "llvm", "opt-level": 0})


def _main(partitioned):
    """The partitioned module built with upstream's own LLVM, exported with Tessera's kernels linked
    in (tessera_tvm.export_library: objects cached, the prelude precompiled; the VM's in-process jit
    compiles every kernel again in one g++ call, 12 s for a LLaMA block against 3 s: the relax
    example's test keeps that path) and loaded; its ``main`` in the VM."""
    library = Path(_LIBRARIES.name) / f"model{len(list(Path(_LIBRARIES.name).iterdir()))}.so"
    tessera_tvm.export_library(tvm.compile(partitioned, LLVM), library, "cpu")
    return relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())["main"]


def _check_against_torch(main, model, x):
    """``main`` (a VM function) on ``x`` equals ``model(x)``; a one-tuple output is unpacked."""
    import torch

    out = main(tvm.runtime.tensor(x.numpy()))
    out = out[0] if not hasattr(out, "numpy") else out
    with torch.no_grad():
        np.testing.assert_allclose(out.numpy(), model(x).numpy(), atol=1e-5)


def test_this_is_upstream_apache_tvm_and_tessera_is_its_upstream_api():
    assert tessera_tvm.UPSTREAM
    assert "tilelang" not in tvm.__file__ and tvm.__version__.startswith("0.27")
    assert hasattr(tvm.relax, "TensorType")  # upstream's renames (TileLang's TVM has TensorStructInfo)


def test_the_relax_examples_block_offloads_builds_with_llvm_exports_and_matches_numpy(tmp_path):
    example = _example("tvm_relax")
    mod, params = example.Block().export_tvm({"forward": {"x": relax.frontend.nn.spec.Tensor([2, 40, 64], "float32")}})
    partitioned, report = tessera_tvm.partition_for_tessera(mod, "cpu")
    ops = sorted(o["ops"] for o in report.offloaded)
    assert ops == ["attention", "layer_norm", "layer_norm", "matmul + add", "matmul + add + add"] + [
        "matmul + add + add",
        "matmul + add + gelu",
    ], report
    assert not {n["op"] for n in report.not_offloaded} & {"R.matmul", "R.nn.layer_norm", "R.nn.attention"}
    executable = tvm.compile(partitioned, "llvm", relax_pipeline=report.relax_pipeline)  # as in TileLang's TVM
    # In process: the VM's jit compiles and links the kernels' sources.
    vm = relax.VirtualMachine(executable, tvm.cpu())
    arrays = example.inputs(params)
    expected = example.reference(arrays[0], {name: a for (name, _), a in zip(params, arrays[1:], strict=True)})
    got = vm["forward"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)
    # Deployed: one library with the kernels linked in, loaded on its own. The toolchain compiles one
    # object per source into the kernel cache: a second export compiles nothing and links the same.
    objects = Path(os.environ.get("TESSERA_CACHE_DIR") or Path.home() / ".cache/tessera/kernels") / "objects"
    library = tmp_path / "block.so"
    assert tessera_tvm.export_library(executable, library, "cpu") == str(library)
    assert example.check(library, params) < 1e-4
    made = sorted(objects.glob("*/*.o"))
    assert made, "no objects in the kernel cache"
    again = tmp_path / "again.so"
    tessera_tvm.export_library(executable, again, "cpu")
    assert sorted(objects.glob("*/*.o")) == made and [p.stat().st_mtime_ns for p in made] == [
        p.stat().st_mtime_ns for p in sorted(objects.glob("*/*.o"))
    ]
    assert example.check(again, params) < 1e-4


@pytest.mark.parametrize("which", ["gpt2", "llama", "mlp"])
def test_a_torch_model_imported_with_upstreams_frontend_matches_torch(which):
    torch = pytest.importorskip("torch")
    models = _example("torch_models")
    torch.manual_seed(0)
    model, x = {
        "gpt2": (models.Gpt2Block(), torch.randn(2, 24, 48)),
        "llama": (models.LlamaBlock(), torch.randn(2, 16, 64)),
        "mlp": (models.Mlp(), torch.randn(32, 64)),
    }[which]
    model = model.eval()
    mod = models.import_model(model, x)  # upstream's from_exported_program at its defaults; weights as constants
    partitioned, report = tessera_tvm.partition_for_tessera(mod, "cpu")
    assert not {n["op"] for n in report.not_offloaded} & {"R.matmul", "R.nn.softmax"}, report
    _check_against_torch(_main(partitioned), model, x)


def test_a_model_exported_with_a_dynamic_sequence_length_offloads_and_matches_torch_at_any_length():
    torch = pytest.importorskip("torch")
    models = _example("torch_models")
    torch.manual_seed(0)
    model = models.Gpt2Block().eval()
    mod = models.import_model(model, torch.randn(2, 24, 48), dynamic_axis=1)  # upstream's frontend, S symbolic
    partitioned, report = tessera_tvm.partition_for_tessera(mod, "cpu")
    assert [o["family"] for o in report.offloaded].count("attention") == 1, report
    assert not {n["op"] for n in report.not_offloaded} & {"R.matmul", "R.nn.softmax"}, report
    main = _main(partitioned)
    for length in (3, 70):
        _check_against_torch(main, model, torch.randn(2, length, 48))


def test_a_resnet_block_offloads_its_convolutions_and_matches_torch():
    torch = pytest.importorskip("torch")
    models = _example("torch_models")
    torch.manual_seed(0)
    model, x = models.BasicBlock(8).eval(), torch.randn(2, 8, 10, 10)
    partitioned, report = tessera_tvm.partition_for_tessera(models.import_model(model, x), "cpu")
    # The batch norms are folded on the upstream side, before the weights travel as parameters:
    # both convolutions carry their norm as a bias, and nothing is left to upstream's LLVM.
    assert report.folded == {"batch_norm": 2}, report
    assert sorted(o["ops"] for o in report.offloaded) == ["conv2d + add + add + relu", "conv2d + add + relu"], report
    assert report.not_offloaded == [], report
    assert "folded into the convolution before them: 2 batch_norm" in str(report)
    _check_against_torch(_main(partitioned), model, x)


def test_a_mobilenet_v2_block_with_relu6_offloads_and_matches_torch():
    torch = pytest.importorskip("torch")
    models = _example("torch_models")
    torch.manual_seed(1)
    model, x = models.InvertedResidual(8).eval(), torch.randn(1, 8, 12, 12)
    partitioned, report = tessera_tvm.partition_for_tessera(models.import_model(model, x), "cpu")
    # Each norm folded into its convolution; ReLU6 (R.clip) and the residual add are their epilogues.
    ops = sorted(o["ops"] for o in report.offloaded)
    assert ops == ["conv2d + add + add", "conv2d + add + clip", "conv2d + add + clip"], report
    assert report.folded == {"batch_norm": 3} and report.not_offloaded == [], report
    _check_against_torch(_main(partitioned), model, x)


def test_the_last_step_of_a_gru_read_with_a_negative_index_matches_torch():
    # apache-tvm 0.27 imports y[:, -1] as R.take(y, -1, mode="fast"), which reads before the axis:
    # on its own it is wrong by ~1e27. The toolchain's partition puts the index right.
    torch = pytest.importorskip("torch")

    class GruClassifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = torch.nn.GRU(16, 32, batch_first=True)
            self.head = torch.nn.Linear(32, 5)

        def forward(self, x):
            y, _ = self.gru(x)
            return self.head(y[:, -1])

    torch.manual_seed(0)
    model, x = GruClassifier().eval(), torch.randn(3, 7, 16)
    mod = _example("torch_models").import_model(model, x)
    partitioned, report = tessera_tvm.partition_for_tessera(mod, "cpu")
    assert report.fixed["take with a negative index"] >= 1, report
    _check_against_torch(_main(partitioned), model, x)


def test_an_out_of_range_token_id_raises_index_error_in_upstreams_build():
    # apache-tvm 0.27 imports nn.Embedding as R.take(..., mode="fast") after casting the ids to int32:
    # id 10**8 crashed the process, 2**32 + 1 read row 1. The partition adds a check (IndexError).
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class Lookup(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(16, 4)

        def forward(self, ids, x, where):
            return self.embed(ids), x.gather(1, where)

    torch.manual_seed(0)
    model = Lookup().eval()
    ids, x, where = torch.tensor([[1, 15, -1]]), torch.randn(4, 8), torch.tensor([[1], [7], [0], [3]])
    mod = from_exported_program(torch.export.export(model, (ids, x, where)), keep_params_as_input=False)
    partitioned, report = tessera_tvm.partition_for_tessera(mod, "cpu")
    assert report.checked == {"take": 1, "gather_elements": 1}, report
    main = _main(partitioned)
    with torch.no_grad():
        expected = [t.numpy() for t in model(torch.tensor([[1, 15, 0]]), x, where)]
    got = main(*(tvm.runtime.tensor(t) for t in (np.array([[1, 15, 0]]), x.numpy(), where.numpy())))
    for out, want in zip(got, expected, strict=True):
        np.testing.assert_allclose(out.numpy(), want, atol=1e-6)
    for bad in (16, 2**32 + 1, 10**8):
        with pytest.raises(IndexError, match=r"R\.take of a tensor of shape \(16, 4\) along axis 0"):
            main(*(tvm.runtime.tensor(t) for t in (np.array([[1, 2, bad]]), x.numpy(), where.numpy())))
    with pytest.raises(IndexError, match=r"R\.gather_elements .* every index must be in \[0, 8\)"):
        main(*(tvm.runtime.tensor(t) for t in (np.array([[1, 2, 3]]), x.numpy(), where.numpy() + 5)))


def test_a_missing_toolchain_is_a_clear_error(monkeypatch):
    from tessera_tvm.upstream import Toolchain

    monkeypatch.setenv("TESSERA_TOOLCHAIN_PYTHON", "/nonexistent/bin/python")
    with pytest.raises(tessera_tvm.ToolchainProcessError, match="TESSERA_TOOLCHAIN_PYTHON=/nonexistent"):
        Toolchain()


def test_bad_input_gets_a_clear_error_and_leaves_the_toolchain_serving():
    with pytest.raises(tessera_tvm.TesseraError, match="tvm.IRModule"):
        tessera_tvm.partition_for_tessera("not a module", "cpu")
    mod = tvm.IRModule()
    with pytest.raises(tessera_tvm.ToolchainProcessError, match="no_such_config"):
        tessera_tvm.partition_for_tessera(mod, "no_such_config")
    # The toolchain answered the error and still serves.
    assert tessera_tvm.upstream.shared_toolchain().request({"op": "hello"})["protocol"] == 1


def test_a_model_exported_with_a_dynamic_batch_offloads_and_runs_at_any_batch():
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    models = _example("torch_models")
    torch.manual_seed(0)
    model, x = models.Gpt2Block().eval(), torch.randn(2, 24, 48)
    batch = torch.export.Dim("batch", min=1, max=128)
    exported = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
    mod = from_exported_program(exported, keep_params_as_input=False)
    partitioned, report = tessera_tvm.partition_for_tessera(mod, "cpu")
    assert len(report.offloaded) == 7 and all(o["dynamic"] for o in report.offloaded), report
    main = _main(partitioned)
    for size in (1, 5, 70):
        _check_against_torch(main, model, torch.randn(size, 24, 48))


def test_a_config_yaml_path_relative_to_the_users_directory_reaches_the_toolchain(tmp_path, monkeypatch):
    source = Path(__file__).resolve().parents[3] / "configs" / "cpu.yaml"
    (tmp_path / "my_cpu.yaml").write_text(source.read_text().replace("name: cpu", "name: my_cpu", 1))
    monkeypatch.chdir(tmp_path)  # the toolchain runs in the checkout, not here
    mod = tvm.script.from_source(
        """
# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((8, 16), dtype="float32"), w: R.Tensor((16, 4), dtype="float32")) -> R.Tensor((8, 4), dtype="float32"):
        with R.dataflow():
            gv = R.matmul(x, w)
            R.output(gv)
        return gv
"""
    )
    _, report = tessera_tvm.partition_for_tessera(mod, "my_cpu.yaml")
    assert report.config == "my_cpu" and [o["ops"] for o in report.offloaded] == ["matmul"]


_MLP_SOFTMAX = """
# from tvm.script import ir as I
# from tvm.script import relax as R
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((128, 64), dtype="float32"), w: R.Tensor((64, 32), dtype="float32"), b: R.Tensor((32,), dtype="float32")) -> R.Tensor((128, 32), dtype="float32"):
        with R.dataflow():
            lv = R.matmul(x, w)
            lv1 = R.add(lv, b)
            lv2 = R.nn.gelu(lv1)
            gv = R.nn.softmax(lv2, axis=-1)
            R.output(gv)
        return gv
"""  # noqa: E501


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the toolchain needs nvcc to build the kernels' cubins")
def test_a_gpu_config_builds_for_cuda_and_exports_one_library_whose_vm_calls_the_tessera_kernels(tmp_path):
    with pytest.warns(UserWarning, match="has no CUDA runtime"):
        partitioned, report = tessera_tvm.partition_for_tessera(tvm.script.from_source(_MLP_SOFTMAX), "hopper")
    assert report.kernels == ["tessera_matmul_add_gelu", "tessera_softmax"] and not report.not_offloaded
    executable = tvm.compile(partitioned, tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm"))
    library = tmp_path / "model.so"
    executable.export_library(str(library), options=tessera_tvm.export_options("hopper"))
    for kernel in report.kernels:  # linked in, as the library's own exported entries
        assert hasattr(ctypes.CDLL(str(library)), f"__tvm_ffi_{kernel}")
    # This apache-tvm (PyPI) has no CUDA runtime, so no VM holds CUDA tensors here. On the CPU the VM
    # reaches the first kernel's entry, which refuses host memory by name before it touches a driver.
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    arrays = [tvm.runtime.tensor(np.zeros(s, np.float32)) for s in ((128, 64), (64, 32), (32,))]
    with pytest.raises(
        ValueError, match="tessera_matmul_add_gelu: argument A is on device type 1; this library runs on"
    ):
        vm["main"](*arrays)


@pytest.mark.parametrize("decompose", [True, False], ids=["decomposed", "not decomposed"])
def test_apache_tvms_torch_import_gives_torchs_dtypes_and_values(decompose):
    # The same mistakes as TileLang's frontend (tessera_tvm/frontend_fixes.py), put right by
    # `import tessera_tvm` here too; built with upstream's LLVM alone, so only the import is checked.
    pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    from tests.torch_import_cases import exported_cases, wrong_types, wrong_values

    program, (x, i), expected = exported_cases()
    mod = from_exported_program(program, keep_params_as_input=False, run_ep_decomposition=decompose)
    func = mod["main"]
    types = (getattr(func, "ret_struct_info", None) or func.ret_ty).fields
    assert not wrong_types(types, expected)
    main = relax.VirtualMachine(tvm.compile(mod, LLVM), tvm.cpu())["main"]
    got = [t.numpy() for t in main(tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(i.numpy()))]
    assert not wrong_values(got, expected)


def test_apache_tvms_torch_import_names_an_op_it_cannot_take_and_the_users_line():
    # It stopped with its own "AssertionError: Unsupported function types ['lgamma.default']".
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    class NoConverter(torch.nn.Module):
        def forward(self, x):
            return torch.lgamma(x)

    program = torch.export.export(NoConverter(), (torch.rand(2, 3),))
    with pytest.raises(tessera_tvm.TesseraError, match=r"aten\.lgamma\.default \(File .*test_upstream_offload\.py"):
        from_exported_program(program)


def test_a_resnet_block_imported_without_decomposition_folds_its_norms_and_matches_torch():
    # apache-tvm read aten.batch_norm's arguments as _native_batch_norm_legit's: every norm ran in
    # training mode with eps 0.1 (a silently wrong ResNet).
    torch = pytest.importorskip("torch")
    models = _example("torch_models")
    torch.manual_seed(0)
    model, x = models.BasicBlock(8).eval(), torch.randn(2, 8, 10, 10)
    with torch.no_grad():
        for norm in (model.bn1, model.bn2):
            norm.running_mean.uniform_(-1, 1)
            norm.running_var.uniform_(0.5, 2)
    mod = models.import_model(model, x, run_ep_decomposition=False)
    partitioned, report = tessera_tvm.partition_for_tessera(mod, "cpu")
    assert report.folded == {"batch_norm": 2}, report
    _check_against_torch(_main(partitioned), model, x)
