"""NeMo Gym's config directives: ``_inherit_from``, ``_copy``, ``_delete_key``.

A NeMo Gym config may build one block from another, after every included config is merged:

* ``X: {_inherit_from: a.b, k: v}`` is the block at the dotted path ``a.b`` with ``k: v``
  merged over it, and ``a.b`` is removed (the block moves: an SWE variant inherits the
  ``opencode_sandboxed_agent`` instance its included config defines and rebinds it);
* ``X: {_copy: a.b, ...}`` is the same without removing ``a.b``;
* ``"${inherit_from:a.b}"`` and ``"${copy:a.b}"`` as a value are the value at ``a.b``
  (moved or copied);
* ``_delete_key: "k1, k2"`` in a block removes those keys from it, after any merge.

Paths are looked up in the config as it was before any directive ran, as NeMo Gym does
(``GlobalConfigDictParser._recursively_swap_keys``), in one pass. One form is left for
:func:`~nemogym_sdk.gym.config.build_stack_config`: a top-level ``{_copy: <instance>}`` with
nothing else (``simulator_model: {_copy: policy_model}``), a model server configured like
another, which may be the policy the stack itself adds.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from nemogym_sdk.errors import ConfigError

__all__ = ["deep_merge", "is_copy", "resolve_directives"]

INHERIT, COPY, DELETE = "_inherit_from", "_copy", "_delete_key"
_INHERIT_VALUE, _COPY_VALUE = "${inherit_from:", "${copy:"


def is_copy(node: Any) -> bool:
    """``{_copy: <instance>}``: NeMo Gym's shorthand for a server configured like another."""
    return isinstance(node, Mapping) and set(node) == {COPY} and isinstance(node[COPY], str)


def resolve_directives(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``config`` with its directives carried out; ``ConfigError`` (naming ``where``, the
    config file) for a path that names nothing or a merge that cannot be done."""
    resolved = copy.deepcopy(dict(config))
    _resolve(resolved, resolved, copy.deepcopy(resolved), where, top=True)
    return resolved


def _resolve(
    node: dict[str, Any], root: dict[str, Any], frozen: Mapping[str, Any], where: str, *, top: bool
) -> None:
    for key, value in list(node.items()):
        if key not in node:  # moved away by an _inherit_from below it
            continue
        if isinstance(value, dict):
            _resolve(value, root, frozen, where, top=False)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    _resolve(item, root, frozen, where, top=False)
        if top and is_copy(value):
            continue  # build_stack_config wires copies of model servers
        node[key] = _carry_out(value, root, frozen, where, f"{key}")


def _carry_out(
    value: Any, root: dict[str, Any], frozen: Mapping[str, Any], where: str, key: str
) -> Any:
    """What ``value`` becomes once its own directive (if any) is carried out."""
    path, moves = _directive(value)
    if path is None:
        if isinstance(value, dict) and DELETE in value:
            keys = value.pop(DELETE)
            return _delete(value, keys, where, key)
        return value
    source = _lookup(frozen, path, where, key)
    if moves:
        _remove(root, path)
    if not isinstance(value, dict):
        return copy.deepcopy(source)
    if not isinstance(source, Mapping):
        raise ConfigError(f"{where}: {key!r} builds on {path!r}, which is not a mapping")
    own = {k: v for k, v in value.items() if k not in (INHERIT, COPY, DELETE)}
    merged = deep_merge(source, own)
    return _delete(merged, value[DELETE], where, key) if DELETE in value else merged


def _directive(value: Any) -> tuple[str | None, bool]:
    """(the dotted path a value builds on, whether it moves it) or (None, False)."""
    if isinstance(value, str):
        for prefix, moves in ((_INHERIT_VALUE, True), (_COPY_VALUE, False)):
            if value.startswith(prefix) and value.endswith("}"):
                return value[len(prefix) : -1], moves
    if isinstance(value, dict):
        for name, moves in ((INHERIT, True), (COPY, False)):
            if isinstance(value.get(name), str):
                return str(value[name]), moves
    return None, False


def _lookup(frozen: Mapping[str, Any], path: str, where: str, key: str) -> Any:
    node: Any = frozen
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ConfigError(f"{where}: {key!r} builds on {path!r}, which the config lacks")
        node = node[part]
    return node


def _remove(root: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    node: Any = root
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)  # several blocks may move the same source


def _delete(block: dict[str, Any], keys: Any, where: str, key: str) -> dict[str, Any]:
    names = [k.strip() for k in str(keys).split(",") if k.strip()]
    missing = [name for name in names if name not in block]
    if missing:
        raise ConfigError(f"{where}: {key!r} deletes {', '.join(missing)}, which it lacks")
    return {k: v for k, v in block.items() if k not in names}


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in, mappings recursively, everything copied."""
    merged = {key: copy.deepcopy(value) for key, value in base.items()}
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
