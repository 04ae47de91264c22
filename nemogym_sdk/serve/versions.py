"""Adapter versions served side by side, and which one answers a request.

``LoraSync`` publishes every new adapter under one name (``policy``), which is also the
name NeMo Gym's model server asks for every turn; its load request says which version
it is (``nemogym_sdk.wire.LOAD_VERSION_FIELD``). `ServedVersions` turns that into slots
the backend holds:

* ``keep = 1`` (the default): one slot named like the adapter, reloaded in place: today's
  behaviour, with the version now known.
* ``keep = N > 1``: each version gets its own slot, ``<name>@v<version>``, and the newest
  ``N`` stay loaded (older ones are unloaded as new ones arrive). An asynchronous trainer
  with staleness bound ``K`` needs ``N >= K + 2``: the versions its in-flight episodes
  started on, plus the one being published.

Which version answers a request for the adapter's name (``policy``):

* ``pinned`` (the default): the version the episode started on. The request carries it:
  every earlier assistant message of the conversation holds the version that generated it
  (the ``routed_experts`` envelope, ``nemogym_sdk.wire.versions``), so the newest of those
  is the episode's. A first turn gets the newest version. If the episode's version is no
  longer loaded, the newest answers, and the turn's envelope says so.
* ``in_flight``: always the newest version; per-token versions tell the learner.

Whatever answers, the answer's envelope names it: the rollout records what really ran.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.policy import VERSION_POLICIES, VersionPolicy
from nemogym_sdk.wire import (
    CARD_VERSIONS_FIELD,
    CARD_VERSIONS_KEPT_FIELD,
    ROLE,
    ROUTED_EXPERTS,
    read_policy_version,
)

__all__ = [
    "VERSION_POLICIES",
    "Loading",
    "ServedVersion",
    "ServedVersions",
    "VersionPolicy",
    "episode_version",
    "version_cards",
]


@attrs.frozen
class ServedVersion:
    """One loaded version of an adapter."""

    name: str
    """The adapter's public name (what requests ask for)."""
    version: int
    """Its policy version (``LoraSync``'s numbering)."""
    slot: str
    """The name the backend holds it under."""
    path: str
    """Where it was loaded from."""


@attrs.frozen
class Loading:
    """What the backend must do to load a new version."""

    slot: str
    """Load into this slot..."""
    replace: bool
    """...in place (it holds an older version of the same name, or the same version)."""
    evict: tuple[str, ...]
    """Slots to unload afterwards (versions beyond ``keep``)."""


def episode_version(messages: Sequence[Mapping[str, Any]]) -> int | None:
    """The version of the newest assistant message that reports one (None: none does)."""
    for message in reversed(messages):
        if message.get(ROLE) == "assistant":
            version = read_policy_version(message.get(ROUTED_EXPERTS))
            if version is not None:
                return version
    return None


class ServedVersions:
    """The loaded versions of each adapter name (thread-safe)."""

    def __init__(self, keep: int = 1, policy: VersionPolicy = "pinned") -> None:
        if keep < 1:
            raise ConfigError(f"adapter versions to keep must be >= 1, got {keep}")
        if policy not in VERSION_POLICIES:
            raise ConfigError(
                f"version policy must be one of {', '.join(VERSION_POLICIES)}, got {policy!r}"
            )
        self.keep = keep
        self.policy: VersionPolicy = policy
        self._versions: dict[str, list[ServedVersion]] = {}  # oldest first
        self._lock = threading.Lock()

    def slot_for(self, name: str, version: int) -> str:
        """The slot ``version`` of ``name`` is held in."""
        return name if self.keep == 1 else f"{name}@v{version}"

    def plan(self, name: str, version: int) -> Loading:
        """How to load ``version`` of ``name`` (call `commit` once the backend has)."""
        slot = self.slot_for(name, version)
        with self._lock:
            held = self._versions.get(name, [])
            replace = any(v.slot == slot for v in held)
            kept = [v for v in held if v.slot != slot][-(self.keep - 1) :] if self.keep > 1 else []
            evict = tuple(v.slot for v in held if v.slot != slot and v not in kept)
        return Loading(slot=slot, replace=replace, evict=evict)

    def commit(self, name: str, version: int, path: str, loading: Loading) -> None:
        """Record a finished load (and the evictions it planned)."""
        with self._lock:
            held = [
                v
                for v in self._versions.get(name, [])
                if v.slot != loading.slot and v.slot not in loading.evict
            ]
            held.append(ServedVersion(name=name, version=version, slot=loading.slot, path=path))
            self._versions[name] = held

    def retain(self, slots: set[str]) -> None:
        """Forget the versions whose slot the backend no longer holds (after a failed load)."""
        with self._lock:
            for name, held in list(self._versions.items()):
                self._versions[name] = [v for v in held if v.slot in slots]

    def forget(self, name: str) -> tuple[str, ...]:
        """Drop every version of ``name``; returns their slots (to unload)."""
        with self._lock:
            return tuple(v.slot for v in self._versions.pop(name, []))

    def names(self) -> dict[str, list[ServedVersion]]:
        """Each versioned adapter name, its loaded versions oldest first."""
        with self._lock:
            return {name: list(held) for name, held in self._versions.items()}

    def resolve(
        self, requested: str | None, messages: Sequence[Mapping[str, Any]]
    ) -> ServedVersion | None:
        """The version that answers a request for ``requested`` (None: not a versioned name)."""
        if requested is None:
            return None
        with self._lock:
            held = self._versions.get(requested)
            if not held:
                return next(
                    (v for vs in self._versions.values() for v in vs if v.slot == requested), None
                )
            if self.policy == "pinned":
                started = episode_version(messages)
                for candidate in held:
                    if candidate.version == started:
                        return candidate
            return held[-1]


def version_cards(
    cards: list[dict[str, Any]], versions: ServedVersions, make_card: Any
) -> list[dict[str, Any]]:
    """``GET /v1/models`` cards as clients see them: a versioned adapter is one card under
    its public name (``root`` the newest version's path, plus the versions loaded and how
    many are kept); the per-version slots are not listed on their own. Only versions whose
    slot the backend lists count: a card never claims an adapter the backend lost.

    ``make_card(name, root)`` builds the public card when the backend lists only slots.
    """
    listed = {card.get("id") for card in cards}
    served = {
        name: [v for v in held if v.slot in listed] for name, held in versions.names().items()
    }
    slots = {v.slot for held in served.values() for v in held}
    out = [card for card in cards if card.get("id") not in slots or card.get("id") in served]
    for name, held in served.items():
        if not held:
            continue
        card = next((c for c in out if c.get("id") == name), None)
        if card is None:
            card = make_card(name, held[-1].path)
            out.append(card)
        card["root"] = held[-1].path
        card[CARD_VERSIONS_FIELD] = [v.version for v in held]
        card[CARD_VERSIONS_KEPT_FIELD] = versions.keep
    return out
