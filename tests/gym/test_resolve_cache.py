"""Resolutions kept on disk (``$NEMOGYM_CONFIG_CACHE``): a new process reads an
environment's config as NeMo Gym resolved it without starting NeMo Gym's parser, as long as
every file the resolution read is unchanged; refusals and unreadable cache files are never
used. NeMo Gym's own parser (the ``gym_venv``) does each resolution here; a "new process"
is this one with its in-memory cache emptied."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import GymVenv, ResolvedEnvironment, resolve_environments
from nemogym_sdk.gym import resolve as resolve_module

from .test_env_path import NAME, copy_toy


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty disk cache, as a new machine has it."""
    directory = tmp_path / "cache"
    monkeypatch.setenv(resolve_module.CONFIG_CACHE_ENV_VAR, str(directory))
    return directory


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The environments each request to NeMo Gym's parser asked for, in order."""
    requests: list[list[str]] = []
    real = resolve_module._run_resolver

    def counting(venv: GymVenv, entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        requests.append([entry["name"] for entry in entries])
        return real(venv, entries)

    monkeypatch.setattr(resolve_module, "_run_resolver", counting)
    return requests


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The config of ``target_chars`` copied as ``my_chars`` into ``<tmp>/envs``."""
    return copy_toy(tmp_path / "envs") / "configs" / f"{NAME}.yaml"


@pytest.fixture
def resolve(
    gym_venv: GymVenv, config: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[], ResolvedEnvironment]:
    """Resolve the copy as a new process would: this process's memory emptied first."""

    def resolve_copy() -> ResolvedEnvironment:
        monkeypatch.setattr(resolve_module, "_MEMORY", {})
        (resolved,) = resolve_environments(gym_venv, [NAME], env_path=[config.parents[2]])
        return resolved

    return resolve_copy


@pytest.mark.gym
def test_a_new_process_reads_the_resolution_from_disk(
    resolve: Callable[[], ResolvedEnvironment], cache: Path, asked: list[list[str]]
) -> None:
    """The first resolution asks NeMo Gym and writes one file; a new process gets an equal
    record from that file without asking, and writes nothing more."""
    first = resolve()
    assert asked == [[NAME]]
    (kept,) = cache.glob("*.json")
    assert not list(cache.glob("*.tmp"))
    again = resolve()
    assert asked == [[NAME]] and again == first
    assert again.config[NAME]["resources_servers"][NAME]
    assert list(cache.glob("*.json")) == [kept]


@pytest.mark.gym
def test_a_changed_config_is_resolved_again(
    resolve: Callable[[], ResolvedEnvironment],
    config: Path,
    cache: Path,
    asked: list[list[str]],
) -> None:
    """Editing the config after it was kept: the next process asks NeMo Gym again and sees
    the edit (the file's digest no longer matches)."""
    resolve()
    config.write_text(config.read_text().replace("domain: instruction_following", "domain: games"))
    edited = resolve()
    assert asked == [[NAME], [NAME]]
    assert edited.config[NAME]["resources_servers"][NAME]["domain"] == "games"


@pytest.mark.gym
def test_a_refusal_is_not_kept_and_a_broken_file_is_not_used(
    resolve: Callable[[], ResolvedEnvironment],
    config: Path,
    cache: Path,
    asked: list[list[str]],
) -> None:
    """A config NeMo Gym refuses leaves no file (the next process asks again); a cache file
    cut short, or of the right format but the wrong shape, is not read: the resolution is
    asked for again and the file written whole."""
    good = config.read_text()
    config.write_text(good + "\nbroken: [\n")
    with pytest.raises(ConfigError, match="NeMo Gym's config parser refused"):
        resolve()
    assert not list(cache.glob("*.json"))
    config.write_text(good)
    resolve()
    (kept,) = cache.glob("*.json")
    whole = kept.read_text()
    kept.write_text(whole[: len(whole) // 2])
    resolve()
    assert asked == [[NAME], [NAME], [NAME]]
    assert kept.read_text() == whole
    kept.write_text('{"format": 1, "answer": null, "digests": []}')
    resolve()
    assert asked == [[NAME], [NAME], [NAME], [NAME]]
