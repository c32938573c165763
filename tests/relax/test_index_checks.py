"""Indices read from data are checked before TVM reads memory with them (tessera_tvm/relax/
index_checks.py): a token id past an ``nn.Embedding``'s table crashed the process (SIGSEGV) or read
other memory into the result, and an int64 id of 2**32 + 1 was cast to int32 first and read row 1.

One module holds every kind of lookup users write; it is built once per import route, run with valid
inputs (torch's values) and then with one bad index at a time. The bad values here are chosen to
read near the table (or to wrap through the int32 cast) rather than crash, so that a missing check
fails the test instead of killing the worker.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tessera_tvm
from tessera_tvm.errors import TesseraError
from tessera_tvm.relax import build, partition_for_tessera
from tessera_tvm.relax.index_checks import CHECK_ATTR, check_indices

from .models import module_sources

from_exported_program = pytest.importorskip("tvm.relax.frontend.torch").from_exported_program

ROUTES = pytest.mark.parametrize("decompose", [True, False], ids=["decomposed", "not decomposed"])
VOCAB, ROWS, COLS = 16, 4, 8


class Lookups(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 4)

    def forward(self, ids, x, picked, rows, cols, where, targets):
        return (
            self.embed(ids),  # R.take, after a cast of the ids to int32
            x.index_select(0, picked),  # R.take
            x[rows],  # R.take; negative rows count from the end
            x[:, cols],  # R.take on axis 1
            x.gather(1, where),  # R.gather_elements
            x.scatter(1, where, 1.0),  # R.scatter_elements
            F.cross_entropy(x, targets),  # R.nn.nll_loss, or a gather after the decomposition
        )


def _inputs():
    torch.manual_seed(0)
    return (
        torch.tensor([[1, 15, 0]]),
        torch.randn(ROWS, COLS),
        torch.tensor([3, 0]),
        torch.tensor([-1, 2]),
        torch.tensor([7, -8, 1]),
        torch.tensor([[1], [7], [0], [3]]),
        torch.tensor([1, -100, 7, 0]),  # -100: cross_entropy's ignore_index
    )


#: (input, position in it, a bad value, the op the error names). A little past the end, an id that
#: int32 wraps to 1, and below the negative range.
BAD = [
    ("ids", (0, 2), VOCAB, r"R\.take of a tensor of shape \(16, 4\) along axis 0"),
    ("ids", (0, 2), 2**32 + 1, r"R\.take of a tensor of shape \(16, 4\) along axis 0"),
    ("ids", (0, 0), -VOCAB - 1, r"R.take .* every index must be in \[-16, 16\)"),
    ("picked", (1,), ROWS, r"R\.take of a tensor of shape \(4, 8\) along axis 0"),
    ("rows", (0,), -ROWS - 1, r"R\.take of a tensor of shape \(4, 8\) along axis 0"),
    ("cols", (2,), COLS, r"R\.take of a tensor of shape \(4, 8\) along axis 1"),
    ("where", (1, 0), COLS, r"R\.(gather|scatter)_elements .* every index must be in \[0, 8\)"),
    ("where", (2, 0), -1, r"R\.(gather|scatter)_elements"),
    ("targets", (3,), COLS, r"R\.(nn\.nll_loss|gather_elements)"),
]
NAMES = ["ids", "x", "picked", "rows", "cols", "where", "targets"]


@pytest.fixture(scope="module", params=[True, False], ids=["decomposed", "not decomposed"])
def built(request):
    model = Lookups().eval()
    program = torch.export.export(model, _inputs())
    mod = from_exported_program(program, keep_params_as_input=False, run_ep_decomposition=request.param)
    return model, build(mod, "cpu")


def test_valid_indices_give_torchs_values(built):
    model, module = built
    inputs = _inputs()
    with torch.no_grad():
        expected = model(*inputs)
    got = module.run("main", *(t.numpy() for t in inputs))
    for i, (out, want) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(np.asarray(out), want.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"output {i}")


@pytest.mark.parametrize("name, at, value, names", BAD, ids=[f"{b[0]}={b[2]}" for b in BAD])
def test_an_out_of_range_index_raises_index_error_naming_the_op(built, name, at, value, names):
    _, module = built
    inputs = [t.numpy().copy() for t in _inputs()]
    inputs[NAMES.index(name)][at] = value
    with pytest.raises(IndexError, match=names):
        module.run("main", *inputs)


def test_the_report_lists_the_checks_and_a_second_partition_adds_none():
    model = Lookups().eval()
    mod = from_exported_program(torch.export.export(model, _inputs()), keep_params_as_input=False)
    partitioned, report = partition_for_tessera(mod, "cpu")
    assert report.checked == {"take": 4, "gather_elements": 2, "scatter_elements": 1}, report.checked
    assert "indices checked at run time: 4 take, 2 gather_elements, 1 scatter_elements" in str(report)
    assert report.as_dict()["checked"] == report.checked

    def checks(m):
        return [gv for gv, f in m.functions.items() if f.attrs is not None and CHECK_ATTR in f.attrs]

    again, counts = check_indices(partitioned)
    assert counts == {} and len(checks(again)) == len(checks(partitioned)) > 0


def test_an_axis_of_symbolic_size_is_checked_against_its_size_at_run_time():
    class Last(nn.Module):
        def forward(self, x, i):
            return x[i]

    batch = torch.export.Dim("batch", min=2, max=64)
    x, i = torch.randn(5, 3), torch.tensor([0, -1, 4])
    program = torch.export.export(Last(), (x, i), dynamic_shapes=({0: batch}, None))
    module = build(from_exported_program(program), "cpu")
    for rows in (5, 9):
        x = torch.randn(rows, 3)
        np.testing.assert_array_equal(np.asarray(module.run("main", x.numpy(), i.numpy())[0]), x[i].numpy())
    with pytest.raises(IndexError, match=r"every index must be in \[-n, n\)"):
        module.run("main", torch.randn(4, 3).numpy(), i.numpy())  # 4 is past 4 rows


def test_x_at_two_index_tensors_picks_pairs_and_checks_each_against_its_axis():
    class Pairs(nn.Module):
        def forward(self, x, i, j):
            return x[i, j]

    x, i, j = torch.randn(ROWS, COLS), torch.tensor([1, -1, 3]), torch.tensor([0, 7, -8])
    module = build(from_exported_program(torch.export.export(Pairs(), (x, i, j))), "cpu")
    assert module.report.checked == {"index_tensor": 2}
    (got,) = module.run("main", x.numpy(), i.numpy(), j.numpy())
    np.testing.assert_array_equal(got, x[i, j].numpy())  # [3], the pairs (was [3, 3], an outer product)
    for bad_i, bad_j, axis in (([1, 4, 0], [0, 1, 2], 0), ([1, 2, 0], [0, 8, 2], 1), ([0, 0, 0], [-9, 0, 0], 1)):
        with pytest.raises(IndexError, match=rf"R\.index_tensor .* the index for axis {axis}"):
            module.run("main", x.numpy(), np.array(bad_i), np.array(bad_j))


def _take_module(indices, mode: str = "fast"):
    relax = tessera_tvm._tvm.tvm.relax
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorStructInfo((VOCAB, 4), "float32"))
    i = relax.Var("i", relax.TensorStructInfo((3,), "int64"))
    with bb.function("main", [x, i]):
        with bb.dataflow():
            index = indices if indices is not None else i
            out = bb.emit_output(relax.op.take(x, index, axis=0, mode=mode))
        bb.emit_func_output(out)
    return bb.get()


def test_a_constant_index_out_of_range_is_an_error_at_partition_time():
    relax = tessera_tvm._tvm.tvm.relax
    bad = relax.const(np.array([1, VOCAB + 3, 2]), "int64")
    with pytest.raises(TesseraError, match=r"R\.take .* in function 'main'.*constant index 19 is out of range"):
        partition_for_tessera(_take_module(bad), "cpu")
    fine = relax.const(np.array([1, VOCAB - 1, 2]), "int64")
    _, report = partition_for_tessera(_take_module(fine), "cpu")
    assert report.checked == {}


def test_a_take_that_clips_or_wraps_cannot_read_out_of_range_and_is_left_alone():
    for mode in ("clip", "wrap"):
        _, counts = check_indices(_take_module(None, mode))
        assert counts == {}, mode
    _, counts = check_indices(_take_module(None))
    assert counts == {"take": 1}


@pytest.fixture(scope="module")
def built_for_hopper():
    """The lookups built for Hopper. Before, its scatter_elements (written by TVM as CPU loops) and the
    loss's scalar division (which TVM's GPU schedules leave unbound) stopped the build with "Variable
    ... is directly accessed by host memory. Did you forget to bind?"."""
    model = Lookups().eval()
    return model, build(from_exported_program(torch.export.export(model, _inputs())), "hopper")


@pytest.mark.nvcc
def test_on_a_gpu_config_the_check_prints_and_traps_in_the_kernel(built_for_hopper):
    """CUDA kernels cannot raise: the check prints its message and traps."""
    _, module = built_for_hopper
    assert module.report.checked == {"take": 4, "gather_elements": 2, "scatter_elements": 1}
    source = "\n".join(module_sources(module.executable.mod))
    assert len(re.findall(r'printf\("Tessera: index out of range: R\.take', source)) == 3  # one per distinct check
    assert "__trap();" in source


@pytest.mark.gpu
def test_on_the_gpu_valid_indices_give_torchs_values(built_for_hopper):
    model, module = built_for_hopper
    tvm = tessera_tvm._tvm.tvm
    inputs = _inputs()
    with torch.no_grad():
        expected = model(*inputs)
    got = module.vm(tvm.cuda())["main"](*(tvm.runtime.from_dlpack(t.cuda()) for t in inputs))
    for i, (out, want) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"output {i}")


_TRAPPED = """
import sys, torch, tessera_tvm
from tests.relax.test_index_checks import Lookups, _inputs, from_exported_program
from tessera_tvm.relax import build
tvm = tessera_tvm._tvm.tvm
module = build(from_exported_program(torch.export.export(Lookups().eval(), _inputs())), "hopper")
inputs = list(_inputs())
inputs[0] = torch.tensor([[1, 2, 16]])
out = module.vm(tvm.cuda())["main"](*(tvm.runtime.from_dlpack(t.cuda()) for t in inputs))
torch.cuda.synchronize()
print("NO ERROR", out[0].numpy())
"""


@pytest.mark.gpu
def test_on_the_gpu_an_out_of_range_token_id_stops_the_launch_with_the_message():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", _TRAPPED], capture_output=True, text=True, timeout=300, cwd=root)
    output = result.stdout + result.stderr
    assert "NO ERROR" not in output and result.returncode != 0, output[-3000:]
    assert "Tessera: index out of range: R.take of a tensor of shape (16, 4)" in output, output[-3000:]
