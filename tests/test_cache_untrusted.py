# ruff: noqa: F821  (dim names in Tensor[...] are not Python names)
"""The kernel cache trusts none of its files (issue #37, item 4): every file it loads is checked
against a manifest that checks itself, the linked entry libraries under modules/ included; a bad
entry is rebuilt with a warning; an unwritable or full cache compiles in a temporary directory;
what dead processes left is cleaned; concurrent processes compile a key once."""

import errno
import fcntl
import json
import multiprocessing
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
import tessera_tvm
from tessera import Tensor, ops
from tessera_tvm import cache as cache_mod
from tessera_tvm.errors import TesseraWarning
from tests.programs import gemm as programs


@ts.kernel
def relu(x: Tensor["N", ts.f32]) -> Tensor["N", ts.f32]:
    return ops.relu(x)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A fresh cache, without the precompiled prelude (70 MB and ~2 s to build; not what is tested)."""
    from tessera_tvm.target.cpu import build

    monkeypatch.delenv("TESSERA_DISABLE_CACHE", raising=False)
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(build, "precompiled_prelude", lambda cxx, flags: None)
    return tmp_path / "kernels"


def _tessera_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, TesseraWarning)]


def test_a_manifest_edited_into_valid_json_is_rebuilt_not_trusted(private_cache):
    """Swapped parameter names would give wrong numbers: the manifest checks its own digest."""
    prog = programs.cpu_gemm(64, 64, 32)
    first = tessera_tvm.lower(prog, "cpu", build=False)
    (manifest,) = private_cache.glob("*/*/manifest.json")
    record = json.loads(manifest.read_text())
    params = record["cpu_entry"][1]
    params[0][0], params[1][0] = params[1][0], params[0][0]  # A <-> B
    manifest.write_text(json.dumps(record, indent=1))
    with pytest.warns(TesseraWarning, match="damaged"):
        again = tessera_tvm.lower(prog, "cpu", build=False)
    assert not again.from_cache and [p.name for p in again._entry[1]] == [p.name for p in first._entry[1]]
    assert tessera_tvm.lower(prog, "cpu", build=False).from_cache


def test_a_damaged_linked_entry_library_is_rebuilt_not_loaded(private_cache):
    from tessera.module import module_plan
    from tessera_tvm.target.cpu.module import linked_entry

    k = ts.compile(relu, target="cpu", shapes={"N": 40})
    x = np.arange(40, dtype=np.float32) - 20
    np.testing.assert_array_equal(k(x), np.maximum(x, 0))
    (library,) = private_cache.glob("modules/*/relu.so")
    good = library.read_bytes()
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0x10  # one flipped bit
    library.with_name("flipped").write_bytes(bytes(damaged))
    os.replace(library.with_name("flipped"), library)  # a new file: this process has the old one mapped
    instance = k._instance
    libraries = [dk.lowered.artifacts["library"] for dk in instance.devices]
    with pytest.warns(TesseraWarning, match=r"modules/.*damaged \(relu\.so does not match its checksum\)"):
        linked_entry(module_plan(instance), libraries)
    assert library.read_bytes() == good  # rebuilt (the same source, flags and libraries: the same bytes)


def test_a_prelude_checksum_of_any_bytes_means_rebuild_not_a_crash(tmp_path):
    from tessera_tvm.target.cpu import build

    gch = tmp_path / "common.h.gch"
    gch.write_bytes(b"precompiled")
    gch.with_name("common.h.gch.sha256").write_bytes(b"\xff\xfe\x00 not utf-8\n")
    assert build._prelude_intact(gch) is False


def test_an_unwritable_cache_compiles_in_a_temporary_directory_with_one_warning(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")  # a cache under a regular file: unwritable, even for root
    monkeypatch.delenv("TESSERA_DISABLE_CACHE", raising=False)
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "file" / "kernels"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = tessera_tvm.lower(programs.cpu_gemm(64, 64, 32), "cpu")
        second = tessera_tvm.lower(programs.cpu_gemm(64, 32, 32), "cpu")
    (message,) = _tessera_warnings(record)
    assert "kernel cache" in message and "temporary directory" in message
    for lowered, n in ((first, 64), (second, 32)):
        assert lowered.artifacts["library"].is_file() and "file/kernels" not in str(lowered.artifacts["library"])
        c = np.zeros((64, n), np.float32)
        lowered(np.ones((64, 32), np.float32), np.ones((32, n), np.float32), c)
        assert np.all(c == 32.0)


def test_a_full_disk_while_storing_keeps_the_built_kernel_with_one_warning(private_cache, monkeypatch):
    import shutil

    def full_disk(src, dst, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(shutil, "copy2", full_disk)
    with pytest.warns(TesseraWarning, match="No space left on device"):
        lowered = tessera_tvm.lower(programs.cpu_gemm(64, 64, 32), "cpu")
    monkeypatch.undo()
    assert not list(private_cache.glob("*/*/manifest.json"))  # nothing half-stored
    assert not [p for p in private_cache.glob("*/.*")]  # no staging left
    c = np.zeros((64, 64), np.float32)
    lowered(np.ones((64, 32), np.float32), np.ones((32, 64), np.float32), c)
    assert np.all(c == 32.0)


def test_files_left_by_dead_processes_are_cleaned_at_the_next_start(tmp_path, monkeypatch):
    import tempfile

    temp, root = tmp_path / "tmp", tmp_path / "kernels"
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    old = time.time() - 3600

    def made(path: Path, directory: bool = True, age: float = old) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if directory else path.write_bytes(b"x")
        os.utime(path, (age, age))
        return path

    key = "0123456789abcdef0123456789abcdef"
    dead = [
        made(root / "objects" / ".0123456789ab.4242.dead1234"),  # a killed object compile (host_library)
        made(temp / "tessera_build_4242.abcd1234"),  # a killed compile's build directory
        made(root / "ab" / ".abababababab.4242.k2j3h4g5"),  # a killed store's staging directory
        made(root / "modules" / ".0123456789ab.4242.zz99yy88"),
        made(root / "pch" / "aaaa" / "tl_templates" / "cpp" / ".common.h.gch.4242.tmp", directory=False),
    ]
    made(root / "pch" / "aaaa.lock", directory=False)
    live = [
        made(root / "objects" / ".0123456789ab.4243.live1234"),  # an object compiling now (its flock)
        made(root / "objects" / "01" / f"{key}.o", directory=False),  # an object
        made(temp / "tessera_build_4243.live1234"),  # held by a live compile (its flock)
        made(temp / "tessera_build_4244.young123", age=time.time()),  # just made, not locked yet
        made(root / "ab" / ("ab" * 32)),  # an entry
        made(root / "pch" / "bbbb" / "tl_templates" / "cpp" / ".common.h.gch.4243.tmp", directory=False),
        made(temp / "tessera_relu_k3j4h5g6"),  # a compile's files outside the cache: in use by its process
    ]
    held = [os.open(live[0], os.O_RDONLY), os.open(live[2], os.O_RDONLY)]
    held.append(os.open(made(root / "pch" / "bbbb.lock", directory=False), os.O_RDONLY))
    try:
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_EX)
        monkeypatch.delenv("TESSERA_DISABLE_CACHE", raising=False)
        monkeypatch.delenv("TESSERA_PCH_DIR", raising=False)  # the preludes under root/pch
        monkeypatch.setenv("TESSERA_CACHE_DIR", str(root))
        cache_mod.KernelCache.from_env()
    finally:
        for fd in held:
            os.close(fd)
    assert [p for p in dead if p.exists()] == []
    assert [p for p in live if not p.exists()] == []


def _compile_after(barrier, root: str, queue) -> None:
    os.environ["TESSERA_CACHE_DIR"] = root
    import tessera_tvm
    from tests.programs import gemm as programs

    program = programs.cpu_gemm(64, 64, 32)
    barrier.wait()  # both processes ask for the same key at once
    queue.put(tessera_tvm.lower(program, "cpu", build=False).from_cache)


def test_concurrent_processes_compile_a_key_once(tmp_path):
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_compile_after, args=(barrier, str(tmp_path / "kernels"), queue)) for _ in "ab"]
    for worker in workers:
        worker.start()
    results = sorted(queue.get(timeout=300) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
    assert results == [False, True]  # one compiled, the other waited for it and loaded its entry
