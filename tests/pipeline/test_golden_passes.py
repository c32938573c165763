"""The golden pass lists: `tessera passes --check` passes, and fails with a diff on any change."""

from __future__ import annotations

import shutil

from tessera.cli import main


def test_golden_pass_lists_match(repo, capsys):
    assert main(["passes", "--check", "--golden-dir", str(repo / "tests/golden/passes")]) == 0
    out = capsys.readouterr().out
    for name in ("hopper", "ampere", "rocm", "cpu"):
        assert f"ok      {name}" in out


def test_check_fails_with_a_readable_diff(repo, tmp_path, capsys):
    golden = tmp_path / "golden"
    shutil.copytree(repo / "tests/golden/passes", golden)
    text = (golden / "ampere.txt").read_text().replace("tl.LowerOpaqueBlock\n", "")
    (golden / "ampere.txt").write_text(text)
    assert main(["passes", "--check", "--golden-dir", str(golden)]) == 1
    captured = capsys.readouterr()
    assert "+tl.LowerOpaqueBlock" in captured.out
    assert "pass lists changed for: ampere" in captured.err


def test_update_rewrites_golden_files(repo, tmp_path, capsys):
    golden = tmp_path / "golden"
    golden.mkdir()
    assert main(["passes", "--update", "--golden-dir", str(golden)]) == 0
    assert (golden / "hopper.txt").read_text() == (repo / "tests/golden/passes/hopper.txt").read_text()
    assert main(["passes", "--check", "--golden-dir", str(golden)]) == 0


def test_passes_prints_one_config(capsys):
    assert main(["passes", "--target", "hopper"]) == 0
    out = capsys.readouterr().out
    assert "[LowerAndLegalize]" in out and "[OptimizeForTarget]" in out
    assert "tl.FuseMBarrierArriveExpectTx  [when ir.has_tma]" in out


def test_passes_with_a_bad_config_is_an_error_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntarget: {kind: cuda, arch: sm_90a}\npipeline: {optimize_for_target: [tl.Nope]}\n")
    assert main(["passes", "--target", str(bad)]) == 1
    assert "unknown pass 'tl.Nope'" in capsys.readouterr().err
