"""Reading a target config: YAML with the line of every key, and the checker of its values.

``_read_yaml`` parses a config's text into plain Python while recording, for each dotted key path,
the line YAML saw it on (``_Lines``); it refuses what is not a config (invalid YAML, alias bombs,
nesting too deep) with a ``ConfigError``. ``_Checker`` is what the section parsers in config.py
call: every mistake becomes a ``ConfigError`` naming the file, the line, the key and what was
expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from .errors import ConfigError


class _Lines:
    """Maps a dotted key path to the line YAML saw it on."""

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}
        self.nodes = 0  # values expanded so far (aliases expand again each time they are used)

    def get(self, path: str) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path.rsplit(".", 1)[0] if "." in path else ""
        return None


#: More values than any real config holds: a file above it is an alias bomb ("billion laughs").
_MAX_YAML_NODES = 20_000


def _to_python(node: yaml.Node, path: str, lines: _Lines, source: str) -> Any:
    lines.nodes += 1
    if lines.nodes > _MAX_YAML_NODES:
        raise ConfigError(
            source,
            None,
            f"expands to more than {_MAX_YAML_NODES} values (YAML aliases used "
            "recursively?); a target config is a few hundred",
            node.start_mark.line + 1,
        )
    lines.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = (
                yaml.safe_load(yaml.serialize(key_node))
                if not isinstance(key_node, yaml.ScalarNode)
                else key_node.value
            )
            if not isinstance(key, str):
                raise ConfigError(
                    source, path or None, f"keys must be strings, found {key!r}", key_node.start_mark.line + 1
                )
            sub = f"{path}.{key}" if path else key
            if key in out:
                raise ConfigError(source, sub, "appears twice in the same mapping", key_node.start_mark.line + 1)
            lines.lines[sub] = key_node.start_mark.line + 1
            out[key] = _to_python(value_node, sub, lines, source)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, f"{path}[{i}]", lines, source) for i, item in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def _read_yaml(text: str, source: str) -> tuple[Any, _Lines]:
    lines = _Lines()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            raise ConfigError(
                source, None, "is empty; expected a mapping with at least `name`, `target` and `pipeline`"
            )
        return _to_python(node, "", lines, source), lines
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        raise ConfigError(source, None, f"is not valid YAML: {exc.problem}", line) from None
    except yaml.YAMLError as exc:  # e.g. ReaderError: control characters, which carry no problem_mark
        raise ConfigError(source, None, f"is not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(source, None, "is not a target config: its YAML nests too deeply") from None


class _Checker:
    def __init__(self, source: str, lines: _Lines):
        self.source = source
        self.lines = lines

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, key, message, self.lines.get(key))

    def mapping(self, value: Any, key: str, allowed: Mapping[str, str] | None = None) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, found {type(value).__name__} {value!r}")
        if allowed is not None:
            for sub in value:
                if sub not in allowed:
                    import difflib

                    close = difflib.get_close_matches(sub, list(allowed), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    expected = ", ".join(sorted(allowed))
                    raise self.fail(f"{key}.{sub}" if key else sub, f"unknown key{hint}; expected one of: {expected}")
        return value

    def typed(self, value: Any, key: str, types: type | tuple[type, ...], what: str) -> Any:
        types_t = types if isinstance(types, tuple) else (types,)
        if isinstance(value, bool) and bool not in types_t:
            raise self.fail(key, f"expected {what}, found {value!r}")
        if not isinstance(value, types_t):
            raise self.fail(key, f"expected {what}, found {type(value).__name__} {value!r}")
        return value
