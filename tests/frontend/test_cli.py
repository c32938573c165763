"""tessera compile FILE.py[:KERNEL] --target T --shapes ... --dump ... --out DIR."""

from __future__ import annotations

import pytest

from tessera.cli import main


def test_compile_writes_every_stage(repo, tmp_path, capsys):
    rc = main(
        [
            "compile",
            str(repo / "examples" / "linear.py"),
            "--target",
            "cpu",
            "--shapes",
            "M=64,N=48,K=32",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "linear for cpu (M=64, N=48, K=32): 1 device kernel(s)" in out
    assert "sched.tile      block_m=64 block_n=64 block_k=32" in out
    for name in ("graph.txt", "sched.txt", "tile.py", "target.cpp"):
        assert (tmp_path / name).is_file()
    assert (tmp_path / "passes" / "fused_matmul_cast_add_gelu" / "000_input.py").is_file()
    assert (tmp_path / "artifacts" / "fused_matmul_cast_add_gelu" / "fused_matmul_cast_add_gelu.so").is_file()


def test_compile_several_targets_with_file_shapes(repo, tmp_path, capsys):
    rc = main(
        [
            "compile",
            f"{repo / 'examples' / 'softmax.py'}:softmax",
            "--target",
            "hopper,rocm",
            "--dump",
            "sched,target",
            "--out",
            str(tmp_path),
            "--no-build",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "softmax for hopper (M=4096, N=4096)" in out and "softmax for rocm (M=4096, N=4096)" in out
    assert (tmp_path / "hopper" / "target.cu").is_file() and (tmp_path / "rocm" / "target.hip.cpp").is_file()
    assert not (tmp_path / "hopper" / "tile.py").exists()


def test_compile_schedule_override(repo, capsys):
    rc = main(
        [
            "compile",
            str(repo / "examples" / "linear.py"),
            "--target",
            "ampere",
            "--no-build",
            "--schedule",
            '{"block_n": 64}',
        ]
    )
    assert rc == 0 and "block_m=128 block_n=64 block_k=32" in capsys.readouterr().out


def test_compile_reports_rejected_schedule(repo, capsys):
    rc = main(
        [
            "compile",
            str(repo / "examples" / "linear.py"),
            "--target",
            "hopper",
            "--no-build",
            "--schedule",
            '{"block_m": 96}',
        ]
    )
    assert rc == 1
    assert (
        "tessera: error: schedule for kernel fused_matmul_cast_add_gelu on hopper: block_m=96"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.py"], "no such file 'missing.py'"),
        (["{repo}/examples/linear.py:nope"], "has no kernel 'nope'; kernels: linear"),
        (["{repo}/examples/linear.py", "--shapes", "M=x"], "--shapes expects NAME=INT[,NAME=INT...], found 'M=x'"),
    ],
)
def test_compile_usage_errors(repo, capsys, args, message):
    args = [a.format(repo=repo) for a in args]
    assert main(["compile", *args, "--target", "cpu"]) == 2
    assert message in capsys.readouterr().err
