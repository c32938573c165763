"""Hugging Face transformers models, built from small configs with random weights (nothing is
downloaded), exported with torch.export and imported with TVM's frontend as a user would, on the
route the README offers beside the default (``run_ep_decomposition=False``) and on the default.

Without decomposition none of these imported before tessera_tvm/frontend_fixes.py: transformers'
mask code calls ``torch.diff`` and builds its bool mask from ``new_ones(dtype=torch.bool)`` (which
came out int64), LLaMA moves its rotary frequencies with ``.to(device, dtype)``, and BERT passes a
bool ``attn_mask`` to SDPA.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch

if importlib.util.find_spec("transformers") is None:  # not imported here: 1.5 s per xdist worker's collection
    pytest.skip("needs transformers (the test extra has it)", allow_module_level=True)
pytest.importorskip("tvm.relax.frontend.torch")

from .models import example as load_example  # noqa: E402

pytestmark = pytest.mark.slow


example = load_example("hf_model")


@pytest.mark.parametrize(
    "name, decompose, padded",
    # (BERT runs in test_the_example_runs_as_the_readme_says, on both routes.)
    [("llama", False, "left"), ("gpt2", True, None), ("vit", False, None), ("bloom", True, "left")],
    ids=["llama (GQA, rotary), not decomposed", "gpt2, decomposed", "vit, not decomposed", "bloom (ALiBi), decomposed"],
)
def test_a_transformers_model_imports_builds_and_matches_torch(name, decompose, padded):
    # Two sequences, the second padded (left for the decoder, right for BERT) through the
    # attention_mask input. (GPT-2 is exported with one sequence and no mask: torch 2.13's own
    # decomposition of its batched graph fails, "Cannot view a tensor ... as a tensor with shape".)
    model = example.make_model(name)
    if name == "vit":  # two images, 16 patches each
        inputs = example.vit_inputs(model)
    elif padded is None:
        inputs = (torch.randint(0, 256, (1, 12)),)
    else:
        mask = torch.ones(2, 12, dtype=torch.int64)
        if padded == "left":
            mask[1, :3] = 0
        else:
            mask[1, 8:] = 0
        inputs = (torch.randint(0, 256, (2, 12)), mask)
    built, got, expected, _ = example.build_and_compare(model, inputs, decompose=decompose)
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-4)
    families = [row.family for row in built.report.offloaded]
    assert families.count("gemm") >= 8, built.report  # every projection of both layers
    if not decompose or name == "bloom":  # SDPA imported whole, or ALiBi + mask as the bias: one kernel per layer
        assert families.count("attention") == 2, built.report
    if name == "vit":  # the patch embedding: a 8x8 convolution of stride 8
        assert families.count("conv2d") == 1, built.report
    if name == "gpt2":  # its default activation, gelu_new, written out: each fc GEMM's epilogue
        assert built.report.rebuilt["gelu_tanh"] == 2, built.report
        assert not {row.op for row in built.report.not_offloaded} & {"R.power", "R.tanh"}, built.report


def test_the_example_runs_as_the_readme_says():
    # A process of its own, in a user's environment: `python examples/hf_model.py` must set up
    # TileLang's TVM itself (TileLang puts its TVM on PYTHONPATH in the environment of this process,
    # which a user's shell does not have).
    import os
    import subprocess
    import sys

    tilelangs = ("PYTHONPATH", "TVM_LIBRARY_PATH", "TL_CUTLASS_PATH", "TL_TEMPLATE_PATH")
    done = subprocess.run(
        [sys.executable, str(Path(__file__).parents[2] / "examples" / "hf_model.py"), "bert"],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k not in tilelangs},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = [float(e) for e in re.findall(r"^== bert, .*\| = ([0-9.e+-]+), built", done.stdout, re.MULTILINE)]
    assert len(errors) == 2 and max(errors) < 1e-4, done.stdout  # both import routes
    # The report of the route without decomposition: SDPA with the padding mask imported whole, one
    # attention kernel per layer, and every projection a GEMM.
    offloaded = [line.split()[2:] for line in done.stdout.splitlines() if line.startswith("  Tessera  ")]
    assert sum(ops[0] == "attention" for ops in offloaded) == 2, done.stdout
    assert sum(ops[0] == "matmul" for ops in offloaded) >= 8, done.stdout
