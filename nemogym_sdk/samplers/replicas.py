"""Several sampler replicas serving one policy: workers, ``vllm-router``, and the SDK's proxy.

``start_samplers`` starts, on this machine::

    NeMo Gym's vllm_model ──► nemogym_sdk.serve (proxy) ──► vllm-router ──► replica x N
                               splice, versions, affinity     consistent_hash   vLLM, or
                               adapters ──────────────────────────────────────► nemogym_sdk.serve

- **replicas**: real vLLM (``backend="vllm"``, each its own process, ``--max-loras`` the
  versions kept) or ``nemogym_sdk.serve`` workers (``backend="transformers"``, the CPU
  server, answering vLLM's token-in ``/v1/completions``);
- **the router** (``start_router``): a group's affinity key always reaches one healthy
  replica; a dead replica is dropped;
- **the proxy** in front: the token-exact splice (the router drops NeMo Gym's per-message
  token ids, so the splice cannot happen behind it), the adapter versions, and publication:
  every adapter load goes to every replica, confirmed, all or nothing (``--replica``).

``SamplerFleet.base_url`` is what NeMo Gym's model server and ``LoraSync`` point at, as for
a single sampler. On several machines, start the same three roles there (the replicas on
the GPU nodes) and pass their URLs (``docs/scale-out.md``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.hosts import openai_url
from nemogym_sdk.processes import StopOnExit
from nemogym_sdk.samplers.backend import BackendProcess, start_serve
from nemogym_sdk.samplers.router import RouterProcess, start_router

__all__ = ["SamplerFleet", "start_proxy", "start_samplers"]

BACKENDS = ("transformers", "vllm")


@attrs.define(kw_only=True, eq=False)
class SamplerFleet(StopOnExit):
    """Replicas, the router in front of them, and the proxy in front of the router."""

    replicas: list[BackendProcess]
    """The samplers (their ``base_url`` is what the router routes to)."""
    router: RouterProcess
    """``vllm-router`` over the replicas."""
    proxy: BackendProcess
    """``nemogym_sdk.serve --backend vllm`` in front of the router."""

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` of the proxy: where NeMo Gym and ``LoraSync`` go."""
        return self.proxy.base_url

    @property
    def replica_urls(self) -> list[str]:
        """Each replica's ``http://127.0.0.1:<port>/v1``."""
        return [replica.base_url for replica in self.replicas]

    def kill(self, index: int) -> None:
        """Stop replica ``index`` at once (a crash, for fault tests): SIGKILL its group."""
        replica = self.replicas[index]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(replica.pid, signal.SIGKILL)
        replica.stop()  # reaps it

    def stop(self) -> None:
        """Stop the proxy, the router and the replicas (idempotent)."""
        with contextlib.ExitStack() as stack:  # every stop runs, even if one raises
            for replica in self.replicas:
                stack.callback(replica.stop)
            stack.callback(self.router.stop)
            stack.callback(self.proxy.stop)


def start_samplers(
    count: int,
    model_dir: str | os.PathLike[str],
    *,
    backend: str = "transformers",
    logprobs_mode: str = "processed_logprobs",
    seed: int = 0,
    adapter_versions: int = 1,
    version_policy: str = "pinned",
    max_model_len: int = 2048,
    max_lora_rank: int = 8,
    dtype: str = "float32",
    replica_args: Sequence[str] = (),
    proxy_args: Sequence[str] = (),
    log_dir: str | os.PathLike[str] | None = None,
    proxy_port: int | None = None,
) -> SamplerFleet:
    """Start ``count`` replicas of ``model_dir``, ``vllm-router`` over them and the proxy.

    Args:
        count: replicas (>= 1).
        model_dir: a local model directory every replica serves and the proxy tokenizes with
            (``save_tiny`` writes the tiny one).
        backend: ``transformers`` (``nemogym_sdk.serve`` workers) or ``vllm``.
        logprobs_mode: the logprobs every replica reports (the proxy checks it).
        seed: replica ``i`` samples with seed ``seed + i``.
        adapter_versions: adapter versions kept side by side (the proxy's
            ``--adapter-versions``; vLLM replicas get it as ``--max-loras``).
        version_policy: ``pinned`` or ``in_flight`` (the proxy's ``--version-policy``).
        max_model_len: the context window of vLLM replicas.
        max_lora_rank: vLLM replicas' ``--max-lora-rank``.
        dtype: vLLM replicas' ``--dtype`` (``nemogym_sdk.serve`` workers run float32).
        replica_args: more flags for every replica; ``{replica}`` in a flag becomes the
            replica's index (e.g. ``--record`` to ``rec-{replica}.jsonl``).
        proxy_args: more flags for the proxy (its ``--reasoning-parser`` and
            ``--tool-call-parser``: the proxy builds the chat message).
        log_dir: where each process logs (``replica-<i>.log``, ``router.log``, ``proxy.log``).
        proxy_port: the proxy's loopback port, chosen beforehand so that its URL can be
            handed out before it answers (default a free one).

    Several replicas are forked from one fork server each kind (torch, transformers and
    peft, or vLLM's API server, imported once: ``nemogym_sdk.processes.forkserver``), and
    the proxy in front of ``transformers`` replicas from theirs.
    Everything started is stopped again if a later start fails.
    """
    if count < 1:
        raise ConfigError(f"start_samplers needs at least one replica, got {count}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    model = Path(model_dir)
    logs = Path(log_dir) if log_dir is not None else None

    def log(name: str) -> Path | None:
        return None if logs is None else logs / f"{name}.log"

    with contextlib.ExitStack() as started:
        replicas = _start_replicas(
            count,
            lambda i: _replica(
                backend,
                model,
                i,
                seed,
                logprobs_mode,
                adapter_versions,
                log(f"replica-{i}"),
                max_model_len,
                max_lora_rank,
                dtype,
                [arg.replace("{replica}", str(i)) for arg in replica_args],
                fork=count > 1,
            ),
        )
        for replica in replicas:
            started.callback(replica.stop)
        router = started.enter_context(
            start_router([r.base_url for r in replicas], log_path=log("router"))
        )
        proxy = started.enter_context(
            start_proxy(
                router.base_url,
                model,
                replicas=[replica.base_url for replica in replicas],
                logprobs_mode=logprobs_mode,
                adapter_versions=adapter_versions,
                version_policy=version_policy,
                extra_args=proxy_args,
                log_path=log("proxy"),
                port=proxy_port,
                fork=count > 1 and backend == "transformers",  # the replicas' fork server
            )
        )
        started.pop_all()
    return SamplerFleet(replicas=replicas, router=router, proxy=proxy)


def start_proxy(
    vllm_url: str,
    model_dir: str | os.PathLike[str],
    *,
    replicas: Sequence[str] = (),
    logprobs_mode: str = "processed_logprobs",
    adapter_versions: int = 1,
    version_policy: str = "pinned",
    extra_args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    port: int | None = None,
    fork: bool = False,
) -> BackendProcess:
    """``nemogym_sdk.serve --backend vllm`` in front of ``vllm_url`` (one vLLM server, or a
    router over ``replicas``, each of which then gets every adapter): the token-exact splice
    and the adapter versions kept side by side; ``extra_args`` are more of its flags (the
    output parsers: ``--reasoning-parser``, ``--tool-call-parser``); ``port``: its loopback
    port, chosen beforehand (default a free one); ``fork``: fork it from this process's
    sampler fork server (`start_serve`'s ``fork``), where one runs anyway."""
    args = ["--backend", "vllm", "--vllm-url", openai_url(vllm_url)]
    args += [a for url in replicas for a in ("--replica", openai_url(url))]
    args += ["--adapter-versions", str(adapter_versions), "--version-policy", version_policy]
    args += list(extra_args)
    return start_serve(
        mode="sample",
        logprobs_mode=logprobs_mode,
        model=str(model_dir),
        extra_args=args,
        log_path=log_path,
        port=port,
        fork=fork,
    )


def _start_replicas(count: int, start: Callable[[int], BackendProcess]) -> list[BackendProcess]:
    """Start ``count`` replicas at once (a vLLM start takes a while); if one fails, the ones
    that started are stopped and its error is raised."""
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(start, i) for i in range(count)]
        concurrent.futures.wait(futures)
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is not None:
        for future in futures:
            if future.exception() is None:
                future.result().stop()
        raise failed
    return [future.result() for future in futures]


def _replica(
    backend: str,
    model: Path,
    index: int,
    seed: int,
    logprobs_mode: str,
    adapter_versions: int,
    log_path: Path | None,
    max_model_len: int,
    max_lora_rank: int,
    dtype: str,
    extra_args: Sequence[str],
    *,
    fork: bool,
) -> BackendProcess:
    if backend == "vllm":
        from nemogym_sdk.samplers.vllm import start_vllm

        return start_vllm(
            model,
            max_model_len=max_model_len,
            max_lora_rank=max_lora_rank,
            max_loras=max(2, adapter_versions),
            dtype=dtype,
            seed=seed + index,
            extra_args=["--logprobs-mode", logprobs_mode, *extra_args],
            log_path=log_path,
            fork=fork,
        )
    return start_serve(
        mode="sample",
        logprobs_mode=logprobs_mode,
        model=str(model),
        seed=seed + index,
        extra_args=list(extra_args),
        log_path=log_path,
        fork=fork,  # several replicas: torch and transformers imported once for all
    )
