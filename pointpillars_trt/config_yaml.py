"""Config YAML as untrusted input: one document of plain mappings, lists and scalars, read within bounds.

Aliases (a 2 KB "billion laughs" file expands to gigabytes), deep nesting, keys that are not names, repeated
keys and oversized files are refused, each with the line and the key path, as the config validator spells
paths (``key_path``); no message echoes more than a short escaped excerpt of a value."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, InputError, escape_text, safe_repr
from .file_reads import overlong_number, read_regular_file

MAX_CONFIG_BYTES = 1 << 20  # far above any real config; bounds the parser's time and memory
MAX_YAML_DEPTH = 32  # configs nest 4 deep; the composer recurses once per level


_STR_TAG = "tag:yaml.org,2002:str"


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader without aliases or repeated keys, and with a nesting cap.

    Aliases are what make a 2 KB "billion laughs" file expand to gigabytes, and no config needs them;
    deep nesting would otherwise end in a RecursionError inside the composer; a key given twice in one
    mapping (two ``voxel:`` blocks) would silently keep its last value, whichever one the author meant.
    """

    _depth = 0

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path = ""  # key path of the node being composed, spelled as the validator spells paths
        self._mapping_paths: dict[yaml.MappingNode, str] = {}  # for naming a repeated key by its path

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not allowed in a config", self.peek_event().start_mark
            )
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", self.peek_event().start_mark
            )
        outer = self._path
        if isinstance(index, int):  # a sequence item; a mapping value's index is its key node
            self._path = f"{outer}[{index}]"
        elif isinstance(index, yaml.ScalarNode):
            if index.tag != _STR_TAG:  # refused as composed: 30k number keys are never composed whole (~4 s)
                raise self._key_error(outer, self.construct_object(index), index)
            self._path = key_path(outer, index.value)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._path = outer

    def compose_mapping_node(self, anchor: Any) -> Any:
        node = super().compose_mapping_node(anchor)
        self._mapping_paths[node] = self._path
        return node

    @staticmethod
    def _key_error(path: str, key: object, node: yaml.Node) -> yaml.constructor.ConstructorError:
        return yaml.constructor.ConstructorError(
            None, None, f"{key_path(path, str(key)[:40])}: a key of type {type(key).__name__}; a config's keys are names",
            node.start_mark)

    def construct_yaml_int(self, node: Any) -> int:
        """An integer, refused where it is longer than any count or size (``overlong_number``; YAML's ``_``
        separators left out, as PyYAML leaves them out), which ``int()`` refuses past 4,300 digits with a
        ValueError that names neither the line nor the problem."""
        digits = overlong_number(str(node.value).replace("_", ""))
        if digits is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {digits} digits: no config value is that long", node.start_mark)
        return int(super().construct_yaml_int(node))

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """The mapping, refusing a key that is no string (every config key is a name) or that repeats."""
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)  # a key that an inline ``<<:`` merge gives too counts as given twice
            first_seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, str):  # numbers hash alike by design: 40k keys k * (2**61 - 1) cost minutes
                    raise self._key_error(self._mapping_paths[node], key, key_node)
                if key in first_seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{key_path(self._mapping_paths[node], key)}: key given twice (first at line "
                        f"{first_seen[key].start_mark.line + 1})", key_node.start_mark)
                first_seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)


def read_yaml(path: Path) -> Any:
    """A YAML file's document, refusing anything but a regular file (a FIFO would block the read for ever)
    and files over MAX_CONFIG_BYTES before parsing them."""
    try:
        os.lstat(path)  # not os.path.lexists: a folder on the path this user cannot search is no missing file
    except FileNotFoundError:
        raise ConfigError(f"{safe_repr(path)}: config file not found") from None
    except OSError:
        pass  # read_regular_file names the problem
    try:
        data = read_regular_file(path, max_bytes=MAX_CONFIG_BYTES, what="config file")
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    document = parse_yaml(data, safe_repr(path))
    if document is None and not _yaml_content(data):  # else "expected a mapping, got None", of a file of nothing
        raise ConfigError(f"{safe_repr(path)}: the config file is empty{' but for comments' if data.strip() else ''}: "
                          "it holds no config")
    return document


def _yaml_content(data: bytes) -> bool:
    """Whether a YAML file's bytes hold anything but blank lines, comments and document markers."""
    return any(line.strip() and not line.lstrip().startswith(b"#") and line.strip() not in (b"---", b"...")
               for line in data.splitlines())


def parse_yaml(data: bytes, source: str) -> Any:
    """Parse one YAML document with ``_ConfigLoader``; every failure is a short ConfigError naming ``source`` (the
    document as messages show it: a file's ``safe_repr``)."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: larger than {MAX_CONFIG_BYTES} bytes; not a config")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        where = f" at line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}" if exc.problem_mark else ""
        raise ConfigError(f"{source}: not a valid config YAML{where}: {escape_text(str(exc.problem), 120)}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: e.g. an integer of 5000 digits
        raise ConfigError(f"{source}: not a valid config YAML ({type(exc).__name__})") from None


#: A plain name: a config key shown as it is in key paths, and what a config's names (its own, its classes') may be.
PLAIN_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")


def key_path(path: str, key: object) -> str:
    """``path.key``: a config key's path as messages spell it, the key escaped unless it is a plain name."""
    text = key if isinstance(key, str) and PLAIN_NAME.fullmatch(key) else safe_repr(key, 40)
    return f"{path}.{text}" if path else str(text)
