"""The plugin's YAML keys as a pydantic model, for axolotl's config schema.

axolotl merges this model into its own config model (``get_input_args``), so the keys
survive validation and ``axolotl`` can tell a typo from a setting. Its validator runs the
plugin's own checks (``NemoGymSettings.from_cfg``), so a bad value fails at config
validation, naming the key. Imported only by axolotl (it needs pydantic).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from nemogym_sdk.adapters.axolotl.settings import NemoGymSettings

__all__ = ["NemoGymArgs"]


class NemoGymArgs(BaseModel):
    """``nemo_gym_*`` keys of an axolotl YAML (see ``docs/axolotl.md``)."""

    nemo_gym_datasets: list[dict[str, Any] | str] | None = Field(
        default=None, description="NeMo Gym JSONL files: [{path, max_samples}]"
    )
    nemo_gym_multi_turn: bool | None = Field(
        default=None, description="Roll out through NeMo Gym agents (default false: /verify)"
    )
    nemo_gym_head_url: str | None = Field(
        default=None, description="NeMo Gym head server (else $NEMOGYM_HEAD_URL, 127.0.0.1:11000)"
    )
    nemo_gym_sampler_url: str | None = Field(
        default=None,
        description="Inference server the LoRA adapter is published to (else $NEMOGYM_SAMPLER_URL)",
    )
    nemo_gym_adapter_name: str | None = Field(
        default=None, description="Served adapter name = the model NeMo Gym requests (policy)"
    )
    nemo_gym_adapter_dir: str | None = Field(
        default=None, description="Where adapter versions are written (<output_dir>/nemo_gym)"
    )
    nemo_gym_default_agent: str | None = Field(
        default=None, description="Agent for rows without agent_ref (default: the only one)"
    )
    nemo_gym_resources_server: str | None = Field(
        default=None, description="Single-turn: resources server for rows that name none"
    )
    nemo_gym_run_timeout: float | None = Field(default=None, description="Seconds per /run")
    nemo_gym_verify_timeout: float | None = Field(default=None, description="Seconds per /verify")
    nemo_gym_discovery_timeout: float | None = Field(
        default=None, description="Seconds to wait for the head server at start"
    )
    nemo_gym_max_concurrency: int | None = Field(
        default=None, description="Rollouts or verifications in flight at once"
    )
    nemo_gym_seed: int | None = Field(default=None, description="Row sampling seed (seed)")
    nemo_gym_max_staleness: int | None = Field(
        default=None, description="Asynchronous rollouts: adapter versions a group may lag"
    )
    nemo_gym_max_inflight: int | None = Field(
        default=None, description="Asynchronous rollouts: episodes in flight per rank"
    )

    @model_validator(mode="before")
    @classmethod
    def _check_nemo_gym(cls, data: Any) -> Any:
        """Run the plugin's checks on the raw keys (a ``ConfigError`` is a ``ValueError``)."""
        if isinstance(data, dict) and any(str(k).startswith("nemo_gym_") for k in data):
            NemoGymSettings.from_cfg(data)
        return data
