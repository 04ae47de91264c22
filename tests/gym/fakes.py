"""A miniature NeMo Gym venv on disk: toy environments, resolved by NeMo Gym's own code.

It is a venv-shaped directory (``bin/python``, ``site-packages/nemo_gym``: links to the
real NeMo Gym venv's) whose :class:`GymVenv` runs the real venv's interpreter, so every
miniature venv shares one resolver worker: NeMo Gym's parser, with this site-packages
searched first (the root the SDK gives every environment, then the venv's site-packages),
finds the toy configs here. Its servers are ``TOY_APP``: a stand-in that,
like a NeMo Gym server, finds its block in ``NEMO_GYM_CONFIG_DICT`` under
``NEMO_GYM_CONFIG_PATH``, binds that host and port and answers ``GET /``. ``GET /probe``
reports what the process saw (instance, cwd, ``__file__``, ``PYTHONPATH``, a data file).
Without a real NeMo Gym venv the tests that make one skip (fail under
``NEMOGYM_REQUIRE_GYM=1``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from nemogym_sdk.gym import GymVenv, GymVenvNotFoundError, find_gym_venv
from tests.require import absent

TOY_CONFIG: dict[str, Any] = {
    "toy": {
        "resources_servers": {
            "toy": {"entrypoint": "app.py", "domain": "agent", "description": "a toy"}
        }
    },
    "toy_simple_agent": {
        "responses_api_agents": {
            "simple_agent": {
                "entrypoint": "app.py",
                "resources_server": {"type": "resources_servers", "name": "toy"},
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
                "datasets": [
                    {
                        "name": "example",
                        "type": "example",
                        "jsonl_fpath": "resources_servers/toy/data/example.jsonl",
                    }
                ],
            }
        }
    },
    "toy_environment_server": {
        "environment_servers": {
            "legacy_agent": {
                "entrypoint": "app.py",
                "agent_server": {"type": "responses_api_agents", "name": "toy_simple_agent"},
            }
        }
    },
}

TOY_APP = """
import json, os, sys, yaml
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

instance = os.environ["NEMO_GYM_CONFIG_PATH"]
config = yaml.safe_load(os.environ["NEMO_GYM_CONFIG_DICT"])
(server_type,) = config[instance]
(block,) = config[instance][server_type].values()
data = Path(__file__).parent / "data" / "guesses.txt"
probe = {
    "instance": instance,
    "cwd": os.getcwd(),
    "file": os.path.abspath(__file__),
    "pythonpath": os.environ.get("PYTHONPATH"),
    "data": data.read_text() if data.is_file() else None,
    "config": config,
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(probe if self.path == "/probe" else {"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


print("toy server", instance, "on", block["port"], flush=True)
HTTPServer((block["host"], block["port"]), Handler).serve_forever()
"""

TOY_ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "name": "poke", "parameters": {"type": "object"}}],
    },
    "target": 3,
}


def real_gym_venv() -> GymVenv:
    """The real NeMo Gym venv (the test is skipped without one)."""
    try:
        return find_gym_venv()
    except GymVenvNotFoundError as exc:
        absent(f"NeMo Gym venv absent, test skipped: {exc}")


def make_venv(root: Path, environments: dict[str, dict[str, Any]] | None = None) -> GymVenv:
    """A venv-shaped directory whose site-packages holds shipped-style environment
    configs; its interpreter is the real NeMo Gym venv's (see the module docstring)."""
    real = real_gym_venv()
    site = root / "lib" / "python3.13" / "site-packages"
    site.mkdir(parents=True)
    (site / "nemo_gym").symlink_to(real.site_packages / "nemo_gym")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(real.python)
    for name, config in (environments if environments is not None else {"toy": TOY_CONFIG}).items():
        server_dir = site / "resources_servers" / name
        (server_dir / "configs").mkdir(parents=True)
        (server_dir / "data").mkdir()
        (server_dir / "configs" / f"{name}.yaml").write_text(yaml.safe_dump(config))
        (server_dir / "data" / "example.jsonl").write_text(json.dumps(TOY_ROW) + "\n\n")
        (server_dir / "app.py").write_text(TOY_APP)
    for impl_dir in ("responses_api_agents/simple_agent", "responses_api_models/vllm_model"):
        (site / impl_dir).mkdir(parents=True)
        (site / impl_dir / "app.py").write_text(TOY_APP)
    found = find_gym_venv(root)
    return GymVenv(root=found.root, python=real.python, site_packages=found.site_packages)


def counting_ports(start: int = 20000) -> Any:
    """A port allocator returning consecutive ports from ``start``."""

    def allocate(count: int) -> list[int]:
        nonlocal start
        ports = list(range(start, start + count))
        start += count
        return ports

    return allocate
