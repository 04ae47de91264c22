"""Judge wiring: the model servers an environment calls besides the policy.

Judges, user simulators and reward models are model servers a resources server (or an
agent, for its helpers) refers to with ``{type: responses_api_models, name: ...}``. The
stack starts each of them as a ``vllm_model`` on one OpenAI-compatible judge endpoint
(:func:`judge_server_block`), replacing the blocks the environments declare
(:func:`wire_model_dependencies`); see "Judges and other model servers" in
``docs/gym-environments.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.gym.specs import AGENTS, MODELS, PolicyModel

__all__ = [
    "JUDGE_INSTANCE",
    "UNSET",
    "WIRABLE_MODEL_IMPLS",
    "declared_model",
    "judge_server_block",
    "wire_model_dependencies",
]

JUDGE_INSTANCE = "judge_model"
"""Model server the stack adds, with an explicit ``judge``, for environments whose judge is
``policy_model`` (``equivalence_llm_judge``, ``multichallenge`` ...), and for references a
config leaves unset (``name: ???``): the name NeMo Gym's own configs give a separate judge."""

UNSET = "???"
"""OmegaConf's mark for a value the user must set (NeMo Gym's ``MISSING``)."""

WIRABLE_MODEL_IMPLS: frozenset[str] = frozenset(
    {
        "azure_openai_model",
        "dummy_model",
        "inference_provider",
        "litellm_model",
        "local_vllm_model",
        "openai_model",
        "vllm_model",
    }
)
"""Model server implementations an environment may declare that the stack replaces with a
``vllm_model`` on the judge endpoint: each only forwards to some OpenAI-compatible model
(``dummy_model`` is NeMo Gym's stand-in for the run's model, what a ``_copy`` of the
policy resolves to). Others (``genrm_model``'s pairwise roles, ``switchyard_model``'s
router, ``vllm_model_with_compaction`` ...) speak more than that and are refused."""


def judge_server_block(judge: PolicyModel) -> dict[str, Any]:
    """The ``vllm_model`` block (without host and port) of a judge on ``judge``'s endpoint.

    ``base_url``, ``api_key``, ``model``, ``uses_reasoning_parser`` and ``extra`` come from
    ``judge``; token-id information is always off (nothing trains on a judge's tokens, and
    it would cost a ``/tokenize`` call per verdict, which OpenAI's own API lacks).
    ``vllm_model`` serves both APIs judges call (``/v1/responses``, translated to chat
    completions, and ``/v1/chat/completions``) and needs only chat completions upstream.
    """
    plain = attrs.evolve(
        judge, return_token_id_information=False, request_prompt_and_generation_token_ids=False
    )
    return plain.server_block()


def declared_model(environment: str, instance: str, block: Mapping[str, Any]) -> str:
    """The implementation of a model server an environment declares, if the stack can wire
    it; ``ConfigError`` saying how to start it otherwise."""
    ((impl, _),) = block[MODELS].items()
    if impl not in WIRABLE_MODEL_IMPLS:
        raise ConfigError(
            f"{environment}: model server {instance!r} is a {impl} server, which the stack "
            "cannot point at an OpenAI-compatible judge endpoint (it can replace "
            f"{', '.join(sorted(WIRABLE_MODEL_IMPLS - {'dummy_model'}))}); start it yourself "
            f"and give it to the stack with overrides={{{instance!r}: ...}}"
        )
    return str(impl)


def wire_model_dependencies(
    config: dict[str, Any],
    policy_instance: str,
    declared_models: Mapping[str, str],
    *,
    rename_policy: bool,
) -> list[str]:
    """Rewire the model servers the kept servers call besides the policy; return their names.

    A *model dependency* is any ``{type: responses_api_models, name: ...}`` reference in a
    resources server's block (``judge_model_server``, ``user_model_server``,
    ``genrm_model_server``, ``retrieval_model_server`` ...) or in an agent's block other
    than its own ``model_server``, plus every model instance an environment declares
    (``declared_models``: instance -> implementation, e.g. ``judge_model: openai_model``).
    Each such instance is returned, to be started as a ``vllm_model`` on the judge
    endpoint: a declared block is replaced (its ``${judge_base_url}``-style settings with
    it), an undeclared name (``simpleqa``'s ``genrm_model``) is added. A reference the
    config leaves unset (``???``) is rewritten to :data:`JUDGE_INSTANCE`. References to the
    policy instance are judges that share the policy: with ``rename_policy`` (an explicit
    judge) they are rewritten, in ``config``, to :data:`JUDGE_INSTANCE`; otherwise they
    stay on the policy's own server. An agent sampling from a declared model server is
    refused: the stack serves agents only the policy.
    """
    needed = dict.fromkeys(declared_models)
    for instance, block in config.items():
        ((server_type, impls),) = block.items()
        (inner,) = impls.values()
        if server_type == AGENTS:
            ref: Any = inner.get("model_server")
            name = str(ref["name"]) if _is_model_ref(ref) else ""
            if name in declared_models:
                raise ConfigError(
                    f"agent {instance!r} samples from {name!r} (model_server), a "
                    f"{declared_models[name]} server its environment declares; the "
                    "stack serves agents only the policy: point model_server at "
                    f"{policy_instance!r} in overrides"
                )
        for holder, key in _dependency_refs(inner, top=server_type == AGENTS):
            name = str(holder[key]["name"])
            if name == UNSET or (name == policy_instance and rename_policy):
                holder[key] = {"type": MODELS, "name": JUDGE_INSTANCE}
                name = JUDGE_INSTANCE
            elif name == policy_instance:
                continue
            needed.setdefault(name)
    return list(needed)


def _dependency_refs(node: Any, *, top: bool) -> Iterable[tuple[Any, Any]]:
    """``(container, key or index)`` of each model reference below ``node``.

    With ``top`` (an agent's block) its own ``model_server`` is the policy and is skipped.
    """
    if isinstance(node, dict):
        items: Iterable[tuple[Any, Any]] = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    else:
        return
    for key, value in items:
        if _is_model_ref(value):
            if not (top and key == "model_server"):
                yield node, key
        else:
            yield from _dependency_refs(value, top=False)


def _is_model_ref(node: Any) -> bool:
    return isinstance(node, Mapping) and set(node) == {"type", "name"} and node["type"] == MODELS
