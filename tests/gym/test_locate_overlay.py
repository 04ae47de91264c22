"""Locating the NeMo Gym venv, and server-directory overlays."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import GYM_VENV_ENV_VAR, GymVenvNotFoundError, find_gym_venv
from nemogym_sdk.gym.overlay import make_overlay

from .fakes import make_venv


def test_missing_venv_is_a_clear_error(tmp_path: Path) -> None:
    """A missing directory names the path and how to create the venv."""
    with pytest.raises(GymVenvNotFoundError, match=r"not found at .*pip install") as caught:
        find_gym_venv(tmp_path / "absent")
    assert isinstance(caught.value, ValueError)


def test_without_a_chosen_venv_the_error_gives_the_install_pages_recipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No path and no ``$NEMOGYM_GYM_VENV`` (a pip user's first run): the message says to
    create the venv anywhere and set the variable, with Python 3.13 under pyenv too, never
    to build it inside ``site-packages``; a chosen path gets the recipe for that path."""
    monkeypatch.delenv(GYM_VENV_ENV_VAR, raising=False)
    monkeypatch.setattr("nemogym_sdk.gym.locate._REPO_ROOT", Path("/nowhere/site-packages"))
    with pytest.raises(GymVenvNotFoundError) as caught:
        find_gym_venv()
    message = str(caught.value)
    assert "python3.13 -m venv ~/venvs/nemo-gym" in message
    assert f"export {GYM_VENV_ENV_VAR}=~/venvs/nemo-gym" in message
    assert "pyenv install 3.13" in message and "install/" in message
    assert "-m venv /nowhere" not in message
    monkeypatch.setenv(GYM_VENV_ENV_VAR, "/opt/gym-venv")
    with pytest.raises(
        GymVenvNotFoundError, match=r"Create it there with `python3.13 -m venv /opt/gym-venv"
    ):
        find_gym_venv()


def test_venv_without_python_or_nemo_gym_is_refused(tmp_path: Path) -> None:
    """A directory without bin/python, or without nemo_gym installed, is not accepted."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(GymVenvNotFoundError, match="no bin/python"):
        find_gym_venv(tmp_path / "empty")
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    (bare / "bin" / "python").write_text("")
    with pytest.raises(GymVenvNotFoundError, match="nemo-gym is not installed"):
        find_gym_venv(bare)


def test_env_var_overrides_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$NEMOGYM_GYM_VENV is used when no path is given; an explicit path still wins."""
    venv = make_venv(tmp_path / "venv")
    monkeypatch.setenv(GYM_VENV_ENV_VAR, str(venv.root))
    found = find_gym_venv()
    assert found.root == venv.root
    assert found.python == venv.root / "bin" / "python"
    assert found.site_packages == venv.root / "lib" / "python3.13" / "site-packages"
    monkeypatch.setenv(GYM_VENV_ENV_VAR, str(tmp_path / "elsewhere"))
    assert find_gym_venv(venv.root) == found
    with pytest.raises(GymVenvNotFoundError, match="elsewhere"):
        find_gym_venv()


def test_overlay_links_everything_and_adds_files(tmp_path: Path) -> None:
    """The overlay mirrors the server dir with symlinks and holds the added files for real."""
    source = tmp_path / "server"
    (source / "data").mkdir(parents=True)
    (source / "app.py").write_text("print('app')")
    (source / "data" / "example.jsonl").write_text("{}\n")
    (source / "configs").mkdir()
    extra = tmp_path / "words.txt"
    extra.write_text("crane\n")
    target = make_overlay(
        source,
        tmp_path / "overlay",
        {"data/guesses.txt": "chump\n", "data/more/words.txt": extra},
    )
    assert (target / "app.py").is_symlink()
    assert (target / "app.py").resolve() == (source / "app.py").resolve()
    assert (target / "configs").is_symlink()
    assert not (target / "data").is_symlink()
    assert (target / "data" / "example.jsonl").read_text() == "{}\n"
    assert (target / "data" / "guesses.txt").read_text() == "chump\n"
    assert (target / "data" / "more" / "words.txt").read_text() == "crane\n"
    assert not (source / "data" / "guesses.txt").exists(), "the source is never written"


def test_overlay_refuses_paths_outside_the_server_dir(tmp_path: Path) -> None:
    """Absolute paths and .. are refused."""
    (tmp_path / "server").mkdir()
    for bad in ("/etc/passwd", "../escape.txt", ""):
        with pytest.raises(ConfigError):
            make_overlay(tmp_path / "server", tmp_path / f"o{len(bad)}", {bad: "x"})
