"""vLLM's OpenAI-compatible server with its EngineCore forked, not spawned: run by the vLLM
venv's interpreter as ``python -P _vllm_main.py <the server's flags>`` (``start_vllm``
with ``engine_fork``). Not imported by nemogym_sdk: it runs under vLLM's Python, with
nothing of the SDK on its path, and imports only vLLM and the standard library.

The API server starts its EngineCore with the start method ``VLLM_WORKER_MULTIPROC_METHOD``
names: ``fork`` by default, unless CUDA is initialized. vLLM's CPU build sets it to
``spawn`` while it checks the config, so the EngineCore is a new interpreter that imports
vLLM again: ~9 CPU-s a start on a 2-core box, the server ready in ~23 s instead of ~11 s.
Here the CPU platform's check runs as before and the method is put back to ``fork`` after
it. The API server has computed nothing with torch when it starts the engine (no OpenMP
thread pool exists yet), and with ``start_vllm``'s ``worker_in_engine`` the model runs in
the EngineCore, so the engine's threads are its own as they are when spawned.

If this vLLM has no CPU platform class of that shape, nothing is changed and the server
starts as ``python -m vllm.entrypoints.openai.api_server`` would; the first line it writes
to stderr says which.
"""

from __future__ import annotations

import os
import runpy
import sys

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def _fork_the_engine() -> bool:
    """Put the start method back to ``fork`` once the CPU platform has checked the config;
    whether this vLLM's CPU platform could be changed so."""
    try:
        from vllm.platforms.cpu import CpuPlatform  # type: ignore[import-not-found]
    except ImportError:
        return False
    check = CpuPlatform.__dict__.get("check_and_update_config")
    if not isinstance(check, classmethod):
        return False
    original = check.__func__

    def check_then_fork(cls: type, vllm_config: object) -> None:
        original(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    CpuPlatform.check_and_update_config = classmethod(check_then_fork)
    return True


def main() -> None:
    if _fork_the_engine():
        print("nemogym: the EngineCore is forked from the API server", file=sys.stderr)
    else:
        print(
            "nemogym: no CPU platform to change: the EngineCore starts as vLLM starts it",
            file=sys.stderr,
        )
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
