"""TVM JSON from a repro pack, checked before TVM parses it (issue #37, item 1).

``checked_ir_json`` refuses what TVM's loader would misread; ``tessera_tvm.capture.load_ir`` then
loads the checked copy and refuses the file when a field setter failed during the load
(``_take_raised_error``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import TesseraError

__all__ = ["MAX_IR_DEPTH", "MAX_IR_NODES", "IRJsonError", "checked_ir_json"]

# ---------------------------------------------------------------------------------------------
#
# TVM's loader (tvm-ffi's ObjectGraphDeserializer) trusts its input: it indexes its node table with
# any number it finds (a removed node made most packs segfault), recurses once per level of
# references (5,000 levels overflowed its stack here), and when a field's setter rejects a value it
# leaves the field null and goes on (a null Call.op crashed well_formed and the printer). So a pack's
# JSON is checked first: every reference points to an earlier node (what tvm.ir.save_json writes,
# children first), chains are at most MAX_IR_DEPTH deep, builtin nodes hold data of their shape,
# objects hold only their type's fields, null only where the field may be null, and the few types
# that decode their own data get data they cannot misread. TVM then parses the checked copy, and a
# setter that failed during the load (its error left behind) refuses the file.

#: A pack's TVM JSON may hold at most this many nodes, in reference chains at most this deep.
MAX_IR_NODES = 4_000_000
MAX_IR_DEPTH = 1000


class IRJsonError(TesseraError, ValueError):
    """A TVM JSON file of a pack that TVM's loader must not see (see :func:`checked_ir_json`)."""


_INT64 = (-(1 << 63), (1 << 63) - 1)
_INLINE_FIELDS = {"int", "bool", "float", "DataType"}  # stored in the object's data, not as a node
# Field types that TVM itself leaves null where there is nothing (no span, no attributes, no domain).
_NULLABLE_TYPES = {"Optional", "Any", "ffi.Object", "ir.Span", "ir.Attrs", "ir.Range"}
# Types that decode their own data (a string naming a registered thing); ffi.Tensor is checked apart.
_NAMED_TYPES = {"ir.Op", "ir.SourceName", "target.TargetKind"}
_TENSOR_MAGIC = 0xDD5E40F096B4A13F


def _is_int(value: Any, low: int = _INT64[0], high: int = _INT64[1]) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _fields(type_key: str) -> dict[str, str] | None:
    """The fields of a registered object type (name -> type of its schema), or None if unknown."""
    import tvm_ffi.core as core

    try:
        info = core._lookup_or_register_type_info_from_type_key(type_key)
    except Exception:
        return None
    if info is None or info.type_index < 64:  # 64: kTVMFFIStaticObjectBegin
        return None
    fields: dict[str, str] = {}
    while info is not None:
        for field in info.fields:
            try:
                fields[field.name] = json.loads(field.metadata.get("type_schema") or "{}").get("type", "Any")
            except (ValueError, AttributeError):
                fields[field.name] = "Any"
        info = info.parent_type_info
    return fields


def _decodes_itself(type_key: str) -> bool:
    import tvm_ffi.core as core

    try:
        return core._lookup_type_attr(core._object_type_key_to_index(type_key), "__data_from_json__") is not None
    except Exception:
        return True  # cannot tell: treat as unknown custom data (refused)


def _has_creator(type_key: str) -> bool:
    """Whether TVM can make an empty object of the type to fill in (its loader crashed on one it could not)."""
    import tvm_ffi.core as core

    try:
        return core._lookup_type_attr(core._object_type_key_to_index(type_key), "__ffi_new__") is not None
    except Exception:
        return False


def _tensor_problem(data: Any) -> str | None:
    """Why ``data`` is not a CPU tensor blob TVM's decoder reads within bounds (None: it is one)."""
    import base64
    import binascii
    import struct

    if not isinstance(data, str):
        return f"data {type(data).__name__}, expected a base64 string"
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "data is not base64"
    if len(blob) < 32:
        return f"a tensor of {len(blob)} bytes, shorter than its header"
    magic, _, device_type, _, ndim, code, bits, lanes = struct.unpack_from("<QQiiiBBH", blob)
    if magic != _TENSOR_MAGIC or device_type != 1 or not 0 <= ndim <= 16 or lanes != 1 or bits not in (8, 16, 32, 64):
        return f"tensor header (device {device_type}, ndim {ndim}, dtype {code}/{bits}/{lanes}) is not a CPU tensor's"
    if len(blob) < 32 + 8 * ndim + 8:
        return "tensor blob ends inside its shape"
    shape = struct.unpack_from(f"<{ndim}q", blob, 32)
    (size,) = struct.unpack_from("<q", blob, 32 + 8 * ndim)
    count = 1
    for dim in shape:
        count *= dim if dim >= 0 else -1
    if count < 0 or size != count * bits // 8 or len(blob) != 32 + 8 * ndim + 8 + size:
        return f"tensor of shape {list(shape)} with {size} data bytes in a blob of {len(blob)}"
    return None


def _node_refs(node: Any, i: int, nodes: list, bad) -> list[int]:
    """The node indices node ``i`` refers to, after checking its data has the shape TVM reads."""
    if not isinstance(node, dict) or not isinstance(node.get("type"), str):
        raise bad(f"node {i} is {str(node)[:80]!r}, not an object with a 'type'")
    kind, data = node["type"], node.get("data")
    scalar = {"bool": lambda v: isinstance(v, bool), "int": _is_int, "float": lambda v: _is_int(v) or (
        isinstance(v, float)), "DataType": lambda v: isinstance(v, str) and len(v) <= 64, "ffi.String": lambda v:
        isinstance(v, str)}  # fmt: skip
    if kind == "None":
        return []
    if kind in scalar:
        if not scalar[kind](data):
            raise bad(f"node {i} ({kind}) holds {str(data)[:80]!r}")
        return []
    if kind == "Device":
        if not (isinstance(data, list) and len(data) == 2 and all(_is_int(v, -(1 << 31), (1 << 31) - 1) for v in data)):
            raise bad(f"node {i} (Device) holds {str(data)[:80]!r}, not [device type, device id]")
        return []
    if kind in ("ffi.Shape", "ffi.Array", "ffi.List", "ffi.Map", "ffi.Dict"):
        if not isinstance(data, list) or not all(_is_int(v) for v in data):
            raise bad(f"node {i} ({kind}) holds {str(data)[:80]!r}, not a list of integers")
        if kind in ("ffi.Map", "ffi.Dict") and len(data) % 2:
            raise bad(f"node {i} ({kind}) holds {len(data)} indices, not key and value pairs")
        return [] if kind == "ffi.Shape" else data
    if kind == "ffi.Bytes" or kind == "ffi.Tensor":
        import base64
        import binascii

        problem = _tensor_problem(data) if kind == "ffi.Tensor" else None
        if kind == "ffi.Bytes":
            try:
                base64.b64decode(data if isinstance(data, str) else "?", validate=True)
            except (binascii.Error, ValueError):
                problem = "data is not base64"
        if problem:
            raise bad(f"node {i} ({kind}): {problem}")
        return []
    fields = _fields(kind)
    if fields is None:
        raise bad(f"node {i} has type {kind[:80]!r}, which is not an object type of this TVM")
    if kind in _NAMED_TYPES:
        if not isinstance(data, str) or len(data) > 256:
            raise bad(f"node {i} ({kind}) holds {str(data)[:80]!r}, not a name")
        return []
    if kind.startswith("ffi.") or _decodes_itself(kind) or not _has_creator(kind):
        raise bad(f"node {i} has type {kind!r}, which tvm.ir.save_json does not write as fields")
    if not isinstance(data, dict):
        raise bad(f"node {i} ({kind}) holds {str(data)[:80]!r}, not its fields")
    refs = []
    for name, value in data.items():
        schema = fields.get(name)
        if schema is None:
            raise bad(f"node {i} ({kind}) has field {str(name)[:80]!r}; the type's fields are {sorted(fields)}")
        if schema in _INLINE_FIELDS:
            if not scalar[schema](value):
                raise bad(f"node {i} ({kind}) field {name} holds {str(value)[:80]!r}, expected a {schema}")
            continue
        if not _is_int(value):
            raise bad(f"node {i} ({kind}) field {name} holds {str(value)[:80]!r}, expected a node index")
        if 0 <= value < i and nodes[value].get("type") == "None" and schema not in _NULLABLE_TYPES:
            raise bad(f"node {i} ({kind}) field {name} is null; its type {schema} is not optional")
        refs.append(value)
    return refs


def checked_ir_json(text: str, where: str) -> str:
    """``text`` (a pack's TVM JSON) checked against what TVM's loader trusts (see above), re-encoded
    as the JSON that was checked. Raises :class:`IRJsonError` naming ``where``, the node and what it
    holds."""

    def bad(problem: str) -> Exception:
        return IRJsonError(f"{where}: {problem}; expected TVM JSON written by tvm.ir.save_json; refused")

    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise bad(f"not JSON ({str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise bad(f"a JSON {type(data).__name__}, not an object")
    nodes, root = data.get("nodes"), data.get("root_index")
    if not isinstance(nodes, list) or not nodes or len(nodes) > MAX_IR_NODES:
        raise bad(f"'nodes' is not a list of 1 to {MAX_IR_NODES} nodes")
    if not _is_int(root, 0, len(nodes) - 1):
        raise bad(f"root_index {str(root)[:40]} is not the index of one of its {len(nodes)} nodes")
    depth = [0] * len(nodes)
    for i, node in enumerate(nodes):
        refs = _node_refs(node, i, nodes, bad)
        for j in refs:
            if not _is_int(j, 0, i - 1):
                raise bad(f"node {i} ({node['type']}) refers to node {j}; a node refers only to nodes before it")
        depth[i] = 1 + max((depth[j] for j in refs), default=0)
        if depth[i] > MAX_IR_DEPTH:
            raise bad(f"node {i} ends a chain of {depth[i]} references, deeper than {MAX_IR_DEPTH}")
    checked: dict[str, Any] = {"root_index": root, "nodes": nodes}
    metadata = data.get("metadata")
    if isinstance(metadata, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        checked["metadata"] = metadata
    return json.dumps(checked)


def _take_raised_error() -> str:
    """The error a tvm-ffi call left raised but ignored (TVM's JSON loader ignores failed field
    setters), cleared; "" when none."""
    import ctypes

    from ._tvm import tvm_ffi_paths

    global _ERROR_API
    if _ERROR_API is None:
        lib = ctypes.CDLL(str(Path(tvm_ffi_paths()[2]) / "libtvm_ffi.so"))
        move, dec_ref = lib.TVMFFIErrorMoveFromRaised, lib.TVMFFIObjectDecRef
        move.argtypes, move.restype = [ctypes.POINTER(ctypes.c_void_p)], None
        dec_ref.argtypes = [ctypes.c_void_p]
        _ERROR_API = (move, dec_ref)
    move, dec_ref = _ERROR_API
    handle = ctypes.c_void_p()
    move(ctypes.byref(handle))
    if not handle.value:
        return ""
    # TVMFFIErrorCell after the 24-byte TVMFFIObject header: kind, then message (data, size each)
    cell = (ctypes.c_void_p * 4).from_address(handle.value + 24)
    kind = ctypes.string_at(cell[0], cell[1] or 0).decode(errors="replace") if cell[0] else "Error"
    message = ctypes.string_at(cell[2], cell[3] or 0).decode(errors="replace") if cell[2] else ""
    dec_ref(handle)
    return f"{kind}: {message.splitlines()[0] if message else ''}"[:300]


_ERROR_API = None
