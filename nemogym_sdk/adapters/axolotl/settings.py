"""The plugin's YAML keys, read from axolotl's config into one frozen, validated record.

axolotl hands plugins its config in two shapes: the raw YAML dict (``register``, before
validation) and the validated ``DictDefault``; tests hand a ``SimpleNamespace``. The helpers
here read and write keys in all three, so every hook validates the same way
(``NemoGymSettings.from_cfg``) and applies the same defaults (``apply_config_defaults``).

Pure: no torch, no axolotl, no I/O.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import attrs

from nemogym_sdk.errors import ConfigError

__all__ = [
    "ENV_REWARD",
    "HEAD_ENV_VAR",
    "PLUGIN",
    "REWARD_FUNCTIONS",
    "SAMPLER_ENV_VAR",
    "VERIFY_REWARD",
    "DatasetSpec",
    "NemoGymSettings",
    "apply_config_defaults",
    "cfg_get",
    "cfg_set",
]

logger = logging.getLogger(__name__)

PLUGIN = "nemogym_sdk.adapters.axolotl.NemoGymPlugin"
"""The dotted path users list under ``plugins:``."""
ENV_REWARD = "nemogym_sdk.adapters.axolotl.nemo_gym_env_reward"
"""The reward function of agent (multi-turn) mode, as listed under ``trl.reward_funcs``."""
VERIFY_REWARD = "nemogym_sdk.adapters.axolotl.nemo_gym_verify_reward"
"""The reward function of verify (single-turn) mode, as listed under ``trl.reward_funcs``."""
REWARD_FUNCTIONS = (ENV_REWARD, VERIFY_REWARD)

HEAD_ENV_VAR = "NEMOGYM_HEAD_URL"
"""Where the head server is read from when ``nemo_gym_head_url`` is not set."""
SAMPLER_ENV_VAR = "NEMOGYM_SAMPLER_URL"
"""Where the inference server is read from when ``nemo_gym_sampler_url`` is not set."""
DEFAULT_HEAD = "127.0.0.1:11000"


def cfg_get(cfg: object, key: str, default: Any = None) -> Any:
    """``cfg[key]`` for mappings (axolotl's ``DictDefault`` is one), ``cfg.key`` otherwise."""
    value = cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)
    return default if value is None else value


def cfg_set(cfg: object, key: str, value: Any) -> None:
    """Set ``key`` on a mapping or an attribute object."""
    if isinstance(cfg, MutableMapping):
        cfg[key] = value
    else:
        setattr(cfg, key, value)


def _positive(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not value > 0:
        raise ConfigError(f"nemo_gym_{attribute.name} must be > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class DatasetSpec:
    """One entry of ``nemo_gym_datasets``."""

    path: str
    """A NeMo Gym JSONL file (``~`` is expanded; relative paths are relative to the cwd)."""
    max_samples: int | None = None
    """Keep at most this many rows of the file (a seeded random subset)."""

    @classmethod
    def from_entry(cls, entry: object, index: int) -> DatasetSpec:
        """Read one list entry: a mapping with ``path`` (and ``max_samples``) or a path string."""
        where = f"nemo_gym_datasets[{index}]"
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a mapping with 'path', got {entry!r}")
        unknown = set(entry) - {"path", "max_samples"}
        if unknown:
            raise ConfigError(
                f"{where} has unknown keys {sorted(unknown)}; known: path, max_samples"
            )
        path = entry.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(f"{where} needs a 'path' (a NeMo Gym JSONL file)")
        max_samples = entry.get("max_samples")
        if max_samples is not None and (
            not isinstance(max_samples, int) or isinstance(max_samples, bool) or max_samples < 1
        ):
            raise ConfigError(
                f"{where}.max_samples must be a positive integer, got {max_samples!r}"
            )
        return cls(path=path, max_samples=max_samples)


@attrs.frozen(kw_only=True)
class NemoGymSettings:
    """Everything the plugin reads from the axolotl config, validated.

    Built by ``from_cfg`` from the YAML keys named ``nemo_gym_<field>``.
    """

    datasets: tuple[DatasetSpec, ...]
    """``nemo_gym_datasets``: NeMo Gym JSONL files; the plugin's training set."""
    multi_turn: bool = False
    """``nemo_gym_multi_turn``: rollouts through NeMo Gym agents (``POST /run``); False scores
    the trainer's own generations through ``/verify``."""
    head_url: str = DEFAULT_HEAD
    """``nemo_gym_head_url``: NeMo Gym's head server (else ``$NEMOGYM_HEAD_URL``, else
    127.0.0.1:11000)."""
    sampler_url: str | None = None
    """``nemo_gym_sampler_url``: the inference server NeMo Gym's model server calls (vLLM or
    ``nemogym_sdk.serve``; else ``$NEMOGYM_SAMPLER_URL``). Multi-turn: the LoRA adapter is
    published there after every optimizer step."""
    adapter_name: str = "policy"
    """``nemo_gym_adapter_name``: the name the adapter is served under; NeMo Gym's model server
    must request exactly this model name (checked at start)."""
    adapter_dir: str | None = None
    """``nemo_gym_adapter_dir``: where adapter versions are written for the server to read
    (default ``<output_dir>/nemo_gym/adapters``)."""
    default_agent: str | None = None
    """``nemo_gym_default_agent``: agent for rows without ``agent_ref`` (default: the only
    agent, when exactly one is deployed)."""
    resources_server: str | None = None
    """``nemo_gym_resources_server``: single-turn scoring server for rows that do not name one
    (default: the row agent's resources server, or the only one deployed)."""
    run_timeout: float = attrs.field(default=1800.0, validator=_positive)
    """``nemo_gym_run_timeout``: seconds for one ``/run`` (a whole episode)."""
    verify_timeout: float = attrs.field(default=60.0, validator=_positive)
    """``nemo_gym_verify_timeout``: seconds for one ``/verify``."""
    discovery_timeout: float = attrs.field(default=60.0, validator=_positive)
    """``nemo_gym_discovery_timeout``: seconds to wait for the head server at start."""
    max_concurrency: int = attrs.field(default=64, validator=_positive)
    """``nemo_gym_max_concurrency``: rollouts or verifications in flight at once."""
    seed: int = 0
    """``nemo_gym_seed``: row sampling seed (default: axolotl's ``seed``, else 0)."""
    max_staleness: int | None = None
    """``nemo_gym_max_staleness``: agent mode, asynchronous: episodes keep playing while the
    learner learns (``nemogym_sdk.RolloutEngine``), a group trained at most this many adapter
    versions after the one it started on; the sampler must keep ``max_staleness + 2``
    versions (``nemogym_sdk.serve --adapter-versions``). Unset: each batch is played when
    the trainer asks for it."""
    max_inflight: int | None = None
    """``nemo_gym_max_inflight``: with ``max_staleness``, episodes playing at once per rank
    (default: all the pacing allows)."""

    @classmethod
    def from_cfg(cls, cfg: object) -> NemoGymSettings:
        """Read and validate the ``nemo_gym_*`` keys of an axolotl config.

        Raises:
            ConfigError: a key is missing, has the wrong type or an invalid value; the
                message names the key.
        """
        entries = cfg_get(cfg, "nemo_gym_datasets")
        if not entries:
            raise ConfigError(
                "nemo_gym_datasets is required: a list of NeMo Gym JSONL files, e.g. "
                "nemo_gym_datasets: [{path: data/train.jsonl}]"
            )
        if isinstance(entries, (str, Mapping)) or not isinstance(entries, Sequence):
            entries = [entries]
        datasets = tuple(DatasetSpec.from_entry(e, i) for i, e in enumerate(entries))
        head = cfg_get(cfg, "nemo_gym_head_url") or os.environ.get(HEAD_ENV_VAR) or DEFAULT_HEAD
        sampler = cfg_get(cfg, "nemo_gym_sampler_url") or os.environ.get(SAMPLER_ENV_VAR)
        multi_turn = _bool(cfg, "nemo_gym_multi_turn", False)
        adapter_name = _str(cfg, "nemo_gym_adapter_name") or "policy"
        if multi_turn and not sampler:
            raise ConfigError(
                "nemo_gym_multi_turn needs nemo_gym_sampler_url (or $NEMOGYM_SAMPLER_URL): the "
                "inference server NeMo Gym's model server calls. The plugin publishes the LoRA "
                "adapter there after every optimizer step; without it every rollout would "
                "sample a policy that never changes."
            )
        if not multi_turn and cfg_get(cfg, "nemo_gym_max_staleness") is not None:
            raise ConfigError(
                "nemo_gym_max_staleness paces NeMo Gym's agents (asynchronous rollouts): it "
                "needs nemo_gym_multi_turn: true"
            )
        seed = cfg_get(cfg, "nemo_gym_seed", cfg_get(cfg, "seed", 0))
        try:
            return cls(
                datasets=datasets,
                multi_turn=multi_turn,
                head_url=str(head),
                sampler_url=str(sampler) if sampler else None,
                adapter_name=adapter_name,
                adapter_dir=_str(cfg, "nemo_gym_adapter_dir"),
                default_agent=_str(cfg, "nemo_gym_default_agent"),
                resources_server=_str(cfg, "nemo_gym_resources_server"),
                run_timeout=_number(cfg, "nemo_gym_run_timeout", 1800.0),
                verify_timeout=_number(cfg, "nemo_gym_verify_timeout", 60.0),
                discovery_timeout=_number(cfg, "nemo_gym_discovery_timeout", 60.0),
                max_concurrency=int(_number(cfg, "nemo_gym_max_concurrency", 64)),
                seed=int(seed),
                max_staleness=_count(cfg, "nemo_gym_max_staleness", least=0),
                max_inflight=_count(cfg, "nemo_gym_max_inflight", least=1),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"invalid nemo_gym setting: {exc}") from exc

    @property
    def reward_function(self) -> str:
        """The dotted path of the one NeMo Gym reward function this mode scores with."""
        return ENV_REWARD if self.multi_turn else VERIFY_REWARD


def _bool(cfg: object, key: str, default: bool) -> bool:
    value = cfg_get(cfg, key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def _str(cfg: object, key: str) -> str | None:
    value = cfg_get(cfg, key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _count(cfg: object, key: str, *, least: int) -> int | None:
    value = cfg_get(cfg, key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{key} must be an integer >= {least}, got {value!r}")
    return value


def _number(cfg: object, key: str, default: float) -> float:
    value = cfg_get(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    return float(value)


def apply_config_defaults(cfg: object) -> None:
    """Config edits the plugin needs before axolotl builds anything (pure, no I/O).

    - ``dataloader_num_workers`` becomes 0: rows are decoded and rolled out in the
      trainer's process (the data producer's loader and NeMo Gym's HTTP client must not be
      forked into workers). ``get_training_args`` returns it too, so the trainer's own
      arguments carry it whatever happened to the config.
    - Multi-turn: ``trl.use_data_producer`` defaults to true, which is what makes axolotl
      build its async GRPO trainer (the one with a data producer the plugin can supply).
    - ``datasets``, which axolotl's schema requires, is filled from ``nemo_gym_datasets``
      when absent; ``load_datasets`` replaces it, so the YAML needs no dead block.
    """
    workers = cfg_get(cfg, "dataloader_num_workers")
    if workers:
        logger.warning("NeMo Gym plugin: dataloader_num_workers %s -> 0", workers)
    cfg_set(cfg, "dataloader_num_workers", 0)
    if cfg_get(cfg, "nemo_gym_multi_turn") is True:
        trl = cfg_get(cfg, "trl")
        if trl is None:
            trl = {}
            cfg_set(cfg, "trl", trl)
        if cfg_get(trl, "use_data_producer") is None:
            cfg_set(trl, "use_data_producer", True)
    entries = cfg_get(cfg, "nemo_gym_datasets")
    if not cfg_get(cfg, "datasets") and isinstance(entries, list) and entries:
        first = entries[0]
        path = first.get("path") if isinstance(first, Mapping) else first
        if isinstance(path, str):
            cfg_set(cfg, "datasets", [{"path": path, "type": "nemo_gym"}])
