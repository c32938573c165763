"""Running external compilers (nvcc, g++) and writing their artifacts safely.

Every target driver in ``tessera_tvm.target`` goes through this module, so that they all:

- find their compiler the same way (``PATH``, overridable with ``TESSERA_NVCC`` / ``TESSERA_CXX``),
- fail the same way: a missing tool raises :class:`ToolchainMissingError` saying how to get it, a
  failing tool raises :class:`ToolchainError` whose message holds the command line and the first
  error lines of its output (the full output is on the exception's ``output``),
- never leave half-written artifacts: builds run in a temporary sibling directory and their files
  are moved into place (``os.replace``) only when the whole build succeeded.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import TesseraError, ToolchainError, ToolchainMissingError
from ..output_files import sha256_file  # noqa: F401  (re-exported: the builds' name for it)
from ..trace import span

__all__ = [
    "BuildOptionError",
    "CompletedRun",
    "atomic_output_dir",
    "check_untrusted_flags",
    "file_lock",
    "find_tool",
    "require_tool",
    "run_tool",
    "sha256_file",
    "summarize_output",
    "tilelang_include_dirs",
    "untouched_on_failure",
    "validate_artifact_name",
    "write_text_atomic",
]


class BuildOptionError(TesseraError, ValueError):
    """An argument of a build function (arch, name, formats, ...) is not valid."""


# Environment variables that replace the PATH lookup of a tool (e.g. a CUDA toolkit not on PATH).
TOOL_ENV_OVERRIDES: dict[str, str] = {
    "nvcc": "TESSERA_NVCC",
    "g++": "TESSERA_CXX",
    "c++": "TESSERA_CXX",
    "clang++": "TESSERA_CXX",
}

# What to tell the user when a tool is missing.
_INSTALL_HINTS: dict[str, str] = {
    "nvcc": (
        "install the CUDA Toolkit (https://developer.nvidia.com/cuda-downloads) and put its bin/ "
        "directory on PATH, or set TESSERA_NVCC to the nvcc executable"
    ),
    "g++": (
        "install a C++ compiler (Debian/Ubuntu: `apt-get install g++`; Fedora: `dnf install gcc-c++`), "
        "or set TESSERA_CXX to a g++ or clang++ executable"
    ),
}
_INSTALL_HINTS["c++"] = _INSTALL_HINTS["clang++"] = _INSTALL_HINTS["g++"]

# Output longer than this is cut down to its error lines in exception messages.
MAX_MESSAGE_OUTPUT = 3000
_ERROR_LINE = re.compile(r"\b(error|fatal|catastrophic)\b|^Error", re.IGNORECASE)


@dataclass(frozen=True)
class CompletedRun:
    """A tool run that exited with status 0."""

    command: list[str]
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        """stderr then stdout, the way a terminal would mostly show them."""
        return _join_output(self.stderr, self.stdout)


def find_tool(name: str) -> str | None:
    """Return the path of executable ``name``, or None when it cannot be found.

    ``TESSERA_NVCC`` (for nvcc) and ``TESSERA_CXX`` (for g++/c++/clang++) replace the PATH lookup when
    set; an override that does not name an executable gives None rather than falling back to PATH,
    because the user asked for that tool explicitly.
    """
    env_var = TOOL_ENV_OVERRIDES.get(name)
    override = os.environ.get(env_var, "").strip() if env_var else ""
    if override:
        return shutil.which(os.path.expanduser(override))  # which() accepts a path or a bare name
    return shutil.which(name)


def require_tool(name: str) -> str:
    """Like :func:`find_tool` but raises :class:`ToolchainMissingError` saying how to get the tool."""
    path = find_tool(name)
    if path is not None:
        return path
    env_var = TOOL_ENV_OVERRIDES.get(name)
    override = os.environ.get(env_var, "").strip() if env_var else ""
    hint = _INSTALL_HINTS.get(name, f"install {name} and put it on PATH")
    if override:
        message = (
            f"{name} not found: {env_var} is set to {override!r}, which is not an executable file. "
            f"Fix {env_var} or unset it to search PATH ({hint})."
        )
    else:
        message = f"{name} not found on PATH; {hint}."
    raise ToolchainMissingError([override or name], "", message)


def summarize_output(output: str, limit: int = MAX_MESSAGE_OUTPUT) -> str:
    """Cut a compiler's output down for an error message, keeping the first error lines.

    Short output is returned whole. Long output (nvcc prints pages of harmless warnings from TileLang's
    headers before the real error) is reduced to its error lines plus the two lines after each, then
    to at most ``limit`` characters.
    """
    text = output.strip()
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    picked: list[int] = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line):
            start = max(i, picked[-1] + 1) if picked else i  # do not repeat overlapping context lines
            picked.extend(range(start, min(i + 3, len(lines))))
    if not picked:  # no recognisable error line: show the start and the end
        head = text[: limit // 2].rstrip()
        tail = text[-limit // 2 :].lstrip()
        return f"{head}\n[... {len(text) - len(head) - len(tail)} characters cut ...]\n{tail}"
    body = "\n".join(lines[i] for i in picked)
    if len(body) > limit:
        body = body[:limit].rstrip() + "\n[... cut ...]"
    return f"[{len(lines)} lines of output; showing the error lines, the full output is on .output]\n{body}"


def run_tool(
    command: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> CompletedRun:
    """Run an external compiler and return its output, or raise a :class:`ToolchainError`.

    Raises :class:`ToolchainMissingError` when the executable does not exist, and
    :class:`ToolchainError` on a non-zero exit or when it runs longer than ``timeout`` seconds (the
    tool and every process it started are then killed). Output is captured, never printed.
    """
    cmd = [os.fspath(c) for c in command]
    if not cmd:
        raise BuildOptionError("run_tool needs a non-empty command")
    tool = os.path.basename(cmd[0])
    start = time.perf_counter()
    try:
        # Own process group: on timeout we kill nvcc's children (cicc, ptxas) too, not just nvcc.
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        hint = _INSTALL_HINTS.get(tool, f"install {tool} and put it on PATH")
        raise ToolchainMissingError(
            cmd,
            "",
            f"cannot run {tool} ({exc.strerror or exc}): {cmd[0]!r}; {hint}.\n  command: {shlex.join(cmd)}",
        ) from None
    try:
        with span(tool, "host", command=shlex.join(cmd)[:2000]):
            out_b, err_b = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out_b, err_b = proc.communicate()
        output = _join_output(_decode(err_b), _decode(out_b))
        raise ToolchainError(
            cmd,
            output,
            f"{tool} timed out after {timeout:g} s and was killed\n  command: {shlex.join(cmd)}"
            + (f"\n{summarize_output(output)}" if output.strip() else ""),
        ) from None
    except BaseException:  # KeyboardInterrupt: do not leave a compiler running
        _kill_group(proc)
        proc.wait()
        raise
    seconds = time.perf_counter() - start
    stdout, stderr = _decode(out_b), _decode(err_b)
    if proc.returncode != 0:
        output = _join_output(stderr, stdout)
        status = _describe_status(proc.returncode)
        where = f"\n  in directory: {os.fspath(cwd)}" if cwd is not None else ""
        raise ToolchainError(
            cmd,
            output,
            f"{tool} failed ({status}) after {seconds:.1f} s\n  command: {shlex.join(cmd)}{where}\n"
            + (summarize_output(output) or "(no output)"),
        )
    return CompletedRun(command=cmd, stdout=stdout, stderr=stderr, seconds=seconds)


def validate_artifact_name(name: str) -> str:
    """Check that ``name`` is a plain file stem (no directory, no leading dot) and return it."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*", name):
        raise BuildOptionError(
            f"artifact name {name!r} is not a plain file name; use letters, digits, '_', '-', '.', '+' "
            "and no directory part (the directory is out_dir)"
        )
    return name


@contextmanager
def atomic_output_dir(final_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging directory whose files land in ``final_dir`` only if the block succeeds.

    The staging directory is a hidden sibling of ``final_dir`` (same file system, so the final
    ``os.replace`` of each file is atomic). On success every file is moved into ``final_dir`` (created
    if needed; files already there with other names are kept, same names are replaced); on any
    exception the staging directory is deleted and ``final_dir`` is left exactly as it was.
    """
    final = Path(final_dir).absolute()
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield staging
        final.mkdir(exist_ok=True)
        _merge_into(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block: processes that build the
    same shared file (a runner, a precompiled header) wait for the first instead of all building it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def untouched_on_failure(final_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Add to a :class:`ToolchainError` raised inside the block that ``final_dir`` was not changed.

    Used around :func:`atomic_output_dir`: the failing command ran in the staging directory, which is
    gone by the time the user reads the message, so say so.
    """
    try:
        yield
    except ToolchainError as exc:
        note = f"\n  (the build ran in a temporary directory, now removed; nothing was written to {final_dir})"
        raise type(exc)(exc.command, exc.output, f"{exc}{note}") from None


def write_text_atomic(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part.

    Writes a temporary file in the same directory, fsyncs it and ``os.replace``s it over ``path``.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    # os.open with 0o666 applies the umask, so the result has normal permissions (mkstemp gives 0600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


@functools.cache
def _tilelang_dir() -> str:
    from .._tvm import tilelang  # the one-TVM rule: tilelang only through tessera_tvm._tvm

    return os.path.dirname(os.path.abspath(tilelang.__file__))


def tilelang_include_dirs() -> list[str]:
    """Include directories TileLang's generated CUDA/C sources need: its templates and CUTLASS."""
    root = _tilelang_dir()
    return [os.path.join(root, "src"), os.path.join(root, "3rdparty", "cutlass", "include")]


# --------------------------------------------------------------------------- helpers


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def _join_output(stderr: str, stdout: str) -> str:
    parts = [p.rstrip("\n") for p in (stderr, stdout) if p.strip()]
    return "\n".join(parts)


def _describe_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def kill_process_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every process below ``pid``.

    That includes the compilers :func:`run_tool` starts in process groups of their own
    (``start_new_session``), which killing the caller's group alone would miss. The tree is read
    from ``/proc`` on Linux before anything is killed (a killed parent's children move to init);
    elsewhere only the group is killed.
    """
    below: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in children.read_text().split()]
            except (OSError, ValueError):  # gone meanwhile
                continue
            below += kids
            todo += kids
    for target in (pid, *below):
        try:
            os.killpg(target, signal.SIGKILL)  # a group it leads (the caller's, a compiler's own)
        except OSError:  # not a group leader, or gone
            pass
    for target in below:
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Kill only the process group we created for this tool (start_new_session=True).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def _merge_into(src: Path, dst: Path) -> None:
    for entry in src.iterdir():
        target = dst / entry.name
        if entry.is_dir() and not entry.is_symlink():
            target.mkdir(exist_ok=True)
            _merge_into(entry, target)
        else:
            os.replace(entry, target)  # atomic per file; a reader sees the old or the new file


# ---------------------------------------------------------------------------------------------
# Compiler flags from a config Tessera did not install (a repro pack's): an allow-list
# ---------------------------------------------------------------------------------------------

#: Names ``-f<name>`` / ``-fno-<name>`` may take: code generation and optimisation switches only (no
#: file paths, plugins, profiles or dumps).
SAFE_F_NAMES = frozenset(
    """openmp openmp-simd strict-aliasing tree-loop-if-convert tree-vectorize tree-slp-vectorize
    tree-loop-vectorize unroll-loops unroll-all-loops peel-loops fast-math math-errno finite-math-only
    signed-zeros trapping-math rounding-math associative-math reciprocal-math unsafe-math-optimizations
    omit-frame-pointer inline inline-functions inline-small-functions exceptions rtti PIC pic PIE pie
    common strict-overflow wrapv trapv vect-cost-model simd-cost-model fp-contract excess-precision
    ipa-pta lto-partition prefetch-loop-arrays schedule-insns schedule-insns2 gcse ivopts
    split-loops stack-protector stack-protector-strong stack-clash-protection cf-protection
    permissive diagnostics-color visibility-inlines-hidden visibility""".split()
)
#: Values ``-f<name>=<value>`` may take for the names that take one.
_F_VALUES = {
    "vect-cost-model": r"unlimited|dynamic|cheap|very-cheap",
    "simd-cost-model": r"unlimited|dynamic|cheap|very-cheap",
    "fp-contract": r"off|on|fast",
    "excess-precision": r"fast|standard|16",
    "cf-protection": r"full|branch|return|none|check",
    "visibility": r"default|hidden|protected|internal",
}
#: nvcc's own switches that change code generation only.
_NVCC_FLAGS = re.compile(
    r"-lineinfo|--?use_fast_math|--?extra-device-vectorization|--?expt-relaxed-constexpr|--?expt-extended-lambda"
    r"|--?(?:ftz|prec-div|prec-sqrt|fmad)=(?:true|false)|--?maxrregcount=\d{1,4}|--?default-stream=(?:legacy|per-thread)"
)
_PLAIN_FLAGS = re.compile(
    r"-O[0-3sgz]?|-Ofast|-g[0-3]?|-w|-pthread|-pedantic|-std=(?:c|gnu)(?:\+\+)?[0-9a-z]{1,3}"
    r"|-m(?:arch|tune|cpu)=[A-Za-z0-9_.+-]{1,40}|-m(?:no-)?[a-z0-9][a-z0-9.-]{0,40}"
    r"|-W(?:no-)?(?:error=)?[a-z][a-z0-9+-]{0,60}|-D[A-Za-z_]\w{0,60}(?:=[A-Za-z0-9_.+-]{0,60})?|-U[A-Za-z_]\w{0,60}"
)


def untrusted_flag_problem(flag: object) -> str | None:
    """Why ``flag`` is not on the allow-list of compiler flags a repro pack may carry (None: it is).
    Allowed: -O*, -g*, -w, -std=, -march=/-mtune=/-mcpu= and -m<feature> with plain values, -W
    warnings, -D/-U with plain names and values, -f<name>/-fno-<name> of :data:`SAFE_F_NAMES`, and
    nvcc's code-generation switches. Everything else may run code or touch files (-wrapper, -B,
    -specs, @file, -fplugin, -Wl,/-Xlinker passthroughs, -fprofile-*, -o, -ccbin, -Xcompiler, ...)."""
    if not isinstance(flag, str):
        return f"{flag!r} is not a string"
    if _PLAIN_FLAGS.fullmatch(flag) or _NVCC_FLAGS.fullmatch(flag):
        return None
    match = re.fullmatch(r"-f(no-)?([A-Za-z0-9-]{1,60})(?:=([A-Za-z0-9_.+-]{1,40}))?", flag)
    if match and match[2] in SAFE_F_NAMES:
        if match[3] is None or re.fullmatch(_F_VALUES.get(match[2], r"(?!)"), match[3]):
            return None
    return f"{flag!r} is not an optimisation or code-generation flag this allow-list knows"


def check_untrusted_flags(flags: object, where: str) -> list[str]:
    """``flags`` (a config's ``codegen.flags`` from a source Tessera did not install) when every one
    is on the allow-list (:func:`untrusted_flag_problem`); else a :class:`BuildOptionError` naming
    ``where`` and the flags refused."""
    if not isinstance(flags, list | tuple):
        raise BuildOptionError(f"{where}: codegen.flags is {flags!r}; expected a list of compiler flags")
    problems = [p for p in map(untrusted_flag_problem, flags) if p]
    if problems:
        raise BuildOptionError(
            f"{where}: codegen.flags holds flags a repro pack may not pass to the compiler: {'; '.join(problems)}. "
            "A pack's flags are limited to optimisation and code-generation switches (-O*, -march=, -f<name>, "
            "-D<name>, ...); replay it with the installed config's flags instead (see docs/observability.md, repro packs)"
        )
    return list(flags)
