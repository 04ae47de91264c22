"""The served-name rule: NeMo Gym's model server must request the adapter by its name.

NeMo Gym's model server (a ``responses_api_models`` block, e.g. ``vllm_model``) sends
every request with the ``model`` of its config, usually ``${policy_model_name}``. vLLM
applies a LoRA adapter only to requests that name it; any other name is served by the base
model. So if the model server requests ``Qwen/Qwen3-8B`` while the trainer publishes
adapter ``policy``, every rollout silently samples the base model and training learns
from a policy it never changes (axolotl's W-SYNC-1). ``check_served_name`` turns that into
an error before the first rollout.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from nemogym_sdk.directory import ServerDirectory, resolve_interpolations
from nemogym_sdk.errors import ConfigError
from nemogym_sdk.hosts import same_endpoint
from nemogym_sdk.wire import MODEL_NAME_KEYS, MODELS

__all__ = ["check_served_name", "model_servers"]

logger = logging.getLogger(__name__)


def _plain(node: Any) -> Any:
    """Plain dicts and lists (the resolver walks those), copied so the input is untouched."""
    if isinstance(node, Mapping):
        return {str(key): _plain(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain(value) for value in node]
    return node


def model_servers(config: Mapping[str, Any]) -> list[tuple[str, str, str, list[str]]]:
    """Model servers of a global config: (instance, implementation, model name, base URLs).

    ``${top_level.key}`` interpolations are resolved against the config; servers without
    a model name key are left out.
    """
    resolved = resolve_interpolations(_plain(config))
    found: list[tuple[str, str, str, list[str]]] = []
    for instance, block in resolved.items():
        inner = block.get(MODELS) if isinstance(block, Mapping) else None
        if not isinstance(inner, Mapping):
            continue
        for implementation, server in inner.items():
            if not isinstance(server, Mapping):
                continue
            for name_key, url_key in MODEL_NAME_KEYS:
                if isinstance(server.get(name_key), str):
                    urls = server.get(url_key)
                    listed = urls if isinstance(urls, list) else [urls]
                    found.append(
                        (
                            str(instance),
                            str(implementation),
                            server[name_key],
                            [u for u in listed if isinstance(u, str)],
                        )
                    )
                    break
            else:
                logger.debug("model server %s (%s) names no model", instance, implementation)
    return found


def check_served_name(
    directory: ServerDirectory,
    adapter_name: str,
    *,
    backend_url: str | Sequence[str] | None = None,
) -> None:
    """Raise ``ConfigError`` unless NeMo Gym's model servers request ``adapter_name``.

    Args:
        directory: the deployment: ``ServerDirectory.from_head(...)`` for a running NeMo
            Gym, or ``GymStack.directory`` for one the SDK started. Its ``config`` (the
            global config) says what each model server requests.
        adapter_name: the name the trainer serves its LoRA adapter under
            (``LoraSync.adapter_name``).
        backend_url: the inference server the adapter is published to, or a list of
            replicas it is published to (``LoraSync([...])``). With it, only model servers
            whose ``base_url`` (a URL or a list) points there are checked, and at least one
            must; each of those must send nowhere else (a replica the adapter is not
            published to would answer with the base model). ``localhost``, ``127.0.0.1``
            and ``0.0.0.0`` count as one host (``nemogym_sdk.hosts.same_endpoint``).

    Raises:
        ConfigError: a checked model server requests another model name (the message
            names the instance, both names and the fix), no model server is found, or
            ``directory`` is not a ``ServerDirectory`` with a global config.
    """
    if not isinstance(directory, ServerDirectory):
        raise ConfigError(
            f"check_served_name takes a ServerDirectory (ServerDirectory.from_head(...) or "
            f"GymStack.directory), got {type(directory).__name__}"
        )
    if not directory.config:
        raise ConfigError(
            f"{directory!r} has no global config (it was not read from a head server or a "
            "GymStack), so what its model servers request is unknown; use "
            "ServerDirectory.from_head(...) or GymStack.directory"
        )
    servers = model_servers(directory.config)
    if backend_url is not None:
        published = [backend_url] if isinstance(backend_url, str) else list(backend_url)

        def ours(url: str) -> bool:
            return any(same_endpoint(url, target) for target in published)

        listed = [f"{name} -> {', '.join(urls) or '(no base_url)'}" for name, _, _, urls in servers]
        servers = [s for s in servers if any(ours(u) for u in s[3])]
        if not servers:
            raise ConfigError(
                f"no NeMo Gym model server sends requests to {', '.join(published)}; rollouts "
                f"would not sample adapter {adapter_name!r} from it. Model servers: "
                f"{'; '.join(listed) or '(none)'}. Point the model server's base_url at the "
                "inference server the adapter is loaded on (PolicyModel(base_url=...) / "
                "policy_base_url)."
            )
        for instance, _, _, urls in servers:
            elsewhere = [u for u in urls if not ours(u)]
            if elsewhere:
                raise ConfigError(
                    f"model server {instance!r} also sends requests to {', '.join(elsewhere)}, "
                    f"where adapter {adapter_name!r} is not published (it is published to "
                    f"{', '.join(published)}): those rollouts would sample another policy. "
                    "Publish to every replica the model server uses (LoraSync([...])), or "
                    "drop the others from its base_url."
                )
    elif not servers:
        raise ConfigError(
            "the NeMo Gym config has no model server (no responses_api_models block with a "
            "'model' key), so nothing would request the adapter"
        )
    wrong = [s for s in servers if s[2] != adapter_name]
    if wrong:
        lines = "; ".join(
            f"model server {instance!r} ({implementation}) requests model {name!r}"
            for instance, implementation, name, _ in wrong
        )
        raise ConfigError(
            f"{lines}, but the LoRA adapter is served as {adapter_name!r}: every rollout would "
            f"sample {wrong[0][2]!r} (the base model, or a 404 if the server has no such "
            "model) instead of the trained adapter. Serve the "
            f"adapter under the name the model server requests (LoraSync(..., "
            f"adapter_name={wrong[0][2]!r})), or make the model server request "
            f"{adapter_name!r} (PolicyModel(model={adapter_name!r}) in a GymStack, or "
            f"policy_model_name={adapter_name} in the NeMo Gym config)."
        )
    logger.debug("served-name rule holds for %r on %d model server(s)", adapter_name, len(servers))
