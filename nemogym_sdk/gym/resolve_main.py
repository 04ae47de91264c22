"""Config-resolution entry point, executed by the NeMo Gym venv's interpreter (Python 3.13).

Not imported by nemogym_sdk: :mod:`nemogym_sdk.gym.resolve` runs it as
``<gym venv>/bin/python -P resolve_main.py``, a worker that answers one request per line
of stdin with one line of JSON on stdout (NeMo Gym is imported once, not per stack), and
reads the answers as data. It exits at the end of its input (the SDK's process ended or
closed it) or after :data:`IDLE_S` without a request. Every environment is resolved
by NeMo Gym's own ``GlobalConfigDictParser.parse`` (what ``gym env start`` and
``gym env resolve`` run), offline, without the command line or ``env.yaml``, on NeMo
Gym's model-less placeholder config (``NO_MODEL_GLOBAL_CONFIG_DICT``) plus the
environment's config file. So these come from NeMo Gym itself: finding ``config_paths``
(extra roots, cwd, install root), their precedence, ``_inherit_from``/``_copy``/
``_delete_key`` and their string forms, unbound-agent composition, legacy agent aliases,
the generated environment servers, the almost-server report, the model-pairing check
(``allowed_model_types``, against the ``vllm_model`` the stack serves the policy with),
the defaults the parser fills in, and the resolution of dataset paths (``jsonl_fpath``).

Two steps of ``parse`` are deferred, because they judge the config before the stack has
added its own servers (the policy, judges, ports):

* ``validate_and_populate_defaults`` (server references, host and port): the SDK pins
  every address itself and checks every reference once its servers are in;
* ``raise_on_missing_values`` (``???``): the paths are reported, not raised; a reference
  left ``???`` becomes the stack's judge, anything else fails in the server that reads it,
  as before.

What the script adds per environment, as ``gym``'s documentation chains configs by hand:
a variant whose server blocks lack an ``entrypoint`` is resolved over the directory's own
config (``base``), and for a config that starts no agent the configs of the agents its
resources servers accept (``allowed_agents``, read with NeMo Gym's ``allowed_agents_for``)
are resolved too, for the SDK to pair one (see :mod:`nemogym_sdk.gym.loading`): without
``compose_unbound_agent``, as an agent's own config has no agent to compose it onto (the
SDK binds it to the resources server instead).

Request: ``{"cwd", "environments": [{"name", "config", "base", "roots"}...]}`` (absolute
paths; ``roots`` become ``NEMO_GYM_EXTRA_ROOTS``, ``cwd`` the working directory NeMo Gym
searches between them and its install root). Answer: ``{"nemo_gym_version", "results":
[{"name", "config", "missing", "allowed_agents", "candidates", "datasets", "files"} or
{"name", "error": {"type", "message"}}]}``.
"""

from __future__ import annotations

import json
import os
import select
import sys
import traceback
from typing import Any

_SERVER_TYPES = ("responses_api_models", "resources_servers", "responses_api_agents")
_ENVIRONMENT_SERVERS = "environment_servers"
_POLICY_IMPLEMENTATION = "vllm_model"  # what nemogym_sdk.gym serves the policy with
_ALMOST_SERVERS_KEY = "error_on_almost_servers"
IDLE_S = 300.0
"""The worker exits after this many seconds without a request."""


def main() -> int:
    """Answer requests from stdin until it ends or stays idle for :data:`IDLE_S`."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # whatever NeMo Gym prints must not mix with the answers
    import nemo_gym  # type: ignore[import-not-found]
    import nemo_gym.global_config  # type: ignore[import-not-found]  # before the first request

    while select.select([sys.stdin], [], [], IDLE_S)[0]:
        line = sys.stdin.readline()
        if not line:
            return 0
        request = json.loads(line)
        os.chdir(request["cwd"])
        results = [_resolve_one(entry) for entry in request["environments"]]
        answer = {"nemo_gym_version": nemo_gym.__version__, "results": results}
        answers.write(json.dumps(answer, default=str) + "\n")
        answers.flush()
    return 0


def _parser(*, compose: bool, missing: list[str]) -> Any:
    """NeMo Gym's parser with its two pre-stack checks deferred (see the module docstring):
    the unset paths go to ``missing``. Without ``compose``, unbound agents are left unbound
    (a pairing candidate's own config: the SDK binds it, there is no agent to compose onto)."""
    from nemo_gym.global_config import GlobalConfigDictParser

    class DeferredChecksParser(GlobalConfigDictParser):  # type: ignore[misc]
        def validate_and_populate_defaults(self, server_instance_configs: Any, **kw: Any) -> Any:
            return list(kw.get("initial_disallowed_ports") or [])

        def raise_on_missing_values(self, global_config_dict: Any) -> None:
            missing[:] = self.collect_missing_value_paths(global_config_dict)

        def compose_unbound_agent(self, global_config_dict: Any, *args: Any, **kw: Any) -> None:
            if compose:
                super().compose_unbound_agent(global_config_dict, *args, **kw)

    return DeferredChecksParser()


def _parse(config_paths: list[str], *, compose: bool = True) -> tuple[Any, list[str]]:
    """NeMo Gym's resolution of ``config_paths`` on its model-less placeholder config."""
    from nemo_gym.global_config import GlobalConfigDictParserConfig
    from omegaconf import OmegaConf  # type: ignore[import-not-found]

    placeholder = GlobalConfigDictParserConfig.NO_MODEL_GLOBAL_CONFIG_DICT
    initial = OmegaConf.merge(
        placeholder, {"config_paths": config_paths, _ALMOST_SERVERS_KEY: False}
    )
    missing: list[str] = []
    parser = _parser(compose=compose, missing=missing)
    resolved = parser.parse(
        GlobalConfigDictParserConfig(
            initial_global_config_dict=initial,
            skip_load_from_cli=True,
            skip_load_from_dotenv=True,
            offline=True,
        )
    )
    _check_model_pairings(parser, resolved, placeholder)
    return resolved, missing


def _check_model_pairings(parser: Any, resolved: Any, placeholder: Any) -> None:
    """NeMo Gym's ``allowed_model_types`` check, with the policy as the stack serves it."""
    import copy

    from omegaconf import OmegaConf, open_dict

    name = "policy_model"
    if OmegaConf.to_container(resolved.get(name)) != OmegaConf.to_container(placeholder[name]):
        return  # the environment defines its own policy_model; the stack replaces it
    as_served = copy.deepcopy(resolved)
    with open_dict(as_served):
        as_served[name] = {_SERVER_TYPES[0]: {_POLICY_IMPLEMENTATION: {"entrypoint": "app.py"}}}
    parser.raise_on_unsupported_model_pairings(as_served)


def _plain(resolved: Any) -> dict[str, Any]:
    """The resolved config as plain data, interpolations (``${policy_base_url}``) kept:
    the servers resolve them against the global config, as under ``gym env start``."""
    from nemo_gym.global_config import GlobalConfigDictParserConfig
    from omegaconf import OmegaConf

    plain: dict[str, Any] = OmegaConf.to_container(resolved, resolve=False, throw_on_missing=False)
    plain.pop(_ALMOST_SERVERS_KEY, None)
    # NeMo Gym's stand-in for the policy goes (the stack adds the real one), also where a
    # config's own policy_model was merged over it without replacing it.
    stand_in = OmegaConf.to_container(
        GlobalConfigDictParserConfig.NO_MODEL_GLOBAL_CONFIG_DICT["policy_model"]
    )
    policy = plain.get("policy_model")
    if policy == stand_in:
        del plain["policy_model"]
    elif isinstance(policy, dict) and len(policy) > 1:
        for server_type, impls in stand_in.items():
            if policy.get(server_type) == impls:
                del policy[server_type]
    return plain


def _inner_blocks(config: dict[str, Any], server_type: str) -> list[tuple[str, str, Any]]:
    """``(instance, implementation, block)`` of each instance of ``server_type``."""
    found = []
    for name, block in config.items():
        if isinstance(block, dict) and set(block) == {server_type}:
            impls = block[server_type]
            if isinstance(impls, dict) and len(impls) == 1:
                ((impl, inner),) = impls.items()
                found.append((name, str(impl), inner))
    return found


def _adjusts_servers_elsewhere(config: dict[str, Any]) -> bool:
    """Some server block has no ``entrypoint``: the config adjusts servers another defines
    (``math_with_judge:math_with_local_judge`` sets the judge of ``math_with_judge``)."""
    return any(
        not (isinstance(inner, dict) and "entrypoint" in inner)
        for server_type in (*_SERVER_TYPES, _ENVIRONMENT_SERVERS)
        for _, _, inner in _inner_blocks(config, server_type)
    )


def _candidates(resolved: Any, config: dict[str, Any]) -> tuple[list[str], list[Any], list[str]]:
    """The agents the resources servers accept (``allowed_agents``); for a config that
    starts no agent, each accepted agent's own config resolved by NeMo Gym, and the paths
    of the agent configs looked for (present or not)."""
    from nemo_gym import _resolve_under_cwd_or_install
    from nemo_gym.global_config import allowed_agents_for

    accepted = [  # (resources server, agent) in config order
        (name, agent)
        for name, _, _ in _inner_blocks(config, "resources_servers")
        for agent in allowed_agents_for(resolved, name) or []
    ]
    allowed = list(dict.fromkeys(agent for _, agent in accepted))
    if _inner_blocks(config, "responses_api_agents"):
        return allowed, [], []
    candidates, probed = [], []
    for resources_server, agent in accepted:
        path = _resolve_under_cwd_or_install(f"responses_api_agents/{agent}/configs/{agent}.yaml")
        probed.append(str(path.absolute()))
        if path.is_file():
            own, _ = _parse([str(path)], compose=False)
            candidates.append(
                {
                    "agent": agent,
                    "resources_server": resources_server,
                    "path": str(path),
                    "config": _plain(own),
                }
            )
    return allowed, candidates, probed


def _datasets(configs: list[dict[str, Any]]) -> dict[str, str]:
    """``jsonl_fpath`` -> the file NeMo Gym reads for it (extra roots, cwd, install root)."""
    from nemo_gym import _resolve_under_cwd_or_install

    paths: dict[str, str] = {}
    for config in configs:
        for server_type in ("responses_api_agents", "resources_servers"):
            for _, _, inner in _inner_blocks(config, server_type):
                datasets = inner.get("datasets") if isinstance(inner, dict) else None
                for dataset in datasets if isinstance(datasets, list) else []:
                    fpath = dataset.get("jsonl_fpath") if isinstance(dataset, dict) else None
                    if isinstance(fpath, str) and fpath:
                        paths[fpath] = str(_resolve_under_cwd_or_install(fpath).absolute())
    return paths


def _files_read(config_paths: list[str], candidates: list[dict[str, Any]]) -> list[str]:
    """Every config file the resolution read (what a cached result depends on)."""
    from nemo_gym import _resolve_under_cwd_or_install

    paths = [*config_paths, *(p for c in candidates for p in c["config"].get("config_paths") or [])]
    return [str(_resolve_under_cwd_or_install(p).absolute()) for p in paths]


def _resolve_one(entry: dict[str, Any]) -> dict[str, Any]:
    """One environment's result, or the error NeMo Gym raised for it."""
    os.environ["NEMO_GYM_EXTRA_ROOTS"] = os.pathsep.join(entry["roots"])
    try:
        paths = [entry["config"]]
        resolved, missing = _parse(paths)
        if entry.get("base") and _adjusts_servers_elsewhere(_plain(resolved)):
            paths = [entry["base"], entry["config"]]
            resolved, missing = _parse(paths)
        config = _plain(resolved)
        allowed, candidates, probed = _candidates(resolved, config)
    except Exception as error:  # noqa: BLE001 -- reported to the SDK as data
        message = str(error)
        if not message:  # an error without words (StopIteration): where it was raised
            frame = traceback.extract_tb(error.__traceback__)[-1]
            message = f"raised in {os.path.basename(frame.filename)}:{frame.lineno} ({frame.name})"
        return {"name": entry["name"], "error": {"type": type(error).__name__, "message": message}}
    files = _files_read(config.get("config_paths") or paths, candidates)
    return {
        "name": entry["name"],
        "config": config,
        "missing": missing,
        "allowed_agents": allowed,
        "candidates": candidates,
        "datasets": _datasets([config, *(c["config"] for c in candidates)]),
        "files": list(dict.fromkeys([*files, *probed])),
    }


if __name__ == "__main__":
    sys.exit(main())
