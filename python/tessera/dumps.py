"""The dumps of a compile: which stages ``dump=``, ``dump_dir=`` and ``$TESSERA_DUMP_DIR`` ask for and
where they go (``_dump_settings``), and writing them for an instance (:func:`write_dumps`):
``graph.txt``, ``sched.txt`` + ``sched.json``, ``tile.py``, ``target.<ext>`` (a backend that writes
several files per kernel, Tenstorrent's five: them in one text and as files under ``target/<kernel>/``)
and ``pass_log.jsonl``. The IR after every TVM pass (``passes/<kernel>/``) and the build outputs
(``artifacts/<kernel>/``) are written by ``tessera_tvm.lower`` into the directories
:mod:`tessera.build` gives it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tessera_tvm.target.backend import backend_for

from .errors import KernelError, user_location
from .instance import DeviceKernel, Instance
from .kernel import STAGES, Kernel


def program_text(dk: DeviceKernel, keys: tuple[str, ...]) -> str:
    """A device kernel's program files (``keys`` of its artifacts) in one text, each under a banner."""
    files = dk.lowered.artifacts
    return "\n".join(
        f"// ===== kernel {dk.name}: {files[key].name} ({key}) =====\n{Path(files[key]).read_text()}" for key in keys
    )


def _dump_settings(kernel: Kernel, dump, dump_dir) -> tuple[tuple[str, ...], Path | None]:
    env_dir = os.environ.get("TESSERA_DUMP_DIR")
    if dump is None or dump is False:
        if env_dir and dump is None:
            return STAGES, Path(env_dir) / kernel.name
        return (), None
    if dump is True or dump == "all":
        stages = STAGES
    else:
        items = [dump] if isinstance(dump, str) else list(dump)
        items = [s.strip() for item in items for s in str(item).split(",") if s.strip()]
        unknown = [s for s in items if s not in STAGES]
        if unknown:
            raise KernelError(
                f"dump= names unknown stage(s) {unknown}; stages are {', '.join(STAGES)}", location=user_location()
            )
        stages = tuple(s for s in STAGES if s in items)
    base = (
        Path(dump_dir)
        if dump_dir is not None
        else Path(env_dir) / kernel.name
        if env_dir
        else Path("tessera_dump") / kernel.name
    )
    return stages, base


def write_dumps(instance: Instance, dump_dir: Path, stages: tuple[str, ...]) -> dict[str, Path]:
    """One file per stage (+ sched.json, pass log); per-pass IR is written by tessera_tvm.lower."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    header = (
        f"# {instance.kernel.name} for {instance.config.name} "
        f"(config {instance.config.fingerprint()}), shapes {instance.env}\n"
    )
    if "graph" in stages:
        text = (
            header
            + "# ---- traced ----\n"
            + instance.graph.text(traced=True)
            + "\n# ---- after the graph passes ----\n"
            + instance.graph.text()
        )
        written["graph"] = dump_dir / "graph.txt"
        written["graph"].write_text(text)
    if "sched" in stages:
        written["sched"] = dump_dir / "sched.txt"
        written["sched"].write_text(header + "\n".join(dk.schedule.text() for dk in instance.devices))
        (dump_dir / "sched.json").write_text(
            json.dumps([dk.schedule.as_dict() for dk in instance.devices], indent=2, sort_keys=True) + "\n"
        )
    if "tile" in stages:
        written["tile"] = dump_dir / "tile.py"
        written["tile"].write_text(header + "\n\n".join(dk.tile_text() for dk in instance.devices))
    if "target" in stages:
        backend = backend_for(instance.config)
        written["target"] = dump_dir / f"target{backend.source_suffix}"
        keys = backend.program_files
        if keys:  # several files per kernel (Tenstorrent's five): + each under target/<kernel>/
            written["target"].write_text("\n".join(program_text(dk, keys) for dk in instance.devices))
            for dk in instance.devices:
                (dump_dir / "target" / dk.name).mkdir(parents=True, exist_ok=True)
                for key in keys:
                    src = Path(dk.lowered.artifacts[key])
                    (dump_dir / "target" / dk.name / src.name).write_text(src.read_text())
        else:
            written["target"].write_text(
                "\n".join(f"// ---- kernel {dk.name} ----\n{dk.lowered.source}" for dk in instance.devices)
            )
    log = "\n".join(json.dumps(e.as_dict()) for e in instance.log) + "\n"
    (dump_dir / "pass_log.jsonl").write_text(log)
    return written
