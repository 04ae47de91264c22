"""The reference trainer's configuration: one record, read from a YAML file and flags.

``python -m nemogym_sdk.train --config run.yaml --steps 50`` reads ``run.yaml`` (keys are
the field names below) and then applies the flags (``--rows-per-step 8`` sets
``rows_per_step``); every problem is a ``ConfigError`` that says what is wrong and how to
fix it.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import yaml

from nemogym_sdk import _extras
from nemogym_sdk.devices import parse_device, torch_device
from nemogym_sdk.errors import DOCS_URL, ConfigError
from nemogym_sdk.grpo import ImportanceSampling, LossType, PolicyLoss
from nemogym_sdk.policy import VERSION_POLICIES
from nemogym_sdk.records import DriftPolicy, ParseOptions
from nemogym_sdk.rollout_engine.options import EngineOptions

if TYPE_CHECKING:
    from nemogym_sdk.serve.parsers import OutputParsers

__all__ = [
    "BACKENDS",
    "DTYPES",
    "LAUNCHERS",
    "LOSSES",
    "MODES",
    "TRACKERS",
    "TrainConfig",
    "field_docs",
    "parse_config",
    "resolve_device",
]

BACKENDS = ("transformers", "vllm")
DTYPES = ("float32", "bfloat16")
LAUNCHERS = ("stack", "gym")
MODES = ("sync", "async")
IMPORTANCE_SAMPLING = tuple(str(mode) for mode in ImportanceSampling)
LOSSES = tuple(str(loss) for loss in LossType)
"""The policy losses (``nemogym_sdk.grpo.LossType``)."""
TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
_CHOICES = {
    "backend": BACKENDS,
    "dtype": DTYPES,
    "launcher": LAUNCHERS,
    "loss": LOSSES,
    "mode": MODES,
    "version_policy": VERSION_POLICIES,
    "importance_sampling": IMPORTANCE_SAMPLING,
}
"""The settings that take one of a few values, and those values: ``TrainConfig`` checks
them, ``--help`` shows them."""
REQUEST_TIMEOUT_S = 600.0
"""An episode's request timeout when ``episode_timeout`` is unset."""
SETTINGS_URL = f"{DOCS_URL}reference/train-config/"
"""The documentation's settings page (``docs/reference/train-config.md``)."""
"""The experiment trackers ``report_to`` may name (``nemogym_sdk.train.trackers``)."""


@attrs.frozen(kw_only=True)
class TrainConfig:
    """Everything a run of ``nemogym-train`` depends on."""

    model: str = "tiny"
    """``tiny`` (the SDK's built-in tiny Llama, built in process) or a local Hugging Face
    model directory."""
    model_family: str | None = None
    """Instead of ``model``: a model family's tiny model with a real vocabulary and chat
    template (``qwen2.5``, ``qwen3``, ``qwen3.5``, ``deepseek-r1``, ``llama3``; weights from
    ``seed``), built and cached on first use (docs/concepts/families.md)."""
    reasoning_parser: str | None = None
    """How the sampler reads a turn's reasoning, by vLLM's ``--reasoning-parser`` names
    (``qwen3``, ``deepseek_r1``; ``none``); default: the ``model_family``'s, else none."""
    tool_call_parser: str | None = None
    """How the sampler reads tool calls, by vLLM's ``--tool-call-parser`` names (``hermes``,
    ``qwen3_coder``, ``llama3_json``; ``none``); default: the ``model_family``'s, else
    ``hermes``."""
    history: str = "contiguous"
    """How the sampler's prompts hold the conversation: ``contiguous`` continues the model's
    own tokens of the earlier turns (what is trained is what was sampled), ``template``
    renders the chat template afresh, as plain vLLM does (an episode whose history the
    template rewrites is parsed into several traces, ``on_drift`` fork, each trained on the
    prompt it was sampled from; docs/concepts/drift.md). An attached sampler
    (``backend_url``) must be started with the same ``--history``."""
    backend: str = "transformers"
    """Who samples: ``transformers`` (``nemogym_sdk.serve``) or ``vllm`` (real vLLM; CPU
    needs ``make vllm-venv``)."""
    backend_url: str | None = None
    """Attach to a running sampler at this URL instead of starting one (it must serve the
    same weights and runtime LoRA routes)."""
    replicas: int = 1
    """Sampler replicas to start (``backend`` each), behind ``vllm-router``, with
    ``nemogym_sdk.serve`` in front splicing and publishing every adapter to all of them
    (``nemogym_sdk.samplers.start_samplers``); a group's rollouts stay on one replica."""
    router_url: str | None = None
    """Attach to replicas already running behind this ``vllm-router`` (with
    ``replica_urls``): only the proxy in front is started."""
    replica_urls: tuple[str, ...] = ()
    """The replicas behind ``router_url`` (each gets every adapter version)."""
    group_affinity: bool = False
    """Send each group's rollouts with its row id as the router's affinity key (always on
    with ``replicas > 1`` or ``router_url``; set it when ``backend_url`` is a proxy in
    front of a router the run attaches to)."""
    seeded_rollouts: bool = False
    """Send every rollout a sampling seed made from ``seed``, its group's number and its index
    (``data.rollout_seed``), so a group played again (a resumed run) draws the same tokens
    (always on when the run starts the ``transformers`` sampler or its replicas; set it when
    ``backend_url`` is such a sampler; never with vLLM on CPU, which a per-request seed in a
    batch crashes)."""
    device: str = "auto"
    """Where the learner (model, batches, loss) runs, and the ``transformers`` sampler it
    starts: ``auto`` (``cuda`` when torch sees a GPU, else ``cpu``), ``cpu``, ``cuda`` or
    ``cuda:N``. Under torchrun, ``cuda`` means each process's ``cuda:LOCAL_RANK``."""
    dtype: str = "float32"
    """The learner's base weights: ``float32`` (sampler and learner logprobs agree to ~1e-5)
    or ``bfloat16`` (half the memory on a GPU; the LoRA weights and the optimizer stay
    float32; the mismatch metric shows the difference). A vLLM sampler started by the run
    gets the same dtype; the ``transformers`` sampler stays float32."""
    fsdp: bool = False
    """Shard the learner over the ``torchrun`` ranks with FSDP2 (NCCL on GPUs, gloo on CPUs),
    for models that do not fit on one device; without it every rank holds the whole model."""
    adapter_name: str = "policy"
    """The name the LoRA adapter is served under; NeMo Gym's model server must request it."""
    environments: tuple[str, ...] = ("target_chars",)
    """Environments to start by name (the SDK's toy ``target_chars``, NeMo Gym's, or your own
    on ``env_path``)."""
    env_path: tuple[str, ...] = ()
    """Directories holding environments of your own (``<dir>/<name>/configs/<name>.yaml``),
    searched before the SDK's and NeMo Gym's (comma-separated); default
    ``$NEMOGYM_ENV_PATH``."""
    launcher: str = "stack"
    """Who starts ``environments``: ``stack`` (``GymStack``: the SDK starts each server, no
    Ray; fast on one machine) or ``gym`` (NeMo Gym's own launcher, ``gym env start``, with
    Ray and its head server)."""
    head_url: tuple[str, ...] = ()
    """Attach to running NeMo Gym deployments through their head servers instead (one or
    several, comma-separated): rows go to a deployment that runs their agent, balanced, and
    a deployment that goes away costs typed failures while the others go on."""
    train_file: str | None = None
    """NeMo Gym JSONL rows; default: the first environment's training data."""
    steps: int = 20
    """Training steps (each: play, learn, publish the adapter)."""
    rows_per_step: int = 4
    """Groups per step (across all processes)."""
    num_generations: int = 8
    """Rollouts per group."""
    lr: float = 2e-2
    """Adam's learning rate for the LoRA weights."""
    lora_rank: int = 8
    """The LoRA adapter's rank (``lora_alpha`` is twice it); at most 512, vLLM's largest."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts; the learner's logprobs use the same."""
    loss: str = "dapo"
    """The policy loss: ``grpo``, ``dapo``, ``dr_grpo`` or ``gspo``
    (``nemogym_sdk.grpo.LossType``)."""
    micro_batch_size: int = 16
    """Rows per forward and backward pass of the learner (gradients accumulate over a
    step's micro-batches)."""
    max_model_len: int = 2048
    """The sampler's context window; a prompt plus its completion must fit."""
    max_completion_length: int | None = None
    """Cut every episode's completion to this many tokens (default: no cut)."""
    prefetch: bool = False
    """Play step k+1's rollouts while step k trains (one adapter version stale; the loss's
    importance-sampling correction accounts for it). ``sync`` mode only."""
    mode: str = "sync"
    """``sync``: play a step, wait for its slowest episode, learn, sync, repeat. ``async``:
    episodes keep playing while the learner learns (``nemogym_sdk.RolloutEngine``), within
    ``max_staleness`` adapter versions."""
    max_staleness: int = 1
    """``async``: adapter versions a group may be trained behind the one it started on (0 is
    the synchronous schedule, run by the engine). The sampler keeps ``max_staleness + 2``
    versions loaded."""
    max_inflight: int | None = None
    """``async``: episodes playing at once (default: all the pacing allows,
    ``(max_staleness + 1) * rows_per_step * num_generations``, but no more than the sampler
    says it decodes at once, and at least one group)."""
    episode_timeout: float | None = None
    """Seconds an episode may play before it ends as a ``TIMEOUT`` failure, so a stuck one
    cannot hold a step (both modes; unset, its requests time out at 600 s)."""
    cut_stragglers: bool = False
    """``async``: hand out a group whose turn has come as soon as two of its episodes are
    ``OK``; the ones still playing end as ``TIMEOUT`` failures (a slow episode never holds
    the learner, at the price of favouring fast episodes within a group)."""
    version_policy: str = "pinned"
    """``async``: which adapter version answers a later turn of an episode that spans a sync:
    ``pinned`` (the one it started on) or ``in_flight`` (the newest)."""
    importance_sampling: str = "truncate"
    """The correction of tokens sampled by another (stale) policy: ``truncate`` the weight
    ``exp(old - sampler)`` into ``[is_floor, is_cap]``, ``mask`` tokens outside it, or
    ``none``."""
    is_cap: float = 3.0
    """Largest importance weight kept."""
    is_floor: float | None = None
    """Smallest importance weight kept (None: no floor)."""
    sync_retries: int = 0
    """How many times a refused adapter publish is tried again (every replica stays on the
    last version in between) before the run stops with the error."""
    max_failure_rate: float = 0.5
    """Stop the run (with a checkpoint at the last finished step) when more than this
    fraction of a step's rollouts failed: a NeMo Gym server that died, say. Failures below
    it are counted in the metrics and the run goes on; ``1`` never stops (episodes cut by
    ``cut_stragglers`` do not count)."""
    checkpoint_every: int = 10
    """Save the adapter and optimizer every this many steps (and at the end)."""
    resume: bool = False
    """Continue from the newest checkpoint in ``out``."""
    seed: int = 0
    """Seeds the tiny model, the LoRA initialisation, the row order and the sampler."""
    out: str = "runs/nemogym-train"
    """Where metrics, checkpoints, the reward curve and the server logs go."""
    report_to: tuple[str, ...] = ()
    """Experiment trackers that get every number of ``metrics.jsonl`` and the reward curve
    (comma-separated): ``tensorboard``, ``wandb``, ``mlflow``, ``trackio``; offline by
    default (``nemogym_sdk.train.trackers``; ``pip install 'nemogym-sdk[trackers]'``)."""

    def __attrs_post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        parse_device(self.device)
        self.output_parsers()  # unknown parser names: a ConfigError before any server starts
        if self.history not in ("contiguous", "template"):
            raise ConfigError(f"history must be 'contiguous' or 'template', got {self.history!r}")
        self._check_async()
        self._check_replicas()
        self._check_trackers()
        positive = ("steps", "rows_per_step", "num_generations", "lora_rank", "micro_batch_size")
        for name in (*positive, "max_model_len", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lora_rank > 512:
            raise ConfigError(f"lora_rank must be <= 512 (vLLM's largest), got {self.lora_rank}")
        if self.num_generations < 2:
            raise ConfigError(
                f"num_generations must be >= 2, got {self.num_generations}: GRPO compares "
                "rollouts of one row"
            )
        for name in ("lr", "temperature"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.environments and not self.head_url:
            raise ConfigError("name at least one environment, or attach with head_url")
        for entry in self.env_path:  # checked before the sampler starts, not after
            if not Path(entry).expanduser().is_dir():
                raise ConfigError(
                    f"env_path: {entry} is not a directory; it should hold environment "
                    "directories (<dir>/<name>/configs/<name>.yaml)"
                )
        if self.model_family is not None:
            from nemogym_sdk.serve.families.catalog import family_named

            family_named(self.model_family)  # a ConfigError naming the known families
            if self.model != "tiny":
                raise ConfigError(
                    f"model {self.model!r} and model_family {self.model_family!r} both name the "
                    "model to train; pass one of them"
                )
        if self.model != "tiny" and not (Path(self.model) / "config.json").is_file():
            raise ConfigError(
                f"model {self.model!r} is neither 'tiny' nor a local Hugging Face model "
                "directory (no config.json there); models are not downloaded"
            )

    def _check_trackers(self) -> None:
        unknown = [name for name in self.report_to if name not in TRACKERS]
        if unknown:
            raise ConfigError(
                f"report_to: unknown tracker(s) {', '.join(map(repr, unknown))}; choose from "
                f"{', '.join(TRACKERS)} (comma-separated)"
            )
        absent = _extras.missing(self.report_to)
        if absent:
            alone = f"or {' and '.join(absent)} alone"
            raise ConfigError(_extras.needs("report_to", absent, "trackers", instead=alone))

    def _check_replicas(self) -> None:
        if not 0 <= self.max_failure_rate <= 1:
            raise ConfigError(
                f"max_failure_rate is a fraction of a step's rollouts, in [0, 1]; got "
                f"{self.max_failure_rate}"
            )
        if self.sync_retries < 0:
            raise ConfigError(f"sync_retries must be >= 0, got {self.sync_retries}")
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if bool(self.router_url) != bool(self.replica_urls):
            raise ConfigError(
                "router_url and replica_urls go together: the router the proxy generates "
                "through, and the replicas behind it that every adapter is published to"
            )
        attached = [
            name
            for name, on in (
                ("backend_url", self.backend_url is not None),
                ("router_url", self.router_url is not None),
                ("replicas > 1", self.replicas > 1),
            )
            if on
        ]
        if len(attached) > 1:
            raise ConfigError(
                f"{' and '.join(attached)} are different samplers: start replicas (replicas), "
                "attach to running ones (router_url + replica_urls), or to one sampler "
                "(backend_url)"
            )

    @property
    def several_samplers(self) -> bool:
        """Whether rollouts go through a router to several sampler replicas (and carry
        their group's affinity key)."""
        return self.replicas > 1 or bool(self.replica_urls) or self.group_affinity

    def model_dir(self) -> str | None:
        """The directory the learner and the sampler load, ``None`` for the byte-level tiny
        model (built in process); a ``model_family``'s is built on first use, then cached."""
        if self.model_family is not None:
            from nemogym_sdk.serve.families import family_model_dir, family_named

            return str(family_model_dir(family_named(self.model_family), seed=self.seed))
        return None if self.model == "tiny" else self.model

    def output_parsers(self) -> OutputParsers:
        """How the sampler reads reasoning and tool calls out of a generated turn: the
        parsers named, else the ``model_family``'s, else hermes tool calls only."""
        from nemogym_sdk.serve.parsers import OutputParsers  # the settings module stays light

        family = None
        if self.model_family is not None:
            from nemogym_sdk.serve.families.catalog import family_named

            family = family_named(self.model_family)

        def chosen(given: str | None, field: str, default: str | None) -> str | None:
            if given is not None:
                return None if given == "none" else given
            return getattr(family, field) if family is not None else default

        return OutputParsers(
            reasoning=chosen(self.reasoning_parser, "reasoning_parser", None),
            tool_calls=chosen(self.tool_call_parser, "tool_call_parser", "hermes"),
        )

    def serve_args(self) -> list[str]:
        """``nemogym_sdk.serve``'s flags for `output_parsers` and ``history``."""
        parsers = self.output_parsers()
        args = ["--tool-call-parser", parsers.tool_calls or "none", "--history", self.history]
        if parsers.reasoning is not None:
            args += ["--reasoning-parser", parsers.reasoning]
        return args

    def _check_async(self) -> None:
        if self.mode == "async" and self.prefetch:
            raise ConfigError(
                "prefetch is the sync mode's one-step overlap; --mode async overlaps by "
                "itself (drop --prefetch, or use --mode sync)"
            )
        self.engine_options()  # max_staleness, max_inflight, episode_timeout: checked there
        PolicyLoss(  # the loss knobs, checked now rather than at the first step
            importance_sampling=self.importance_sampling, is_cap=self.is_cap, is_floor=self.is_floor
        )

    def engine_options(self, capacity: int | None = None) -> EngineOptions:
        """How the rollout engine plays this run's groups (``--mode async``; the sync mode
        reads only its ``parse``). ``capacity``: how many generations the sampler decodes at
        once (`LoraSync.decode_capacity`); without ``max_inflight`` the engine then starts
        no more episodes than that (at least one group's), so an episode's deadline
        measures the episode rather than a queue at the sampler."""
        options = EngineOptions(
            num_generations=self.num_generations,
            groups_per_step=self.rows_per_step,
            max_staleness=self.max_staleness,
            max_inflight=self.max_inflight,
            episode_timeout=self.episode_timeout,
            cut_stragglers=self.cut_stragglers,
            seed=self.rollouts_seed,
            parse=ParseOptions(
                on_drift=DriftPolicy.FORK if self.history == "template" else DriftPolicy.MARK,
                max_completion_length=self.max_completion_length,
            ),
        )
        if self.max_inflight is not None or capacity is None:
            return options
        # all the pacing allows (``options.inflight``), capped, and never below one group
        capped = max(self.num_generations, min(options.inflight, capacity))
        return attrs.evolve(options, max_inflight=capped)

    @property
    def rollouts_seed(self) -> int | None:
        """The seed the rollouts' sampling seeds are made from (``seeded_rollouts``,
        ``data.rollout_seed``): ``seed``, or None (the sampler's own draws)."""
        started = self.backend_url is None and self.router_url is None
        seeded = self.seeded_rollouts or (started and self.backend == "transformers")
        return self.seed if seeded else None

    @property
    def adapter_versions(self) -> int:
        """Adapter versions the sampler keeps side by side: ``max_staleness + 2`` in async
        mode (those in-flight episodes started on, and the one being published), else 1."""
        return self.max_staleness + 2 if self.mode == "async" else 1


def _field_type(field: attrs.Attribute[Any]) -> Any:
    hints = typing.get_type_hints(TrainConfig)
    kind = hints[field.name]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return kind


def _coerce(name: str, value: Any, kind: Any) -> Any:
    if value is None:
        return None
    if typing.get_origin(kind) is tuple:
        items = value.split(",") if isinstance(value, str) else value
        return tuple(str(item).strip() for item in items if str(item).strip())
    if kind is bool and isinstance(value, str):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
    try:
        return kind(value) if kind in (int, float, str, bool) else value
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r}") from None


@functools.cache
def field_docs() -> dict[str, str]:
    """Each ``TrainConfig`` field's docstring (the string right after it), by field name,
    read from this module's source with ``ast``: the one text behind ``--help`` and the
    documentation's settings page. Empty where the source is not installed."""
    try:
        tree = ast.parse(inspect.getsource(TrainConfig))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    found: dict[str, str] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[node.target.id] = inspect.cleandoc(after.value.value)
    return found


def _shown(default: object) -> str:
    """A default as a user would write it: ``a,b`` for a list, ``none`` for no value."""
    if isinstance(default, tuple):
        return ",".join(map(str, default)) if default else "none"
    return "none" if default is None else str(default)


_UNSET_MEANS = {"episode_timeout": f"{REQUEST_TIMEOUT_S:g}"}
"""Settings whose unset value stands for a number the trainer uses (``--help`` shows it)."""


def _help(name: str, default: object) -> str:
    """A flag's ``--help``: its field's docstring on one line, then the default."""
    text = re.sub(r"``(.+?)``", r"\1", " ".join(field_docs().get(name, "").split()))
    shown = _UNSET_MEANS.get(name, _shown(default)) if default is None else _shown(default)
    return f"{text} (default: {shown})".replace("%", "%%").strip()


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """The config from ``--config FILE`` (YAML), then the flags on top.

    The parser is argparse, one flag per field with its docstring as help: a command-line
    library (tyro, simple-parsing) would add a dependency for these lines and still not
    merge the YAML file under the flags, which is what a run's config needs."""
    fields = {f.name: f for f in attrs.fields(TrainConfig)}
    parser = argparse.ArgumentParser(
        prog="nemogym-train",
        description="GRPO on NeMo Gym environments, from SDK parts.",
        epilog=f"Every setting, with its default and what it does:\n  {SETTINGS_URL}",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the URL on one line
    )

    parser.add_argument("--config", type=Path, help="YAML file; its keys are the flags' names")
    for name, field in fields.items():
        flag = "--" + name.replace("_", "-")
        helps = _help(name, field.default)
        if _field_type(field) is bool:
            parser.add_argument(
                flag, dest=name, default=None, action=argparse.BooleanOptionalAction, help=helps
            )
        else:
            shown = "{" + ",".join(_CHOICES[name]) + "}" if name in _CHOICES else None
            parser.add_argument(flag, dest=name, default=None, metavar=shown, help=helps)
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    if args.config is not None:
        if not args.config.is_file():
            raise ConfigError(f"config file {args.config} does not exist")
        loaded = yaml.safe_load(args.config.read_text()) or {}
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"{args.config} must hold a mapping of settings")
        unknown = sorted(set(loaded) - set(fields))
        if unknown:
            raise ConfigError(
                f"{args.config}: unknown setting(s) {', '.join(unknown)}; known: "
                f"{', '.join(fields)}"
            )
        values.update(loaded)
    values.update({k: v for k, v in vars(args).items() if k in fields and v is not None})
    typed = {k: _coerce(k, v, _field_type(fields[k])) for k, v in values.items()}
    return TrainConfig(**typed)


def resolve_device(config: TrainConfig, local_rank: int = 0, world: int = 1) -> str:
    """The torch device this process trains on, e.g. ``cpu``, ``cuda`` or ``cuda:1``.

    ``auto`` picks CUDA when torch sees a GPU; with several processes ``cuda`` becomes
    ``cuda:LOCAL_RANK`` (modulo the GPUs visible). Raises ``ConfigError`` when CUDA is asked
    for and torch has none (saying what to install) or the index is not visible.
    """
    return str(torch_device(config.device, local_rank=local_rank, world=world))
