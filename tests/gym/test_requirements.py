"""Per-server requirements: filtering, cache keys, the stamp and rebuild logic, uv errors.

Most tests build against a miniature NeMo Gym venv with a fake ``uv`` (a small Python
script that records its calls), so they need neither the network nor NeMo Gym. The
tests marked ``gym`` read the shipped servers' files and run the real uv.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import sys
import threading
from pathlib import Path

import pytest

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym import (
    GymVenv,
    RequirementsInstallError,
    ServerStartError,
    UvNotFoundError,
    find_uv,
    prepare_server_environment,
    read_server_requirements,
)
from nemogym_sdk.gym import server_envs as reqs
from nemogym_sdk.gym.server_envs import STAMP_NAME, environment_key

FAKE_UV = """\
import json, os, sys, time
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_UV_CALLS"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[0] == "venv":
    target = Path(args[-1])
    if target.exists() and "--allow-existing" not in args:  # as the real uv refuses
        print("error: Failed to create virtual environment", file=sys.stderr)
        print(f"  cause: A directory already exists at: {target}", file=sys.stderr)
        sys.exit(2)
    (target / "bin").mkdir(parents=True, exist_ok=True)
    (target / "bin" / "python").symlink_to(sys.executable)
    time.sleep(float(os.environ.get("FAKE_UV_SLEEP", "0")))
elif args[:2] == ["pip", "install"]:
    text = Path(args[args.index("-r") + 1]).read_text()
    if "no-such-package" in text:
        print("error: No solution found when resolving dependencies", file=sys.stderr)
        print("  no-such-package was not found in the package registry", file=sys.stderr)
        sys.exit(1)
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _mini_venv(root: Path) -> GymVenv:
    """A venv-shaped directory with a nemo-gym dist-info (no real packages)."""
    site = root / "lib" / "python3.13" / "site-packages"
    _write(
        site / "nemo_gym-0.7.0.dist-info" / "METADATA",
        "Name: nemo-gym\nVersion: 0.7.0\nRequires-Python: >=3.13.14\n",
    )
    _write(site / "openai-2.44.0.dist-info" / "METADATA", "Name: openai\nVersion: 2.44.0\n")
    _write(root / "pyvenv.cfg", "home = /usr/bin\nversion = 3.13.0\n")
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    return GymVenv(root=root, python=root / "bin" / "python", site_packages=site)


@pytest.fixture
def fake_uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Path]:
    """The fake uv's command line and the file its calls are appended to."""
    script = _write(tmp_path / "fake_uv.py", FAKE_UV)
    calls = tmp_path / "uv_calls.jsonl"
    monkeypatch.setenv("FAKE_UV_CALLS", str(calls))
    return [sys.executable, str(script)], calls


def _calls(path: Path) -> list[list[str]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _server(venv: GymVenv, impl: str, requirements: str) -> Path:
    return _write(venv.server_dir("resources_servers", impl) / "requirements.txt", requirements)


# ----------------------------------------------------------------------------- filtering


def test_self_references_comments_and_blanks_are_dropped(tmp_path: Path) -> None:
    """Every spelling of the nemo-gym line goes; its non-dev extras are kept."""
    server = tmp_path / "resources_servers" / "demo"
    _write(
        server / "requirements.txt",
        "# SPDX header\n"
        "-e nemo-gym[dev] @ ../../\n"
        "\n"
        "-e nemo-gym[dev,sandbox] @ ../..\n"
        "--editable=../../\n"
        "-e ../..[dev]\n"
        "nemo_gym>=0.6\n"
        "Nemo.Gym\n"
        "math-verify==0.8.0   # inline comment\n"
        "   \n"
        "tool @ git+https://example.invalid/t.git@abc#subdirectory=tools\n"
        "--extra-index-url https://example.invalid/simple/\n"
        "numpy>=1.26,\\\n"
        "<3\n",
    )
    wanted = read_server_requirements(server)
    assert wanted.server == "resources_servers/demo"
    assert wanted.source == server / "requirements.txt"
    assert wanted.nemo_gym_extras == ("sandbox",)
    assert wanted.lines == (
        "math-verify==0.8.0",
        "tool @ git+https://example.invalid/t.git@abc#subdirectory=tools",
        "--extra-index-url https://example.invalid/simple/",
        "numpy>=1.26,<3",
    )
    assert wanted.packages == (
        "math-verify==0.8.0",
        "tool @ git+https://example.invalid/t.git@abc#subdirectory=tools",
        "numpy>=1.26,<3",
    )
    assert wanted.needs_environment


def test_includes_constraints_and_local_paths_become_absolute(tmp_path: Path) -> None:
    """``-r`` is inlined, ``-c`` and local packages point at absolute paths."""
    server = tmp_path / "resources_servers" / "demo"
    _write(server / "requirements.txt", "-r more/extra.txt\n-e ./vendored[pcre]\n")
    _write(server / "more" / "extra.txt", "-c ../constraints.txt\nrequests\n../../shared_pkg\n")
    _write(server / "constraints.txt", "requests<3\n")
    (server / "vendored").mkdir()
    wanted = read_server_requirements(server)
    assert wanted.lines == (
        f"-c {(server / 'constraints.txt').resolve()}",
        "requests",
        f"{(tmp_path / 'resources_servers' / 'shared_pkg').resolve()}",
        f"-e {(server / 'vendored').resolve()}[pcre]",
    )
    assert wanted.local_paths == (
        (tmp_path / "resources_servers" / "shared_pkg").resolve(),
        (server / "vendored").resolve(),
    )
    assert len(wanted.packages) == 3


def test_include_cycle_is_a_config_error(tmp_path: Path) -> None:
    """Two files including each other are refused, naming the cycle."""
    _write(tmp_path / "s" / "requirements.txt", "-r other.txt\n")
    _write(tmp_path / "s" / "other.txt", "--requirement requirements.txt\n")
    with pytest.raises(ConfigError, match="include cycle"):
        read_server_requirements(tmp_path / "s")


def test_pyproject_dependencies_are_read_and_filtered(tmp_path: Path) -> None:
    """A pyproject server's dependencies count, nemo-gym itself left out."""
    server = tmp_path / "responses_api_models" / "m"
    _write(
        server / "pyproject.toml",
        '[project]\nname = "m"\ndependencies = ["nemo-gym[dev]", "json-repair==0.53.0"]\n',
    )
    wanted = read_server_requirements(server)
    assert wanted.source == server / "pyproject.toml"
    assert wanted.packages == ("json-repair==0.53.0",)
    assert wanted.nemo_gym_extras == ()


def test_nothing_beyond_nemo_gym_needs_no_environment(tmp_path: Path) -> None:
    """Only the self-reference, only ``dev``, or no file at all: the shared venv is used."""
    _write(tmp_path / "a" / "requirements.txt", "-e nemo-gym[dev] @ ../../\n# only that\n")
    assert not read_server_requirements(tmp_path / "a").needs_environment
    _write(tmp_path / "b" / "requirements.txt", "--extra-index-url https://example.invalid/\n")
    assert not read_server_requirements(tmp_path / "b").needs_environment
    (tmp_path / "c").mkdir()
    empty = read_server_requirements(tmp_path / "c")
    assert empty.source is None and not empty.needs_environment


def test_both_requirements_and_pyproject_is_refused(tmp_path: Path) -> None:
    """NeMo Gym refuses a server directory with both files; so do we, naming them."""
    _write(tmp_path / "s" / "requirements.txt", "x\n")
    _write(tmp_path / "s" / "pyproject.toml", "[project]\nname='s'\n")
    with pytest.raises(ConfigError, match=r"requirements\.txt and pyproject\.toml"):
        read_server_requirements(tmp_path / "s")


def test_overrides_file_is_passed_on(tmp_path: Path) -> None:
    """``overrides.txt`` beside the requirements is kept (resolved) for uv's --override."""
    _write(tmp_path / "s" / "requirements.txt", "a\n")
    _write(tmp_path / "s" / "overrides.txt", "b==1\n")
    assert (
        read_server_requirements(tmp_path / "s").overrides
        == (tmp_path / "s" / "overrides.txt").resolve()
    )


# ------------------------------------------------------------------------------ cache key


def test_cache_key_is_stable_and_tracks_every_input(tmp_path: Path) -> None:
    """Same inputs, same key; any change of content, version or interpreter, a new one."""
    server = tmp_path / "s"
    _write(server / "overrides.txt", "x==1\n")
    (server / "pkg").mkdir()
    _write(server / "pkg" / "mod.py", "A = 1\n")
    _write(server / "requirements.txt", "math-verify==0.8.0\n-e ./pkg\n")

    def key(version: str = "0.7.0", python: str = "3.13.0", home: str = "/usr/bin") -> str:
        return environment_key(read_server_requirements(server), version, python, home)

    first = key()
    assert len(first) == 16 and key() == first
    assert {key("0.7.1"), key(python="3.13.1"), key(home="/opt/py")}.isdisjoint({first})
    _write(server / "pkg" / "mod.py", "A = 2\n")
    second = key()
    assert second != first
    _write(server / "overrides.txt", "x==2\n")
    third = key()
    assert third not in (first, second)
    _write(server / "requirements.txt", "math-verify==0.8.0\n# a comment\n\n-e ./pkg\n")
    assert key() == third, "comments and blank lines do not change the environment"


# ------------------------------------------------------------------- build, stamp, reuse


def test_build_once_then_reuse(tmp_path: Path, fake_uv: tuple[list[str], Path]) -> None:
    """The first call builds (venv + install, stamp last); the second touches nothing."""
    uv, calls = fake_uv
    venv = _mini_venv(tmp_path / "gym")
    _server(venv, "demo", "-e nemo-gym[dev,sandbox] @ ../../\nmath-verify==0.8.0\n")
    cache = tmp_path / "cache"
    built = prepare_server_environment(venv, "resources_servers", "demo", cache_root=cache, uv=uv)
    assert not built.reused and built.root is not None and not built.shared
    assert built.root.parent == cache and built.root.name.startswith("demo-")
    assert built.python == built.root / "bin" / "python" and built.python.exists()
    stamp = built.root / STAMP_NAME
    assert json.loads(stamp.read_text())["requirements"] == [
        "nemo-gym[sandbox]==0.7.0",
        "openai==2.44.0",
        "math-verify==0.8.0",
    ]
    first_calls = _calls(calls)
    assert [c[0] for c in first_calls] == ["venv", "pip"]
    install = first_calls[1]
    assert install[install.index("--python-version") + 1] == "3.13.14"  # nemo-gym's floor
    mtime = stamp.stat().st_mtime_ns

    again = prepare_server_environment(venv, "resources_servers", "demo", cache_root=cache, uv=uv)
    assert again.reused and again.python == built.python
    assert _calls(calls) == first_calls and stamp.stat().st_mtime_ns == mtime


def test_half_built_environment_is_rebuilt(tmp_path: Path, fake_uv: tuple[list[str], Path]) -> None:
    """A venv directory without its stamp (a crash mid-install) is deleted and rebuilt."""
    uv, calls = fake_uv
    venv = _mini_venv(tmp_path / "gym")
    _server(venv, "demo", "datasets\n")
    cache = tmp_path / "cache"
    built = prepare_server_environment(venv, "resources_servers", "demo", cache_root=cache, uv=uv)
    assert built.root is not None
    (built.root / STAMP_NAME).unlink()
    _write(built.root / "leftover.txt", "from the crashed build")
    rebuilt = prepare_server_environment(venv, "resources_servers", "demo", cache_root=cache, uv=uv)
    assert not rebuilt.reused and rebuilt.root == built.root
    assert not (built.root / "leftover.txt").exists()
    assert (built.root / STAMP_NAME).is_file()
    assert [c[0] for c in _calls(calls)] == ["venv", "pip", "venv", "pip"]


def test_failed_install_names_server_file_and_uv_output(
    tmp_path: Path, fake_uv: tuple[list[str], Path]
) -> None:
    """uv's failure is a RequirementsInstallError (a ServerStartError); nothing is stamped."""
    uv, calls = fake_uv
    venv = _mini_venv(tmp_path / "gym")
    source = _server(venv, "broken", "no-such-package==1.0\n")
    cache = tmp_path / "cache"
    with pytest.raises(RequirementsInstallError) as caught:
        prepare_server_environment(venv, "resources_servers", "broken", cache_root=cache, uv=uv)
    error = caught.value
    assert isinstance(error, ServerStartError)
    assert error.server == "resources_servers/broken"
    assert error.requirements_path == source and error.returncode == 1
    assert "no-such-package was not found" in error.log_tail
    assert "resources_servers/broken" in str(error) and str(source) in str(error)
    assert "no-such-package was not found" in str(error)
    assert not list(cache.glob(f"*/{STAMP_NAME}"))
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, RequirementsInstallError) and str(copy) == str(error)
    with pytest.raises(RequirementsInstallError):  # tried again, not cached as done
        prepare_server_environment(venv, "resources_servers", "broken", cache_root=cache, uv=uv)
    assert [c[0] for c in _calls(calls)] == ["venv", "pip", "venv", "pip"]


def test_concurrent_builds_install_once(
    tmp_path: Path, fake_uv: tuple[list[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two starts of the same environment at once: one builds, the other waits and reuses."""
    uv, calls = fake_uv
    monkeypatch.setenv("FAKE_UV_SLEEP", "0.5")
    venv = _mini_venv(tmp_path / "gym")
    _server(venv, "demo", "datasets\n")
    results: list[reqs.ServerEnvironment] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(
                prepare_server_environment(
                    venv, "resources_servers", "demo", cache_root=tmp_path / "cache", uv=uv
                )
            )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(r.reused for r in results) == [False, True]
    assert results[0].python == results[1].python
    assert [c[0] for c in _calls(calls)] == ["venv", "pip"]


def test_server_needing_nothing_uses_the_gym_venv(tmp_path: Path) -> None:
    """No extra requirements: the NeMo Gym venv's python, and uv is never looked for."""
    venv = _mini_venv(tmp_path / "gym")
    _server(venv, "plain", "-e nemo-gym[dev] @ ../../\n")
    env = prepare_server_environment(
        venv, "resources_servers", "plain", cache_root=tmp_path / "cache", uv=["/nonexistent"]
    )
    assert env.shared and env.python == venv.python and env.reused
    assert not (tmp_path / "cache").exists()


def test_default_cache_root_follows_env_vars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$NEMOGYM_SERVER_ENVS`` wins over ``$XDG_CACHE_HOME``."""
    monkeypatch.delenv(reqs.REQUIREMENTS_CACHE_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert reqs.default_requirements_cache() == tmp_path / "xdg" / "nemogym_sdk" / "server-envs"
    monkeypatch.setenv(reqs.REQUIREMENTS_CACHE_ENV_VAR, str(tmp_path / "envs"))
    assert reqs.default_requirements_cache() == tmp_path / "envs"


def test_missing_uv_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No uv beside the interpreter, on PATH or as a module: UvNotFoundError, ``pip install uv``."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UvNotFoundError, match="pip install uv"):
        find_uv()


def test_uv_beside_the_interpreter_is_found_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An executable ``uv`` next to ``sys.executable`` is preferred."""
    uv = _write(tmp_path / "bin" / "uv", "#!/bin/sh\n")
    uv.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    assert find_uv() == [str(uv)]


# ------------------------------------------------------------------ real NeMo Gym and uv


@pytest.mark.gym
def test_shipped_servers_filter_cleanly(gym_venv: GymVenv) -> None:
    """Every shipped server's requirements read; no line points back at nemo-gym."""
    count = 0
    for server_dir in sorted(gym_venv.site_packages.glob("*/*/requirements.txt")):
        if server_dir.parent.parent.name == "benchmarks":
            continue
        wanted = read_server_requirements(server_dir.parent)
        count += 1
        for line in wanted.lines:
            assert "../.." not in line and "nemo-gym" not in line.lower(), (wanted.server, line)
    assert count > 100
    math = read_server_requirements(gym_venv.resources_server_dir("math_with_judge"))
    assert math.packages == ("math-verify==0.8.0", "datasets")
    agent = read_server_requirements(gym_venv.server_dir("responses_api_agents", "simple_agent"))
    assert not agent.needs_environment


@pytest.mark.gym
def test_real_uv_fails_fast_on_an_unknown_package(gym_venv: GymVenv, tmp_path: Path) -> None:
    """A package that does not exist: uv's resolver error, naming it, in the exception."""
    server = tmp_path / "resources_servers" / "broken"
    source = _write(server / "requirements.txt", "nemogym-sdk-no-such-package-3f9c2e\n")
    env = {k: v for k, v in os.environ.items() if k != "UV_OFFLINE"}
    with pytest.raises(RequirementsInstallError) as caught:
        prepare_server_environment(
            gym_venv,
            "resources_servers",
            "broken",
            server_dir=server,
            cache_root=tmp_path / "cache",
            env=env,
        )
    assert caught.value.requirements_path == source
    assert "nemogym-sdk-no-such-package-3f9c2e" in caught.value.log_tail
    assert not list((tmp_path / "cache").glob(f"*/{STAMP_NAME}"))


def test_a_local_package_is_copied_into_the_venv_and_installed_from_there(
    fake_uv: tuple[list[str], Path], tmp_path: Path
) -> None:
    """A requirement naming a local directory is installed from a copy inside the server's
    venv (never built inside the NeMo Gym venv), and the venv is still created around it."""
    uv, calls = fake_uv
    venv = _mini_venv(tmp_path / "gym")
    server = venv.server_dir("resources_servers", "harness")
    _write(server / "pkg" / "pyproject.toml", "[project]\nname = 'pkg'\n")
    _server(venv, "harness", "-e ./pkg\n")
    built = prepare_server_environment(
        venv, "resources_servers", "harness", cache_root=tmp_path / "cache", uv=uv
    )
    copy = built.root / "src" / "0-pkg"
    assert built.root is not None and (copy / "pyproject.toml").is_file()
    installed = Path(_calls(calls)[1][_calls(calls)[1].index("-r") + 1]).read_text()
    assert str(copy) in installed and str(server / "pkg") not in installed
