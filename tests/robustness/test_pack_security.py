# ruff: noqa: F821, F722  (Tensor["M", "N", ...] dims are strings, not names)
"""Repro packs from elsewhere are untrusted (issue #18, part 5; seed 004 section 9).

Opening a pack never writes outside its directory and never runs code from it: a tarball with an
absolute path, ``..``, a link, a special file, an oversized or unlisted member, or a file that does
not match its SHA-256 is refused with a PackError naming the pack and the member, before anything
of it is used; the pack's Python files are never executed, and its library is loaded only with
``--run``.
"""

# No `from __future__ import annotations`: the kernel annotates with module-level dtypes.

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import Tensor, ops, repro
from tessera.cli import main
from tessera.repro import PackError, open_pack
from tessera_tvm import capture


@ts.kernel
def scaled(X: Tensor["M", "N", ts.f32]) -> Tensor["M", "N", ts.f32]:
    return ops.exp(X) * 0.5


@pytest.fixture(scope="module")
def good_pack(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pack") / "scaled.tar.gz"
    k = ts.compile(scaled, target="cpu", shapes={"M": 3, "N": 5})
    return ts.pack_repro(k, out, inputs=[np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5)])


def members_of(pack: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(pack) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]


def write_pack(path: Path, members) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def member(name: str, data: bytes = b"x", kind=tarfile.REGTYPE, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, (data if kind == tarfile.REGTYPE else None)


def top(pack: Path) -> str:
    return members_of(pack)[0][0].name.split("/")[0]


def refused(pack: Path, tmp_path: Path, *expected: str) -> None:
    work = tmp_path / "unpack"
    with pytest.raises(PackError) as info:
        open_pack(pack, work)
    for text in expected:
        assert text in str(info.value), f"{text!r} not in: {info.value}"
    assert str(pack) in str(info.value) or str(work) in str(info.value)
    assert main(["replay", str(pack)]) == 2  # the command line says so and exits 2


def test_the_good_pack_opens_and_replays(good_pack, tmp_path):
    saved = open_pack(good_pack, tmp_path / "u")
    assert saved.record["kind"] == "kernel"
    assert ts.replay(good_pack).reproduced


def test_absolute_path_is_refused(good_pack, tmp_path):
    target = tmp_path / "outside" / "evil.txt"
    pack = write_pack(tmp_path / "abs.tar.gz", [*members_of(good_pack), member(str(target))])
    refused(pack, tmp_path, "absolute path", str(target))
    assert not target.exists()


def test_dotdot_is_refused(good_pack, tmp_path):
    pack = write_pack(tmp_path / "dotdot.tar.gz", [*members_of(good_pack), member(f"{top(good_pack)}/../../evil.txt")])
    refused(pack, tmp_path, "climbs out")
    assert not (tmp_path / "evil.txt").exists()


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_links_are_refused(good_pack, tmp_path, kind):
    name = f"{top(good_pack)}/graph.json"
    items = [(m, d) for m, d in members_of(good_pack) if m.name != name]
    pack = write_pack(tmp_path / "link.tar.gz", [*items, member(name, kind=kind, link="/etc/passwd")])
    refused(pack, tmp_path, "is a link", "/etc/passwd")


@pytest.mark.parametrize("kind", [tarfile.FIFOTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE])
def test_special_files_are_refused(good_pack, tmp_path, kind):
    pack = write_pack(tmp_path / "special.tar.gz", [*members_of(good_pack), member(f"{top(good_pack)}/dev", kind=kind)])
    refused(pack, tmp_path, "special file")


def test_oversized_members_and_packs_are_refused(good_pack, tmp_path, monkeypatch):
    biggest = max(m.size for m, _ in members_of(good_pack))
    monkeypatch.setattr(repro, "MAX_MEMBER_BYTES", biggest - 1)
    refused(good_pack, tmp_path, "over the limit")
    monkeypatch.setattr(repro, "MAX_MEMBER_BYTES", 1 << 30)
    monkeypatch.setattr(repro, "MAX_TOTAL_BYTES", biggest)
    refused(good_pack, tmp_path, "add up to more than")
    monkeypatch.setattr(repro, "MAX_TOTAL_BYTES", 1 << 32)
    monkeypatch.setattr(repro, "MAX_MEMBERS", 3)
    refused(good_pack, tmp_path, "more than 3 members")


def test_unlisted_and_edited_files_are_refused(good_pack, tmp_path):
    pack = write_pack(tmp_path / "extra.tar.gz", [*members_of(good_pack), member(f"{top(good_pack)}/extra.py")])
    refused(pack, tmp_path, "extra.py is not listed in capture.json")
    items = [
        (m, d.replace(b"float32", b"float16") if m.name.endswith("graph.json") else d) for m, d in members_of(good_pack)
    ]
    refused(write_pack(tmp_path / "edited.tar.gz", items), tmp_path, "graph.json does not match its SHA-256")


def test_manifest_names_outside_the_pack_are_refused(good_pack, tmp_path):
    items = []
    for m, d in members_of(good_pack):
        if m.name.endswith("/capture.json"):
            record = json.loads(d)
            record["files"]["../outside.json"] = {"sha256": "0" * 64, "bytes": 1}
            d = json.dumps(record).encode()
        items.append((m, d))
    refused(write_pack(tmp_path / "names.tar.gz", items), tmp_path, "not a plain relative path")


def test_two_top_directories_and_garbage_are_refused(good_pack, tmp_path):
    pack = write_pack(tmp_path / "two.tar.gz", [*members_of(good_pack), member("other/file.txt")])
    refused(pack, tmp_path, "outside the pack's one top-level directory")
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"\x1f\x8b not really gzip" * 10)
    refused(garbage, tmp_path, "not a tar archive")


def resign(root: Path, name: str, data: bytes) -> None:
    """Write ``name`` in an unpacked pack and update its digest (a consistent, hostile pack)."""
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(data)
    record = json.loads((root / "capture.json").read_text())
    record["files"][name] = capture._digest(root / name)
    (root / "capture.json").write_text(json.dumps(record))


def test_replay_never_runs_the_packs_python(good_pack, tmp_path):
    saved = open_pack(good_pack, tmp_path / "u")
    sentinel = tmp_path / "ran.txt"
    payload = f"open({str(sentinel)!r}, 'w').write('ran')\n".encode()
    for name in ("kernel_source.py", "graph.py", "replay.py"):
        resign(saved.path, name, payload)
    result = ts.replay(saved.path)
    assert result.reproduced and not sentinel.exists()


def test_the_packs_library_is_loaded_only_with_run(good_pack, tmp_path):
    saved = open_pack(good_pack, tmp_path / "u")
    library = saved.record["binaries"]["library"]
    resign(saved.path, library, b"\x7fELF not a library")
    assert ts.replay(saved.path).reproduced  # without --run the library is not touched
    with pytest.raises(ts.TesseraError, match="cannot load entry"):
        ts.replay(saved.path, run=True)


def test_saved_arrays_are_raw_bytes_checked_against_their_shape(good_pack, tmp_path):
    saved = open_pack(good_pack, tmp_path / "u")
    name = saved.record["inputs"][0]["file"]
    resign(saved.path, name, b"\x80\x04\x95 a pickle stream, not 15 float32s")
    with pytest.raises(PackError, match="needs 60"):
        ts.replay(saved.path)


# ============================================================================ issue #37, item 1


@pytest.mark.parametrize(
    "flag",
    ["-wrapper", "-B/tmp/evil", "-specs=/tmp/x.specs", "@flags.txt", "-fplugin=/tmp/p.so", "-Wl,--plugin=/tmp/p.so",
     "-Xlinker", "-fprofile-generate=/tmp/p", "-o", "-load", "-ccbin=/tmp/cc", "-Xcompiler", "-include", "-I/tmp"],
)  # fmt: skip
def test_pack_flags_outside_the_allow_list_are_refused(good_pack, tmp_path, capsys, flag):
    """A pack's config.yaml (digest updated) naming a flag that can run code or read files is refused
    with exit status 2 before g++ runs: -wrapper used to run any command and print REPRODUCED."""
    saved = open_pack(good_pack, tmp_path / "u")
    sentinel = tmp_path / "ran.txt"
    text = (saved.path / "config.yaml").read_text()
    assert "flags: [-O3," in text
    evil = text.replace("flags: [-O3,", f"flags: [-O3, {json.dumps(flag)}, 'sh,-c,touch {sentinel}',")
    resign(saved.path, "config.yaml", evil.encode())
    assert main(["replay", str(saved.path)]) == 2
    err = capsys.readouterr().err
    assert "config.yaml: codegen.flags holds flags a repro pack may not pass" in err and repr(flag) in err
    assert not sentinel.exists()


def test_installed_configs_flags_are_on_the_allow_list():
    import tessera_tvm
    from tessera_tvm.target.toolchain import untrusted_flag_problem

    for name in tessera_tvm.available_configs():
        for flag in tessera_tvm.load_config(name).codegen_dict["flags"]:
            assert untrusted_flag_problem(flag) is None, (name, flag)
    for flag in ("-O2", "-march=x86-64-v3", "-mavx2", "-fno-tree-vectorize", "-DNDEBUG", "-std=c++17", "-Wall", "-g"):
        assert untrusted_flag_problem(flag) is None, flag


def test_a_graph_with_a_node_removed_is_refused_not_a_crash(good_pack, tmp_path):
    """TVM's loader segfaulted on most positions: indices past the end, references to later nodes."""
    saved = open_pack(good_pack, tmp_path / "u")
    graph = json.loads((saved.path / "graph.json").read_text())
    for position in range(len(graph["nodes"])):
        nodes = graph["nodes"][:position] + graph["nodes"][position + 1 :]
        resign(saved.path, "graph.json", json.dumps(dict(graph, nodes=nodes)).encode())
        with pytest.raises(ts.TesseraError, match="graph.json: .*refused"):
            capture.load_ir(capture.Capture.open(saved.path), "graph")
    assert main(["replay", str(saved.path)]) == 2


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda g: g.update(root_index=len(g["nodes"])), "root_index"),
        (lambda g: g["nodes"].append({"type": "ffi.Array", "data": [len(g["nodes"])]}) or g.update(
            root_index=len(g["nodes"]) - 1), "refers only to nodes before it"),
        (lambda g: g.update(nodes=[{"type": "None"}] + [{"type": "ffi.Array", "data": [i]} for i in range(5000)],
                            root_index=5000), "deeper than"),
        (lambda g: g["nodes"].__setitem__(1, {"type": "ffi.Map", "data": [0]}), "key and value pairs"),
        (lambda g: g["nodes"].__setitem__(1, {"type": "ffi.Function", "data": {}}), "does not write as fields"),
        (lambda g: g["nodes"].__setitem__(1, {"type": "ir.Attrs", "data": {}}), "does not write as fields"),
        (lambda g: g["nodes"].__setitem__(1, {"type": "no.SuchType", "data": {}}), "not an object type"),
        (lambda g: g["nodes"].__setitem__(1, {"type": "ffi.Tensor", "data": "AAAA"}), "ffi.Tensor"),
        (lambda g: g["nodes"].__setitem__(1, {"type": "Device", "data": [1]}), "Device"),
    ],
)  # fmt: skip
def test_hostile_tvm_json_is_refused(good_pack, tmp_path, edit, expected):
    saved = open_pack(good_pack, tmp_path / "u")
    graph = json.loads((saved.path / "graph.json").read_text())
    edit(graph)
    resign(saved.path, "graph.json", json.dumps(graph).encode())
    with pytest.raises(ts.TesseraError, match=expected):
        capture.load_ir(capture.Capture.open(saved.path), "graph")


def test_a_field_of_the_wrong_type_or_null_is_refused(good_pack, tmp_path):
    """TVM's loader leaves a field it cannot set null and goes on; a null Call.op crashed well_formed."""
    saved = open_pack(good_pack, tmp_path / "u")
    graph = json.loads((saved.path / "graph.json").read_text())
    call = next(i for i, n in enumerate(graph["nodes"]) if n["type"] == "relax.expr.Call")
    array = next(i for i, n in enumerate(graph["nodes"]) if n["type"] == "ffi.Array" and i < call)
    for value, expected in ((0, "field op is null"), (array, "does not hold what its type needs")):
        graph["nodes"][call]["data"]["op"] = value
        resign(saved.path, "graph.json", json.dumps(graph).encode())
        with pytest.raises(ts.TesseraError, match=expected):
            capture.load_ir(capture.Capture.open(saved.path), "graph")
    assert capture.load_ir(open_pack(good_pack, tmp_path / "again"), "graph") is not None  # the good one loads


def test_text_from_a_pack_is_printed_escaped(good_pack, tmp_path, capsys):
    saved = open_pack(good_pack, tmp_path / "u")
    saved.record.update(kind="compile", error={"type": "Evil\x1b[2J\x1b]0;owned\x07\r\u202e", "message": "x"})
    saved.save()
    assert main(["replay", str(saved.path)]) == 1  # the compile succeeds: not reproduced
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\u202e" not in out
    assert "Evil\\x1b[2J\\x1b]0;owned\\x07\\r\\u202e" in out


def test_fuzz_the_pack_readers_in_a_process_of_their_own(good_pack, tmp_path):
    """tests/robustness/pack_fuzz.py: edited, re-signed graph.json, config.yaml and kernel.json read the
    way replay does; a crash (TVM's loader) is the child's exit status, not this run's."""
    import os
    import subprocess
    import sys

    saved = open_pack(good_pack, tmp_path / "u")
    repo = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "tests.robustness.pack_fuzz", str(saved.path)], cwd=repo,
                         capture_output=True, text=True, timeout=900, env={**os.environ, "TESSERA_REPRO_DIR": "off"})  # fmt: skip
    assert run.returncode == 0, f"exit status {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    assert run.stdout.count(": passed") == 3


@pytest.mark.parametrize(
    "settings",
    [{"config": {"tl.device_compile_flags": ["-ccbin=/tmp/evil"]}}, {"config": {"tl.dump_ir_path": "/tmp/x"}},
     {"config": {"tl.enable_dump_ir": 1}}, {"config": {"cuda.kernels_output_dir": "/tmp/x"}},
     {"opt_level": "3; rm"}, {"required_pass": [{"x": 1}]}],
)  # fmt: skip
def test_pass_context_settings_that_reach_tools_or_files_are_refused(good_pack, tmp_path, capsys, settings):
    """capture.json's PassContext: only registered switches (numbers, bools); flags for nvcc, dump
    paths and output directories are refused before anything compiles."""
    saved = open_pack(good_pack, tmp_path / "u")
    saved.record["pass_context"] = settings
    saved.save()
    assert main(["replay", str(saved.path)]) == 2
    assert "capture.json: pass_context" in capsys.readouterr().err
