"""The reference trainer's sampler: started for the run, or attached to.

``sampler(config, out, device)`` yields the OpenAI base URL NeMo Gym's model server and
``LoraSync`` use:

- ``backend_url``: a running sampler, checked to answer;
- ``transformers``: ``nemogym_sdk.serve`` on the learner's device;
- ``vllm``: real vLLM, with ``nemogym_sdk.serve`` in front splicing token-exact prompts;
- ``replicas > 1`` (or ``router_url`` + ``replica_urls``): several replicas behind
  ``vllm-router``, the proxy in front publishing every adapter to each.

Every started sampler keeps the adapter versions the staleness bound needs
(``--adapter-versions``) and reports ``processed_logprobs``. ``finish_groups`` tells the
router in front of replicas that a step's groups are done.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import requests

from nemogym_sdk._net.http import check, send
from nemogym_sdk.errors import ConfigError, NemoGymError
from nemogym_sdk.hosts import openai_url
from nemogym_sdk.processes import LOOPBACK, free_loopback_ports
from nemogym_sdk.train.config import TrainConfig
from nemogym_sdk.train.outputs import say

__all__ = ["finish_groups", "fork_ahead", "planned_url", "sampler"]

logger = logging.getLogger(__name__)


def planned_url(config: TrainConfig) -> tuple[str, int | None]:
    """The sampler's base URL before it starts, and the port to start its front server on
    (the ``transformers`` sampler, or the proxy in front of vLLM or of the replicas): a free
    loopback port, or none for the sampler the run attaches to. NeMo Gym can then start
    while the sampler does."""
    if config.backend_url is not None:
        return openai_url(config.backend_url), None
    (port,) = free_loopback_ports(1)
    return f"http://{LOOPBACK}:{port}/v1", port


@contextlib.contextmanager
def sampler(
    config: TrainConfig, out: Path, device: str = "cpu", port: int | None = None
) -> Iterator[str]:
    """The sampler's base URL (``.../v1``): started for this run (the ``transformers`` one on
    ``device``, the learner's; its front server on ``port``, `planned_url`'s), or the one to
    attach to."""
    logs = out / "logs"
    if config.backend_url is not None:
        url = openai_url(config.backend_url)
        try:
            with requests.Session() as http:
                check(send(http, "GET", f"{url}/models", timeout=10), f"{url}/models")
        except NemoGymError as exc:
            raise ConfigError(
                f"backend_url {url} is not reachable ({exc}); start the sampler first, or drop "
                "backend_url to let nemogym-train start one"
            ) from None
        yield url
        return
    from nemogym_sdk.samplers import start_serve

    model = config.model_dir()
    if _replicated(config):
        yield from _replicated_sampler(config, out, model, device, port)
        return
    if _starts_one_sampler(config):
        name = config.model_family or config.model
        say(f"starting the sampler (nemogym_sdk.serve, model {name}, on {device})...")
        with start_serve(
            mode="sample",
            logprobs_mode="processed_logprobs",  # the distribution sampled from: what GRPO needs
            model=model,
            seed=config.seed,
            extra_args=["--device", device, *_version_args(config), *config.serve_args()],
            log_path=logs / "serve.log",
            port=port,
            fork=True,  # from the copy of this process `fork_ahead` made, where it made one
        ) as served:
            yield served.base_url
        return
    yield from _vllm_sampler(config, out, model, device, port)


def fork_ahead(config: TrainConfig) -> bool:
    """Where this run starts a ``transformers`` sampler (rank 0), fork this process now,
    before any thread of its own, into the fork server `sampler` forks it from: its imports
    (torch, transformers, peft: ~4 s of CPU) are then this process's, not a new
    interpreter's (`nemogym_sdk.processes.zygote`). False where it did not."""
    if not _starts_one_sampler(config):
        return False
    if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 starts the sampler
        return False
    from nemogym_sdk.processes.zygote import fork_this_process
    from nemogym_sdk.samplers.backend import SERVE_PRELOAD, serve_env

    return fork_this_process(SERVE_PRELOAD, serve_env())


def _replicated(config: TrainConfig) -> bool:
    """Whether the run samples from replicas behind vllm-router (started, or attached to)."""
    return config.replicas > 1 or config.router_url is not None


def _starts_one_sampler(config: TrainConfig) -> bool:
    """Whether `sampler` starts one ``transformers`` sampler (``nemogym_sdk.serve``)."""
    attached = config.backend_url is not None
    return not attached and not _replicated(config) and config.backend == "transformers"


def _vllm_sampler(
    config: TrainConfig, out: Path, model: str | None, device: str, port: int | None
) -> Iterator[str]:
    """Real vLLM, with ``nemogym_sdk.serve`` in front splicing token-exact multi-turn prompts."""
    from nemogym_sdk.samplers import start_proxy, start_vllm
    from nemogym_sdk.serve.tiny import save_tiny

    model_dir = Path(model) if model is not None else save_tiny(out / "model", config.seed)
    logs = out / "logs"
    say("starting vLLM and the token-exact proxy in front of it...")
    with (
        start_vllm(
            model_dir,
            max_model_len=config.max_model_len,
            max_lora_rank=next(r for r in (8, 16, 32, 64, 128, 256, 512) if r >= config.lora_rank),
            max_loras=max(2, config.adapter_versions),  # every version kept, in one batch
            dtype=config.dtype,  # the learner's: the mismatch then measures kernels only
            seed=config.seed,
            extra_args=[
                *("--logprobs-mode", "processed_logprobs"),
                # vLLM wants 90 % of a GPU free at start by default; the learner is on it too
                *(("--gpu-memory-utilization", "0.5") if device.startswith("cuda") else ()),
            ],
            log_path=logs / "vllm.log",
        ) as vllm,
        start_proxy(
            vllm.base_url,
            model_dir,
            adapter_versions=config.adapter_versions,
            version_policy=config.version_policy,
            extra_args=config.serve_args(),
            log_path=logs / "serve.log",
            port=port,
        ) as proxy,
    ):
        yield proxy.base_url


def _replicated_sampler(
    config: TrainConfig, out: Path, model: str | None, device: str, port: int | None
) -> Iterator[str]:
    """Several replicas behind ``vllm-router``, ``nemogym_sdk.serve`` in front of it: the
    ones started here (``replicas``), or running ones (``router_url`` + ``replica_urls``)."""
    from nemogym_sdk.samplers import start_proxy, start_samplers
    from nemogym_sdk.serve.tiny import save_tiny

    model_dir = Path(model) if model is not None else save_tiny(out / "model", config.seed)
    logs = out / "logs"
    if config.router_url is not None:
        with start_proxy(
            config.router_url,
            model_dir,
            replicas=config.replica_urls,
            adapter_versions=config.adapter_versions,
            version_policy=config.version_policy,
            extra_args=config.serve_args(),
            log_path=logs / "serve.log",
            port=port,
        ) as proxy:
            yield proxy.base_url
        return
    on_gpu = device.startswith("cuda")
    replica_args = ["--device", device] if config.backend == "transformers" else []
    if config.backend == "vllm" and on_gpu:
        replica_args = ["--gpu-memory-utilization", str(round(0.5 / config.replicas, 2))]
    say(f"starting {config.replicas} {config.backend} sampler replicas behind vllm-router...")
    with start_samplers(
        config.replicas,
        model_dir,
        backend=config.backend,
        seed=config.seed,
        adapter_versions=config.adapter_versions,
        version_policy=config.version_policy,
        max_model_len=config.max_model_len,
        max_lora_rank=next(r for r in (8, 16, 32, 64, 128, 256, 512) if r >= config.lora_rank),
        dtype=config.dtype,
        replica_args=replica_args,
        proxy_args=config.serve_args(),
        log_dir=logs,
        proxy_port=port,
    ) as fleet:
        yield fleet.base_url


def _version_args(config: TrainConfig) -> list[str]:
    """The sampler keeps the adapter versions the staleness bound needs side by side."""
    return [
        *("--adapter-versions", str(config.adapter_versions)),
        *("--version-policy", config.version_policy),
    ]


def finish_groups(base_url: str | None, groups: Sequence[tuple[int, str]]) -> None:
    """A step's groups are trained, so done: the router in front of the replicas at
    ``base_url`` (the main rank's sampler; None: no sampler to tell) forgets their keys
    (the row ids ``AgentClient`` sends with ``group_affinity``), and its table holds the
    groups in flight only, over a run of any length. A refusal is logged, never fatal: the
    router's balance is at stake, not the run."""
    from nemogym_sdk.samplers import finish_sessions

    if base_url is None:
        return
    refused = finish_sessions(base_url, [row for _, row in groups])
    if refused:
        logger.warning(
            "the router behind %s did not forget %d finished group(s): %s",
            base_url,
            len(refused),
            refused[0],
        )
