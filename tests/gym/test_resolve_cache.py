"""Resolutions kept on disk (``$NEMOGYM_CONFIG_CACHE``): a new process reads an
environment's config as NeMo Gym resolved it without starting NeMo Gym's parser, as long as
every file the resolution read is unchanged; refusals and unreadable cache files are never
used. NeMo Gym's own parser (the ``gym_venv``) does each resolution here; a "new process"
is this one with its in-memory cache emptied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import GymVenv, resolve_environments
from nemogym_sdk.gym import resolve as resolve_module

from .test_env_path import NAME, copy_toy


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty disk cache, and an empty in-memory one: as a new process finds them."""
    directory = tmp_path / "cache"
    monkeypatch.setenv(resolve_module.CONFIG_CACHE_ENV_VAR, str(directory))
    monkeypatch.setattr(resolve_module, "_MEMORY", {})
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


def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve_module, "_MEMORY", {})


@pytest.mark.gym
def test_a_new_process_reads_the_resolution_from_disk(
    gym_venv: GymVenv,
    tmp_path: Path,
    cache: Path,
    asked: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first resolution asks NeMo Gym and writes one file; a new process gets an equal
    record from that file without asking; a file under a new key is written per request."""
    copy_toy(tmp_path / "envs")
    (first,) = resolve_environments(gym_venv, [NAME], env_path=[tmp_path / "envs"])
    assert asked == [[NAME]]
    (kept,) = cache.glob("*.json")
    assert not list(cache.glob("*.tmp"))
    new_process(monkeypatch)
    (again,) = resolve_environments(gym_venv, [NAME], env_path=[tmp_path / "envs"])
    assert asked == [[NAME]] and again == first
    assert again.config[NAME]["resources_servers"][NAME]
    assert list(cache.glob("*.json")) == [kept]


@pytest.mark.gym
def test_a_changed_config_is_resolved_again(
    gym_venv: GymVenv,
    tmp_path: Path,
    cache: Path,
    asked: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Editing the config after it was kept: the next process asks NeMo Gym again and sees
    the edit (the file's digest no longer matches)."""
    directory = copy_toy(tmp_path / "envs")
    resolve_environments(gym_venv, [NAME], env_path=[tmp_path / "envs"])
    config = directory / "configs" / f"{NAME}.yaml"
    config.write_text(config.read_text().replace("domain: instruction_following", "domain: games"))
    new_process(monkeypatch)
    (edited,) = resolve_environments(gym_venv, [NAME], env_path=[tmp_path / "envs"])
    assert asked == [[NAME], [NAME]]
    server = edited.config[NAME]["resources_servers"][NAME]
    assert server["domain"] == "games"


@pytest.mark.gym
def test_a_refusal_is_not_kept_and_a_broken_file_is_not_used(
    gym_venv: GymVenv,
    tmp_path: Path,
    cache: Path,
    asked: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A config NeMo Gym refuses leaves no file (the next process asks again); a cache file
    cut short is not read: the resolution is asked for again and the file written whole."""
    directory = copy_toy(tmp_path / "envs")
    config = directory / "configs" / f"{NAME}.yaml"
    good = config.read_text()
    config.write_text(good + "\nbroken: [\n")
    with pytest.raises(ConfigError, match="NeMo Gym's config parser refused"):
        resolve_environments(gym_venv, [NAME], env_path=[tmp_path / "envs"])
    assert not list(cache.glob("*.json"))
    config.write_text(good)
    resolve_environments(gym_venv, [NAME], env_path=[tmp_path / "envs"])
    (kept,) = cache.glob("*.json")
    whole = kept.read_text()
    kept.write_text(whole[: len(whole) // 2])
    new_process(monkeypatch)
    resolve_environments(gym_venv, [NAME], env_path=[tmp_path / "envs"])
    assert asked == [[NAME], [NAME], [NAME]]
    assert kept.read_text() == whole
    kept.write_text('{"format": 1, "answer": null, "digests": []}')
    new_process(monkeypatch)
    resolve_environments(gym_venv, [NAME], env_path=[tmp_path / "envs"])
    assert asked == [[NAME], [NAME], [NAME], [NAME]]
