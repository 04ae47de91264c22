"""The layering of the package, locked: which room may import which.

Every module of ``nemogym_sdk`` is parsed with ``ast`` (nothing is imported) and each of
its imports, at module level or inside a function, is checked against ONE rule per room
(``ROOMS``: a module belongs to the room of its longest listed prefix; ``MAY_IMPORT``: the
rooms it may import). The rooms are the design's (DESIGN.md section 2), stated as intended,
not read off the imports that happen to exist:

- **core** (pure: records, wire, turns, masks, collate, data, grpo, ...; and the pure parts
  of the engine, ``rollout_engine.groups``, ``.options`` and ``.pacing``) imports only the
  core, and never torch, trl, vllm, axolotl, transformers or peft, except the two torch
  bridges the design names (``Batch.to_torch``, ``devices.torch_device``);
- **io** (the network: ``_net``, client, directory, verify, rollout_engine) imports core
  and io, and never a heavy framework;
- **lora**, **logits**, **serve**, **processes**, **samplers**, **gym**, **testing** and
  each **adapters.X** import the rooms their row names: the model server builds on the
  logit processing, the model servers start through ``processes`` and never import
  ``serve`` (they run it), gym starts through both, the learner needs no server, no adapter
  imports another;
- **apps** (the reference trainer, ``train``) may import any room.

Only the modules in ``HEAVY_AT_IMPORT`` import a heavy framework when they load;
``import nemogym_sdk`` loads no network, YAML or heavy module and none of the io layer; and
``import nemogym_sdk.train.config`` (the trainer's settings) loads no heavy framework and
no room but the core.

Why this walker and not import-linter's contracts: they see an import wherever it is
written, so they cannot say "torch may load inside this function, not when the module
loads", the rule that keeps ``import nemogym_sdk`` light (``HEAVY_AT_IMPORT``); and the light
imports are proven in a fresh interpreter, which no static contract does. What import-linter
would add (its layers contract) is the ``MAY_IMPORT`` table below, one rule per room.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import nemogym_sdk

PACKAGE = Path(nemogym_sdk.__file__).parent
ROOT = "nemogym_sdk"
HEAVY = frozenset({"torch", "trl", "vllm", "axolotl", "transformers", "peft"})
NETWORK = frozenset({"aiohttp", "requests", "yaml"})

CORE = (
    *("_cache", "_extras", "_filelock", "collate", "data", "devices", "errors", "grpo", "hosts"),
    *("masks", "metrics"),
    *("policy", "ranks", "records", "rewards", "turns", "wire"),
    *("rollout_engine.groups", "rollout_engine.options", "rollout_engine.pacing"),
)
IO = ("_net", "client", "directory", "rollout_engine", "verify")
ROOMS: dict[str, str] = {
    **dict.fromkeys(CORE, "core"),
    **dict.fromkeys(IO, "io"),
    **{room: room for room in ("lora", "logits", "serve", "processes", "samplers", "gym")},
    **{room: room for room in ("testing", "adapters")},
    **{f"adapters.{a}": f"adapters.{a}" for a in ("axolotl", "torch", "trl")},
    "train": "apps",
    "train_config": "apps",  # the deprecated alias of train.config
}
"""Module (relative to ``nemogym_sdk``, a package standing for all it holds) -> room."""

_ALL = frozenset(ROOMS.values())
MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "io": frozenset({"core", "io"}),
    "lora": frozenset({"core", "io", "lora"}),
    "logits": frozenset({"core"}),
    "serve": frozenset({"core", "io", "logits", "serve"}),
    "processes": frozenset({"core", "io", "processes"}),
    "samplers": frozenset({"core", "io", "processes", "samplers"}),
    "gym": frozenset({"core", "io", "processes", "samplers", "gym"}),
    "testing": frozenset({"core", "io", "serve", "testing"}),
    "adapters": frozenset({"core"}),
    "adapters.torch": frozenset({"core", "logits", "adapters.torch"}),
    "adapters.trl": frozenset({"core", "io", "lora", "adapters.trl"}),
    "adapters.axolotl": frozenset({"core", "io", "lora", "adapters.axolotl"}),
    "apps": _ALL,
}
NEVER_HEAVY = frozenset({"core", "io"})
"""Rooms that never import a heavy framework, at load or in a function."""

# Function-level imports allowed against the table: BackendProcess.policy_model() builds
# gym's PolicyModel (gym re-exports samplers, so samplers never imports gym at load).
LAZY_UP = frozenset({("samplers", "gym")})

# Function-level (lazy) heavy imports allowed in core: the design's two torch bridges.
LAZY_HEAVY_ALLOWED = frozenset({("nemogym_sdk.records", "torch"), ("nemogym_sdk.devices", "torch")})

# Modules that import a heavy framework when they load (everything else loads without).
HEAVY_AT_IMPORT = frozenset(
    {
        "nemogym_sdk.adapters.axolotl.producer",
        "nemogym_sdk.adapters.torch",
        "nemogym_sdk.adapters.torch._dist",
        "nemogym_sdk.adapters.torch.head",
        "nemogym_sdk.adapters.torch.logprobs",
        "nemogym_sdk.adapters.torch.sharding",
        "nemogym_sdk.adapters.torch.losses",
        "nemogym_sdk.adapters.torch.step",
        "nemogym_sdk.logits",
        "nemogym_sdk.lora.callback",
        "nemogym_sdk.serve.backend",
        "nemogym_sdk.serve.batch",
    }
)


def layer(module: str) -> str:
    """The room of a ``nemogym_sdk`` module name (its longest prefix in ``ROOMS``)."""
    if module == ROOT:
        return "core"
    parts = module.split(".")[1:]
    for end in range(len(parts), 0, -1):
        room = ROOMS.get(".".join(parts[:end]))
        if room is not None:
            return room
    raise AssertionError(f"{module} belongs to no room: add it to ROOMS in tests/test_layering.py")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """Ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return found


def imports(module: str, source: str, *, is_package: bool = False) -> Iterator[tuple[str, bool]]:
    """``(absolute module imported, at module load?)`` for every import in ``source``.

    TYPE_CHECKING imports are left out (they never run); an import nested in a function
    counts as lazy, one anywhere else in the module body as at load.
    """
    tree = ast.parse(source)
    skipped = _type_checking_nodes(tree)
    lazy: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            lazy |= {id(inner) for inner in ast.walk(node)}
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        at_load = id(node) not in lazy
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, at_load
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None or node.level:
                # ``from . import x`` / ``from .pkg import x``: x may be a submodule
                for alias in node.names:
                    yield f"{target}.{alias.name}", at_load
            else:
                yield target, at_load


def _owning_module(name: str) -> str:
    """The package module an imported name refers to (``a.b.Name`` -> ``a.b`` if a file)."""
    parts = name.split(".")
    while parts:
        candidate = PACKAGE.parent.joinpath(*parts)
        if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
            return ".".join(parts)
        parts.pop()
    return ROOT


def violations(module: str, source: str, *, is_package: bool = False) -> list[str]:
    """Every import of ``module`` (given as source) that breaks the table."""
    own = layer(module)
    found = []
    for name, at_load in imports(module, source, is_package=is_package):
        top = name.split(".")[0]
        if top in HEAVY:
            if own in NEVER_HEAVY and (module, top) not in LAZY_HEAVY_ALLOWED:
                found.append(f"{module} imports {name} (core and io never import {top})")
            elif at_load and module not in HEAVY_AT_IMPORT:
                found.append(f"{module} imports {name} at load (not in HEAVY_AT_IMPORT)")
            continue
        if top != ROOT:
            continue
        if module == ROOT and not at_load:
            continue  # the package's lazy public names: checked by the subprocess test
        target = _owning_module(name)
        other = layer(target)
        if other not in MAY_IMPORT[own] and (at_load or (own, other) not in LAZY_UP):
            found.append(f"{module} ({own}) imports {target} ({other})")
    return found


def package_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_follows_the_import_table() -> None:
    """No module of the package imports a layer its own layer may not import."""
    found = []
    for path in package_modules():
        if "envs" in path.relative_to(PACKAGE).parts or path.name == "head_main.py":
            continue  # run by NeMo Gym's interpreter, importing only NeMo Gym and stdlib
        found += violations(
            module_name(path), path.read_text(), is_package=path.name == "__init__.py"
        )
    assert not found, "\n".join(found)


def test_gym_server_scripts_import_no_sdk_module_outside_themselves() -> None:
    """Scripts that run in NeMo Gym's venv (toy envs, the head main) import no SDK layer."""
    for path in package_modules():
        rel = path.relative_to(PACKAGE).parts
        if "envs" not in rel and path.name != "head_main.py":
            continue
        for name, _ in imports(module_name(path), path.read_text()):
            assert name.split(".")[0] not in HEAVY, f"{path} imports {name}"
            if name.startswith(f"{ROOT}."):
                assert name.startswith(f"{ROOT}.gym.envs."), f"{path} imports {name}"


@pytest.mark.parametrize("script", ["processes/_forkserver_main.py", "samplers/_vllm_main.py"])
def test_scripts_run_by_another_venvs_python_import_nothing_of_the_sdk(script: str) -> None:
    """The fork server's and vLLM's entry points run under another venv's interpreter with
    ``-P`` (the SDK is not on its path): they import the standard library and what that venv
    holds, never the SDK."""
    path = PACKAGE / script
    for name, _ in imports(module_name(path), path.read_text()):
        assert name.split(".")[0] != ROOT, f"{path} imports {name}"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("nemogym_sdk.turns", "import torch\n", "core and io never import torch"),
        ("nemogym_sdk.collate", "def f():\n    import transformers\n", "never import"),
        ("nemogym_sdk.client", "from vllm import LLM\n", "never import vllm"),
        ("nemogym_sdk.wire", "from nemogym_sdk.client import AgentClient\n", "(io)"),
        ("nemogym_sdk.data", "from nemogym_sdk.gym import GymStack\n", "(gym)"),
        ("nemogym_sdk.rollout_engine.pacing", "from nemogym_sdk._net.aio import X\n", "(io)"),
        (
            "nemogym_sdk.adapters.trl.rollout",
            "from nemogym_sdk.adapters.axolotl import NemoGymPlugin\n",
            "(adapters.axolotl)",
        ),
        ("nemogym_sdk.serve.chat", "from nemogym_sdk.gym import GymStack\n", "(gym)"),
        # the learner needs no server, the model servers no server code, no room below gym
        # imports it at load, and process supervision knows no server kind
        ("nemogym_sdk.adapters.torch.logprobs", "from nemogym_sdk.serve import X\n", "(serve)"),
        (
            "nemogym_sdk.samplers.backend",
            "def f():\n    from nemogym_sdk.serve import X\n",
            "(serve)",
        ),
        ("nemogym_sdk.samplers.vllm", "from nemogym_sdk.gym import PolicyModel\n", "(gym)"),
        ("nemogym_sdk.processes.start", "from nemogym_sdk.samplers import X\n", "(samplers)"),
        (
            "nemogym_sdk.adapters.trl.rollout",
            "from nemogym_sdk.adapters.torch import X\n",
            "(adapters.torch)",
        ),
        ("nemogym_sdk.gym.config", "import torch\n", "not in HEAVY_AT_IMPORT"),
    ],
)
def test_a_forbidden_import_is_caught(module: str, source: str, expected: str) -> None:
    """The checker flags a synthetic module that breaks the table (e.g. ``import torch`` in
    a core module), so the table cannot silently pass everything."""
    found = violations(module, source)
    assert found and expected in found[0], found


def test_allowed_imports_pass() -> None:
    """Imports the table allows are not flagged (TYPE_CHECKING ones are ignored)."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import numpy\n"
        "from nemogym_sdk.records import Rollout\n"
        "if TYPE_CHECKING:\n    import torch\n"
    )
    assert violations("nemogym_sdk.turns", source) == []
    assert violations("nemogym_sdk.verify", "from nemogym_sdk._net.session import X\n") == []
    assert violations("nemogym_sdk.gym.stack", "from nemogym_sdk.directory import X\n") == []
    lazy_gym = "def f():\n    from nemogym_sdk.gym.specs import PolicyModel\n"
    assert violations("nemogym_sdk.samplers.backend", lazy_gym) == []


def _loaded(statement: str, watched: list[str]) -> list[str]:
    """Which of ``watched`` a fresh interpreter has in ``sys.modules`` after ``statement``."""
    code = f"import sys; {statement}; print(','.join(m for m in {watched!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [name for name in out.stdout.strip().split(",") if name]


ROOMS_ABOVE_CORE = [
    f"{ROOT}.{name}"
    for name in ("lora", "serve", "processes", "samplers", "gym", "adapters", "train.recipe")
]


IO_LOADED = [f"{ROOT}.{name}" for name in IO if name != "rollout_engine"]
IO_LOADED.append(f"{ROOT}.rollout_engine.engine")  # the package's pure records load light
"""The io modules a light import must not load."""


def test_import_nemogym_sdk_loads_no_network_heavy_or_io_module() -> None:
    """``import nemogym_sdk`` in a fresh interpreter loads none of aiohttp, requests, yaml,
    the heavy frameworks, or the SDK's io, lora, gym, serve, sampler and adapter modules."""
    io = IO_LOADED
    assert _loaded("import nemogym_sdk", sorted(HEAVY | NETWORK) + io + ROOMS_ABOVE_CORE) == []


def test_the_trainers_settings_load_light() -> None:
    """``nemogym_sdk.train.config`` (and the ``nemogym_sdk.train`` package around it) loads
    no heavy framework, no network library and no room but the core: the docs' settings page
    and a config check run without the trainer's extra."""
    io = IO_LOADED
    watched = sorted(HEAVY | {"aiohttp", "requests"}) + io + ROOMS_ABOVE_CORE
    assert _loaded("import nemogym_sdk.train.config", watched) == []
