"""The environment search path: users' own environments started by name, without copying.

Without servers: the path's order and errors (``env_path`` over ``$NEMOGYM_ENV_PATH``; a
missing directory; an unknown name answered with every directory searched), where a user
environment's datasets resolve (NeMo Gym's own parser), and that ``nemogym-train
--env-path`` reaches the stack and the launcher. With NeMo Gym (``gym`` mark): a copy of
the toy ``target_chars`` under another name, outside the SDK, started by ``GymStack`` from
``env_path`` and played against the scripted CPU model server.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nemogym_sdk import AgentClient, RolloutStatus, Timeouts, load_rows
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import (
    ENV_PATH_ENV_VAR,
    SDK_ENVS_DIR,
    GymLauncher,
    GymVenv,
    PolicyModel,
    build_stack_config,
    describe_environment,
    environment_path,
    locate_environment,
    resolve_environments,
)
from nemogym_sdk.train.config import parse_config
from nemogym_sdk.train.recipe import environments

from .fakes import counting_ports
from .stacks import StackFactory

TOY = "target_chars"
NAME = "my_chars"
MODEL = PolicyModel(base_url="http://127.0.0.1:1/v1", model="m")
EOS = 258  # <|im_end|> of the tiny tokenizer the scripted server uses


def copy_toy(into: Path, name: str = NAME) -> Path:
    """``target_chars`` copied to ``into/name`` as a user would write it: its config, server
    names and datasets renamed (datasets relative to the path directory, or to its parent for
    a directory named ``resources_servers``, as NeMo Gym's are)."""
    directory = into / name
    shutil.copytree(SDK_ENVS_DIR / TOY, directory, ignore=shutil.ignore_patterns("__pycache__"))
    prefix = f"resources_servers/{name}/" if into.name == "resources_servers" else f"{name}/"
    config = (directory / "configs" / f"{TOY}.yaml").read_text()
    config = config.replace(f"nemogym_sdk/gym/envs/{TOY}/", prefix).replace(TOY, name)
    (directory / "configs" / f"{TOY}.yaml").unlink()
    (directory / "configs" / f"{name}.yaml").write_text(config)
    for rows in (directory / "data").glob("*.jsonl"):
        text = rows.read_text().replace(f'"{TOY}_agent"', f'"{name}_agent"')
        rows.write_text(text)
    return directory


def bare_venv(root: Path) -> GymVenv:
    """A venv record with NeMo Gym's ``resources_servers/toy``: enough for the lookup,
    which runs nothing."""
    site = root / "lib" / "python3.13" / "site-packages"
    (site / "resources_servers" / "toy" / "configs").mkdir(parents=True)
    return GymVenv(root=root, python=root / "bin" / "python", site_packages=site)


# ------------------------------------------------------------------ without servers


def test_the_path_comes_from_the_argument_else_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries are made absolute and kept once, in order; the variable is split on
    os.pathsep (empty parts skipped) and read only when no argument is given."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(tmp_path)
    assert environment_path(["b", first, str(second)]) == (second, first)
    monkeypatch.setenv(ENV_PATH_ENV_VAR, f"{first}{os.pathsep}{os.pathsep}b")
    assert environment_path() == (first, second)
    assert environment_path([]) == ()  # an explicit empty path wins over the variable
    monkeypatch.delenv(ENV_PATH_ENV_VAR)
    assert environment_path() == ()


def test_a_bad_path_entry_is_a_config_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory that does not exist, a file, or one string instead of a list."""
    missing, afile = tmp_path / "missing", tmp_path / "file"
    afile.write_text("")
    with pytest.raises(ConfigError, match=rf"{missing} \(in env_path\) does not exist"):
        environment_path([tmp_path, missing])
    with pytest.raises(ConfigError, match=rf"{afile} \(in env_path\) is not a directory"):
        environment_path([afile])
    monkeypatch.setenv(ENV_PATH_ENV_VAR, str(missing))
    with pytest.raises(ConfigError, match=rf"{missing} \(in \${ENV_PATH_ENV_VAR}\)"):
        locate_environment(bare_venv(tmp_path / "venv"), TOY)
    with pytest.raises(ConfigError, match="a sequence of directories"):
        environment_path(str(tmp_path))


def test_the_path_comes_first_and_its_first_directory_wins(tmp_path: Path) -> None:
    """Lookup order: the path (first directory holding the name), the SDK's, NeMo Gym's;
    a user's directory shadows a shipped environment of the same name."""
    venv = bare_venv(tmp_path / "venv")
    first, second = tmp_path / "first", tmp_path / "second"
    for name in (NAME, TOY, "toy"):
        (first / name).mkdir(parents=True)
    (second / NAME).mkdir(parents=True)
    (second / "other").mkdir()
    path = [first, second]
    mine = locate_environment(venv, NAME, path)
    assert (mine.directory, mine.root, mine.path_entry) == (first / NAME, first, first)
    assert not mine.shipped_with_sdk
    assert locate_environment(venv, NAME, path[::-1]).directory == second / NAME
    assert locate_environment(venv, "other", path).directory == second / "other"
    assert locate_environment(venv, TOY, path).directory == first / TOY  # shadows the SDK's
    assert locate_environment(venv, "toy", path).directory == first / "toy"  # and NeMo Gym's
    variant = locate_environment(venv, f"{NAME}:fast", path)
    assert variant.config_path == first / NAME / "configs" / "fast.yaml"
    shipped = locate_environment(venv, TOY, [second])
    assert shipped.shipped_with_sdk and shipped.path_entry is None
    nemo_gym = locate_environment(venv, "toy", [])
    assert nemo_gym.directory == venv.resources_server_dir("toy") and nemo_gym.path_entry is None


def test_an_unknown_name_says_where_it_looked_and_how_to_add_one(tmp_path: Path) -> None:
    """Every directory searched is named, close names are suggested (from the path too),
    and the three ways to add a directory; a directory without configs is named as such."""
    venv = bare_venv(tmp_path / "venv")
    (venv.resources_server_dir("toy") / "configs" / "toy.yaml").write_text("{}")
    copy_toy(tmp_path / "envs")
    (tmp_path / "envs" / "empty").mkdir()
    with pytest.raises(ConfigError) as raised:
        resolve_environments(venv, ["my_chrs"], env_path=[tmp_path / "envs"])
    message = str(raised.value)
    assert message.startswith("unknown NeMo Gym environment 'my_chrs'")
    searched = (tmp_path / "envs", SDK_ENVS_DIR, venv.site_packages / "resources_servers")
    assert all(str(directory) in message for directory in searched)
    assert "did you mean 'my_chars'" in message
    for way in ("env_path", f"${ENV_PATH_ENV_VAR}", "nemogym-train --env-path"):
        assert way in message
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'envs' / 'empty'} has no configs"):
        resolve_environments(venv, ["empty"], env_path=[tmp_path / "envs"])


@pytest.mark.parametrize("layout", ["envs", "resources_servers"])
def test_datasets_resolve_in_the_users_directory(
    gym_venv: GymVenv, tmp_path: Path, layout: str
) -> None:
    """NeMo Gym's parser resolves the copy's datasets against the path directory (against
    its parent for ``resources_servers``, so NeMo Gym's own layout works unchanged)."""
    directory = copy_toy(tmp_path / layout)
    stack = build_stack_config(
        gym_venv, [NAME], MODEL, env_path=[tmp_path / layout], allocate_ports=counting_ports()
    )
    (setup,) = stack.environments
    assert setup.config_path == directory / "configs" / f"{NAME}.yaml"
    assert setup.example_path == directory / "data" / "example.jsonl"
    assert setup.train_path == directory / "data" / "train.jsonl"
    assert setup.agents == (f"{NAME}_agent",) and setup.resources_servers == (NAME,)
    info = describe_environment(gym_venv, NAME, env_path=[tmp_path / layout])
    assert info.num_examples == 5 and not info.shipped_with_sdk


def test_the_launcher_runs_the_users_directory(gym_venv: GymVenv, tmp_path: Path) -> None:
    """GymLauncher links each server's directory into NEMO_GYM_EXTRA_ROOTS from the same
    lookup: the user's directory itself, its interpreter NeMo Gym's venv."""
    directory = copy_toy(tmp_path / "envs")
    launcher = GymLauncher([NAME], MODEL, venv=gym_venv, env_path=[tmp_path / "envs"])
    workdir = tmp_path / "work"
    launch = launcher.builder.launch(launcher.builder.build(workdir), workdir)
    assert launch.server_dirs[f"resources_servers/{NAME}"] == directory
    assert launch.server_envs[f"resources_servers/{NAME}"].root is None


def test_nemogym_train_env_path_reaches_the_stack_and_the_launcher(
    gym_venv: GymVenv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--env-path parses to TrainConfig.env_path and finds the environment; a missing
    directory from the flag is refused by the config (before the sampler starts), from the
    variable by environments(), before any server starts, under both launchers."""
    copy_toy(tmp_path / "envs")
    flags = ["--env-path", str(tmp_path / "envs"), "--environments", NAME, "--steps", "1"]
    config = parse_config(flags)
    assert config.env_path == (str(tmp_path / "envs"),) and config.environments == (NAME,)
    location = locate_environment(gym_venv, NAME, config.env_path)
    assert location.config_path == tmp_path / "envs" / NAME / "configs" / f"{NAME}.yaml"
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError, match=rf"env_path: {missing} is not a directory"):
        parse_config(["--env-path", str(missing)])
    monkeypatch.setenv(ENV_PATH_ENV_VAR, str(missing))
    for launcher in ("stack", "gym"):
        config = parse_config(["--launcher", launcher])
        raised = pytest.raises(ConfigError, match=rf"\(in \${ENV_PATH_ENV_VAR}\)")
        with raised, environments(config, MODEL.base_url, tmp_path / "out"):
            pass


# --------------------------------------------------------------------- real NeMo Gym


@pytest.mark.gym
@pytest.mark.slow
def test_a_users_environment_starts_from_the_path_and_plays(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    """The renamed copy starts by name from env_path, runs in the user's directory, and
    every rollout of its example rows is OK with a reward in [0, 1]; nothing is written
    into that directory."""
    directory = copy_toy(tmp_path / "envs")
    with stack_factory([NAME], env_path=[tmp_path / "envs"]) as stack:
        assert stack.environment(NAME).agent == f"{NAME}_agent"
        rows = load_rows(stack.example_paths[NAME])
        timeouts = Timeouts(request=300.0, total=600.0)
        with AgentClient(stack.directory, timeouts=timeouts) as client:
            rollouts = client.run_sync(rows, eos_token_id=EOS, num_generations=2)
        log = stack.log_paths[NAME].read_text()
    assert len(rollouts) == 10
    for rollout in rollouts:
        assert rollout.status is RolloutStatus.OK, rollout.error
        assert rollout.num_turns == 3 and 0.0 <= rollout.reward <= 1.0
    assert f"cwd={str(directory)!r}" in log
    assert not list(directory.rglob("__pycache__"))
