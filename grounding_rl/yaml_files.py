"""Reading the YAML files this package reads (training configs, ``evaluation/*.yaml`` benchmark definitions,
accelerate configs): ``yaml.safe_load`` semantics, except that a key written twice in one mapping is an error.

PyYAML keeps the later value of a repeated key without a word (YAML 1.2, section 3.2.1.1, requires keys to be unique;
PyYAML does not check), so ``learning_rate`` written twice in a recipe would silently train with the second. Keys
brought in by a merge (``<<: *anchor``) may be overridden, as YAML's merge-key type intends.
"""
from __future__ import annotations

import os

import yaml

from grounding_rl.errors import UserError, reading

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(UserError):
    """A mapping of a YAML file repeats a key; the message names the file, the key and both lines."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that raises :class:`DuplicateKeyError` on a repeated mapping key (compared as written,
    with its resolved tag, so ``1`` and ``"1"`` differ as they do once loaded). ``name`` is the file named in the
    message."""

    name = "<yaml>"

    def flatten_mapping(self, node):
        # called for every mapping (and for each mapping merged into one) before its keys are constructed or merged
        checked = self.__dict__.setdefault("_checked", set())
        if id(node) not in checked:
            checked.add(id(node))
            seen: dict[tuple[str, str], int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                    continue
                key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
                if key in seen:
                    raise DuplicateKeyError(f"{self.name}: key {key_node.value!r} is written twice (lines "
                                            f"{seen[key]} and {line}); keep one")
                seen[key] = line
        super().flatten_mapping(node)


def load_yaml_text(text: str, name: str | os.PathLike = "<yaml>"):
    """The object ``yaml.safe_load(text)`` gives, with repeated mapping keys refused.

    Raises:
        DuplicateKeyError: a key written twice in one mapping (``"NAME: key 'lr' is written twice (lines 3 and 9)"``).
        yaml.YAMLError: not valid YAML (its ``problem_mark`` gives the line).
    """
    loader = UniqueKeyLoader(text)
    loader.name = str(name)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_yaml(path: str | os.PathLike):
    """:func:`load_yaml_text` of a UTF-8 file (a BOM is skipped).

    Raises:
        DuplicateKeyError: a repeated key; UserError: not UTF-8 (:func:`grounding_rl.errors.reading`) or not valid
        YAML (naming the file and line); OSError: the file cannot be read.
    """
    with reading(path), open(path, encoding="utf-8-sig") as handle:
        text = handle.read()
    try:
        return load_yaml_text(text, path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise UserError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None


def key_lines(path: str | os.PathLike) -> dict[str, int]:
    """The 1-based line of each top-level key of the YAML mapping in ``path``, from PyYAML's own node marks
    (``yaml.compose``: quoted and flow-style keys as the loader reads them); ``{}`` when the document is not a mapping.
    Read after :func:`load_yaml` accepted the file (its errors are the user's messages)."""
    with open(path, encoding="utf-8-sig") as handle:
        node = yaml.compose(handle, Loader=yaml.SafeLoader)
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(key.value): key.start_mark.line + 1 for key, _ in reversed(node.value)}  # the first of a repeat
