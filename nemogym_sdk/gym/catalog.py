"""Catalogue of shipped NeMo Gym environments that run on a CPU-only box.

:data:`CATALOGUE` lists the environments this package is tested with (each starts
and serves ``/run`` with no GPU, no judge and no network); :data:`SDK_ENVIRONMENTS`
lists the environments the SDK ships itself (``nemogym_sdk/gym/envs``), which
``GymStack`` starts by name like NeMo Gym's. :func:`describe_environment`
reads what an environment ships — its config and its example rows — so the facts
come from the installed NeMo Gym, not from a copy. The prose (what the agent does,
how rewards are computed, quirks) is in ``docs/gym-environments.md``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.config import dataset_paths
from nemogym_sdk.gym.loading import environment_config
from nemogym_sdk.gym.locate import GymVenv, locate_environment
from nemogym_sdk.gym.resolve import resolve_environments
from nemogym_sdk.gym.specs import AGENTS, RESOURCES

__all__ = [
    "CATALOGUE",
    "SDK_ENVIRONMENTS",
    "EnvironmentInfo",
    "describe_environment",
    "missing_data_files",
]

CATALOGUE: tuple[str, ...] = (
    "example_single_tool_call",
    "example_multi_step",
    "example_session_state_mgmt",
    "example_tool_call_multireward",
    "workplace_assistant",
    "wordle",
    "blackjack",
    "example_multi_turn_gymnasium",
)
"""Environments verified to start and serve ``/run`` on CPU (manual and head-server mode)."""

SDK_ENVIRONMENTS: tuple[str, ...] = ("target_chars",)
"""Environments shipped with the SDK (``nemogym_sdk/gym/envs/<name>``), CPU-only too.

``target_chars`` is a multi-turn toy whose reward already varies under a random policy (see
``docs/writing-an-environment.md``)."""


@attrs.frozen(kw_only=True)
class EnvironmentInfo:
    """What a shipped environment provides, read from its config and example data."""

    name: str
    """Environment name (its resources server directory)."""
    description: str
    """The resources server's ``description`` from the shipped config."""
    domain: str | None
    """The resources server's ``domain`` (``agent``, ``games`` ...)."""
    config_path: Path
    """``configs/<env>.yaml`` in the environment's directory."""
    resources_servers: tuple[str, ...]
    """Resources server instance names."""
    agents: tuple[str, ...]
    """Agent instance names."""
    agent_impls: tuple[str, ...]
    """Agent implementation of each agent (``simple_agent``, ``gymnasium_agent``)."""
    max_steps: tuple[int | None, ...]
    """``max_steps`` of each agent as shipped (``None``: the implementation's default)."""
    tools: tuple[str, ...]
    """Function tools offered in the example rows (union, in first-seen order)."""
    row_keys: tuple[str, ...]
    """Top-level keys of the example rows besides ``responses_create_params`` (task data)."""
    example_path: Path
    """The shipped example rows."""
    num_examples: int
    """Number of example rows."""
    train_path: Path | None = None
    """The config's ``train`` dataset, if it lists one (the file may be absent: many
    NeMo Gym environments download theirs)."""
    shipped_with_sdk: bool = False
    """True for an environment under ``nemogym_sdk/gym/envs``."""


def describe_environment(
    venv: GymVenv, name: str, *, env_path: Sequence[str | os.PathLike[str]] | None = None
) -> EnvironmentInfo:
    """Read an environment's shipped config (as NeMo Gym resolves it) and example rows;
    ``env_path``: the environment search path (``None``: ``$NEMOGYM_ENV_PATH``)."""
    (resolved,) = resolve_environments(venv, [name], env_path=env_path)
    shipped = environment_config(resolved)
    description = ""
    domain: str | None = None
    resources: list[str] = []
    agents: list[str] = []
    impls: list[str] = []
    max_steps: list[int | None] = []
    agent_configs: list[dict[str, Any]] = []
    for instance, block in shipped.items():
        if not isinstance(block, dict) or len(block) != 1:
            continue
        ((server_type, impl_blocks),) = block.items()
        if not isinstance(impl_blocks, dict) or len(impl_blocks) != 1:
            continue
        ((impl, inner),) = impl_blocks.items()
        if server_type == RESOURCES:
            resources.append(instance)
            description = description or str(inner.get("description", ""))
            domain = domain or inner.get("domain")
        elif server_type == AGENTS:
            agents.append(instance)
            impls.append(str(impl))
            max_steps.append(inner.get("max_steps"))
            agent_configs.append(inner)
    location = resolved.location
    paths = dataset_paths(resolved, agent_configs)
    example_path = paths.get("example", location.directory / "data" / "example.jsonl")
    if not example_path.is_file():
        raise ConfigError(f"{name} ships no example rows at {example_path}")
    tools: list[str] = []
    row_keys: list[str] = []
    count = 0
    for line in example_path.read_text().splitlines():
        if not line.strip():
            continue
        row: dict[str, Any] = json.loads(line)
        count += 1
        for tool in row.get("responses_create_params", {}).get("tools") or []:
            tool_name = tool.get("name")
            if tool_name and tool_name not in tools:
                tools.append(tool_name)
        for key in row:
            if key != "responses_create_params" and key not in row_keys:
                row_keys.append(key)
    return EnvironmentInfo(
        name=name,
        description=description,
        domain=domain,
        config_path=location.config_path,
        resources_servers=tuple(resources),
        agents=tuple(agents),
        agent_impls=tuple(impls),
        max_steps=tuple(max_steps),
        tools=tuple(tools),
        row_keys=tuple(row_keys),
        example_path=example_path,
        num_examples=count,
        train_path=paths.get("train"),
        shipped_with_sdk=location.shipped_with_sdk,
    )


_SYSTEM_WORD_LISTS = (
    Path("/usr/share/dict/words"),
    Path("/usr/share/dict/american-english"),
    Path("/usr/share/dict/british-english"),
)


def missing_data_files(
    venv: GymVenv, environment: str, *, env_path: Sequence[str | os.PathLike[str]] | None = None
) -> dict[str, str]:
    """Stand-ins for data files an environment needs but the wheel does not ship.

    Returns ``{path relative to the resources server dir: text}``; empty when nothing is
    missing, and for a user's environment found on ``env_path`` (the search path; ``None``:
    ``$NEMOGYM_ENV_PATH``), which the SDK never adds to. Only NeMo Gym's ``wordle`` needs
    one: ``data/guesses.txt`` (the valid-guess list, which
    ``generate_data.py`` downloads from GitHub). The stand-in holds the five-letter words
    of a system word list when there is one (Debian: ``apt-get install wamerican``), the
    targets of the shipped rows, and the guesses the shipped example rollouts had
    accepted. It is smaller than the real list (ENABLE, 8,636 words), so more guesses are
    rejected as "not a valid English word"; supply the real file through ``GymStack``'s
    ``server_files`` for faithful rewards.
    """
    if environment != "wordle":
        return {}
    if locate_environment(venv, environment, env_path).path_entry is not None:
        return {}  # a user's own wordle: theirs to complete
    data_dir = venv.resources_server_dir("wordle") / "data"
    if (data_dir / "guesses.txt").is_file():
        return {}
    words: set[str] = set()
    for path in _SYSTEM_WORD_LISTS:
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                word = line.strip()
                if len(word) == 5 and word.isascii() and word.isalpha() and word.islower():
                    words.add(word)
            break
    words.update(_wordle_shipped_words(data_dir))
    header = "# Stand-in for wordle's data/guesses.txt, written by nemogym_sdk.gym\n"
    return {"data/guesses.txt": header + "\n".join(sorted(words)) + "\n"}


def _wordle_shipped_words(data_dir: Path) -> set[str]:
    """Targets of the shipped rows and guesses that shipped rollouts saw accepted."""
    words: set[str] = set()
    for name in ("example.jsonl", "example_rollouts.jsonl"):
        path = data_dir / name
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            target = row.get("custom_target")
            if isinstance(target, str) and len(target) == 5 and target.isalpha():
                words.add(target.lower())
            outputs = (row.get("response") or {}).get("output") or []
            guesses = {
                item.get("call_id"): item.get("arguments")
                for item in outputs
                if item.get("type") == "function_call" and item.get("name") == "submit_guess"
            }
            for item in outputs:
                if item.get("type") != "function_call_output" or item.get("call_id") not in guesses:
                    continue
                try:
                    verdict = json.loads(item.get("output") or "{}")
                    guess = json.loads(guesses[item["call_id"]] or "{}").get("guess", "")
                except (json.JSONDecodeError, AttributeError):
                    continue
                if isinstance(verdict, dict) and verdict.get("valid") is True:
                    words.add(str(guess).strip().lower())
    return {w for w in words if len(w) == 5 and w.isalpha()}
