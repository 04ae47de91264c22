"""target_chars: a toy multi-turn NeMo Gym environment shipped with nemogym_sdk.

A Gymnasium-style resources server, played by NeMo Gym's ``gymnasium_agent``:

* ``/reset`` (the row) starts an episode for the session and returns the round-1
  observation, which the agent appends to the prompt as a user message;
* ``/step`` (the row + the model's response) scores the reply of the current round and
  returns the next round's observation (another user message, so the rollout has
  environment tokens between model turns), or terminates after the last round.

Each step's reward is ``round_reward(reply) / num_rounds``; the agent sums them, so a
rollout's reward is the mean round reward in [0, 1]. The rules live in ``rules.py`` (pure
Python, shared with the SDK's tests); this file only adapts them to NeMo Gym.

Runs in NeMo Gym's venv (``python app.py`` with this directory as the working directory
and on ``PYTHONPATH``, which is how ``import rules`` finds the sibling module).
"""

# --8<-- [start:server]  (docs/writing-an-environment.md shows the rest of the file)
import asyncio
import random
from typing import Any

import rules  # the sibling rules.py: this directory is the cwd and on PYTHONPATH
from fastapi import HTTPException
from nemo_gym.openai_utils import NeMoGymResponse
from resources_servers.gymnasium import GymnasiumServer, extract_text

_RNG = random.Random()


class TargetCharsEnv(GymnasiumServer):
    """Per-session episodes in ``self.session_state`` (``session id -> rules.GameState``).

    The base class drops a session's entry when a step terminates or truncates
    (``close_session`` -> ``_cleanup_session``), so finished episodes hold no memory.
    """

    ray_enabled = False

    async def reset(self, metadata: dict, session_id: str | None = None) -> tuple[str, dict]:
        try:
            task = rules.Task.from_row(metadata)
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=f"{rules.NAME}: {exc}") from exc
        broken = task.latency is not None and task.latency.breaks(_RNG)
        self.session_state[session_id] = rules.GameState(task=task, broken=broken)
        return task.observation(1), {"round": 1, "num_rounds": task.num_rounds}

    async def step(
        self, action: NeMoGymResponse, metadata: dict, session_id: str | None = None
    ) -> tuple[str | None, float, bool, bool, dict[str, Any]]:
        episode = self.session_state.get(session_id)
        if episode is None:
            raise HTTPException(
                status_code=409,
                detail=f"{rules.NAME}: no episode for this session; POST /reset first",
            )
        latency = episode.task.latency
        if latency is not None:  # a slow tool: heavy-tailed, sometimes stalled
            await asyncio.sleep(latency.delay(_RNG))
        if episode.broken:  # a tool broken for this episode (latency.error_p)
            raise HTTPException(status_code=500, detail=f"{rules.NAME}: the tool is broken")
        result = episode.step(extract_text(action))
        return result.observation, result.reward, result.terminated, False, result.info


if __name__ == "__main__":
    TargetCharsEnv.run_webserver()
# --8<-- [end:server]
