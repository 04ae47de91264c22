"""Head-server entry point, executed by the NeMo Gym venv's interpreter (Python 3.13).

Not imported by nemogym_sdk: :mod:`nemogym_sdk.gym.stack` runs it as
``<gym venv>/bin/python -P head_main.py <instances.json>`` with the stack's global config
in ``NEMO_GYM_CONFIG_DICT``. It serves NeMo Gym's own ``HeadServer`` (the class
``gym env start`` runs in a thread of its main process), so ``/server_instances``,
``/global_config_dict_yaml``, ``/readyz`` ... are answered by real NeMo Gym code:

1. ``HeadServer.run_webserver()`` binds ``head_server.host:port`` from the config;
2. the server list is set from ``instances.json`` (one ``ServerInstanceDisplayConfig``
   per server, validated by NeMo Gym's pydantic model), as ``gym env start`` does;
3. every server is polled with NeMo Gym's ``ServerClient.poll_for_status`` and the head
   is marked ready (``/readyz`` 200) once all answer, as ``RunHelper`` does;
4. it then serves until SIGTERM or SIGINT.

What it leaves out of ``gym env start``: Ray, per-server venv set-up, spawning the
servers (the SDK spawns them) and the model-endpoint probe.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    """Serve the head server until SIGTERM/SIGINT; ``argv[0]`` is the instances JSON file."""
    from nemo_gym.global_config import get_global_config_dict  # type: ignore[import-not-found]
    from nemo_gym.server_utils import (  # type: ignore[import-not-found]
        HeadServer,
        ServerClient,
        ServerInstanceDisplayConfig,
    )

    instances: list[dict[str, Any]] = json.loads(Path(argv[0]).read_text())
    stop = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    uvicorn_server, thread, head = HeadServer.run_webserver()
    head.set_server_instances(
        [ServerInstanceDisplayConfig(**item).model_dump(mode="json") for item in instances]
    )
    client = ServerClient(
        head_server_config=ServerClient.load_head_server_config(),
        global_config_dict=get_global_config_dict(),
    )
    pending = [item["process_name"] for item in instances]
    while pending and not stop.is_set() and thread.is_alive():
        pending = [
            name for name in pending if client.poll_for_status(name, timeout_seconds=1) != "success"
        ]
        if pending:
            stop.wait(0.2)
    if not stop.is_set() and thread.is_alive():
        head.mark_ready()
        print(f"head server ready: {len(instances)} server instances", flush=True)
    while not stop.is_set() and thread.is_alive():
        stop.wait(0.5)
    if not stop.is_set():
        print("head server thread ended unexpectedly", file=sys.stderr, flush=True)
        return 1
    uvicorn_server.should_exit = True
    thread.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
