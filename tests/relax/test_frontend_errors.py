"""An import that TVM's torch importer cannot do stops with a TesseraError naming the torch op and
the user's line (tessera_tvm/frontend_errors.py), on both import routes, not with TVM's
``AssertionError: Unsupported function types [...]`` or a traceback from inside a converter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tessera_tvm import TesseraError

from_exported_program = pytest.importorskip("tvm.relax.frontend.torch").from_exported_program

ROUTES = pytest.mark.parametrize("decompose", [True, False], ids=["decomposed", "not decomposed"])


class NoConverter(nn.Module):
    def forward(self, x):
        return torch.lgamma(x) + 1  # no converter in either TVM


class ConverterRefuses(nn.Module):
    def forward(self, x):
        return F.avg_pool2d(x, 2, divisor_override=3)  # refused on an image of dynamic size


def _import(model, decompose, **dynamic):
    program = torch.export.export(model, (torch.rand(1, 1, 4, 4),), **dynamic)
    return from_exported_program(program, keep_params_as_input=False, run_ep_decomposition=decompose)


@ROUTES
def test_an_op_with_no_converter_is_named_with_the_users_line(decompose):
    with pytest.raises(TesseraError, match=r"no converter for aten\.lgamma\.default \(File .*test_frontend_errors\.py"):
        _import(NoConverter(), decompose)


def test_a_converter_that_fails_names_the_op_and_the_users_line():
    # the converter's NotImplementedError came out of TVM's importer as it was, with no line
    dynamic = {"dynamic_shapes": {"x": {2: torch.export.Dim("height", min=4, max=64)}}}
    with pytest.raises(
        TesseraError, match=r"aten\.avg_pool2d\.default \(File .*test_frontend_errors\.py.*line 26.*dynamic size"
    ):
        _import(ConverterRefuses(), False, **dynamic)
