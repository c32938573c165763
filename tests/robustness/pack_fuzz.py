"""Fuzzes the readers of a repro pack's files (issue #37), run as its own process so that a crash
of TVM's JSON loader shows as the exit status instead of killing the test run:

    python -m tests.robustness.pack_fuzz UNPACKED_PACK_DIR

Each example edits one file of a good, unpacked pack (``graph.json``, ``config.yaml`` or
``kernel.json``), signs it again (a consistent, hostile pack) and reads the pack the way replay does
before it compiles: the manifest, the kernel, its Graph IR through TVM's loader, the config. Each
must give a value or a ``TesseraError``; anything else fails the example. The example count is
``fuzz_settings``'s (``TESSERA_FUZZ_EXAMPLES`` for a long run); exit status 0 when every example
passed.
"""

from __future__ import annotations

import atexit
import json
import shutil
import sys
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tessera.errors import TesseraError
from tessera.repro import open_pack, restore_kernel
from tessera_tvm import capture

from .fuzz import fuzz_settings

#: How many examples each property tries in the CI run.
CI_EXAMPLES = 60

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
flags = st.sampled_from(
    ["-O3", "-O0", "-march=native", "-fopenmp", "-fno-strict-aliasing", "-DNDEBUG", "-wrapper", "-B/tmp",
     "-specs=/tmp/s", "@/tmp/f", "-fplugin=/tmp/p.so", "-Wl,--plugin=/tmp/p.so", "-o", "/tmp/x", "-load",
     "-fprofile-generate=/tmp", "-Xlinker", "-march=$(touch /tmp/x)", "-D$(x)", "", "-", "-f", "-fno-"]
) | st.text(max_size=20)  # fmt: skip


def _resign(root: Path, name: str, data: bytes) -> None:
    (root / name).write_bytes(data)
    record = json.loads((root / "capture.json").read_text())
    record["files"][name] = capture._digest(root / name)
    (root / "capture.json").write_text(json.dumps(record))


def _read_like_replay(root: Path) -> None:
    """What replay reads before it compiles; a TesseraError is a refusal, anything else a bug."""
    try:
        saved = open_pack(root)
        capture.captured_config(saved)
        capture.load_ir(saved, "graph")
        restore_kernel(saved)
    except TesseraError:
        pass


def _graph_edit(graph: dict, data) -> dict:
    nodes = graph["nodes"]
    n = len(nodes)
    what = data.draw(st.sampled_from(["remove", "index", "type", "data", "root", "swap"]))
    i = data.draw(st.integers(0, n - 1))
    if what == "remove":
        del nodes[i]
    elif what == "index":  # one reference (a field, an element) set to any nearby number
        node = nodes[i]
        value = data.draw(st.integers(-2, n + 2))
        if isinstance(node.get("data"), dict) and node["data"]:
            node["data"][data.draw(st.sampled_from(sorted(node["data"])))] = value
        elif isinstance(node.get("data"), list) and node["data"]:
            node["data"][data.draw(st.integers(0, len(node["data"]) - 1))] = value
    elif what == "type":
        nodes[i]["type"] = data.draw(st.sampled_from(sorted({m["type"] for m in nodes} | {"ffi.Object", "Device"})))
    elif what == "data":
        nodes[i]["data"] = data.draw(json_values)
    elif what == "root":
        graph["root_index"] = data.draw(st.integers(-1, n + 1) | json_values)
    else:
        j = data.draw(st.integers(0, n - 1))
        nodes[i], nodes[j] = nodes[j], nodes[i]
    return graph


def main(pack: Path) -> int:
    good = pack
    scratch = Path(tempfile.mkdtemp(prefix="tessera_pack_fuzz_"))  # every damaged copy, removed at the end
    atexit.register(shutil.rmtree, scratch, True)

    def fresh() -> Path:
        root = Path(tempfile.mkdtemp(dir=scratch)) / good.name
        shutil.copytree(good, root)
        return root

    @fuzz_settings(ci=CI_EXAMPLES)
    @given(data=st.data())
    def graph_json(data) -> None:
        root = fresh()
        graph = _graph_edit(json.loads((root / "graph.json").read_text()), data)
        _resign(root, "graph.json", json.dumps(graph).encode())
        _read_like_replay(root)
        shutil.rmtree(root.parent)

    @fuzz_settings(ci=CI_EXAMPLES)
    @given(chosen=st.lists(flags, max_size=6), line=st.integers(0, 200), text=st.text(max_size=40))
    def config_yaml(chosen, line, text) -> None:
        root = fresh()
        lines = (root / "config.yaml").read_text().splitlines()
        lines = [f"  flags: {json.dumps(chosen)}" if ln.strip().startswith("flags:") else ln for ln in lines]
        if line < len(lines) and text:
            lines[line] = text
        _resign(root, "config.yaml", "\n".join(lines).encode())
        try:
            config = capture.captured_config(open_pack(root))
        except TesseraError:
            pass
        else:  # what loads passes only allow-listed flags to the compiler
            from tessera_tvm.target.toolchain import untrusted_flag_problem

            assert not [f for f in config.codegen_dict["flags"] if untrusted_flag_problem(f)], config.codegen_dict
        shutil.rmtree(root.parent)

    @fuzz_settings(ci=CI_EXAMPLES // 2)
    @given(value=json_values)
    def kernel_json(value) -> None:
        root = fresh()
        _resign(root, "kernel.json", json.dumps(value).encode())
        _read_like_replay(root)
        shutil.rmtree(root.parent)

    for test in (graph_json, config_yaml, kernel_json):
        test()
        print(f"{test.__name__}: passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
