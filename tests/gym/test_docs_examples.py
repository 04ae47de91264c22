"""The documentation's code that starts real NeMo Gym servers: every python block of a
page and every file of ``examples/docs/`` that uses ``nemogym_sdk.gym``, each run as a
script (the rule: ``tests/docs/test_code_blocks.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemogym_sdk.gym import GYM_VENV_ENV_VAR, GymVenv
from tests.docs.blocks import REPO, Block, as_param, example_files, python_blocks, run_script

pytestmark = [pytest.mark.gym, pytest.mark.slow]
TIMEOUT_S = 300


@pytest.mark.parametrize("block", [as_param(b) for b in python_blocks(gym=True)])
def test_gym_python_block_runs(block: Block, gym_venv: GymVenv, tmp_path: Path) -> None:
    code = block.expanded()
    (tmp_path / "block.py").write_text(code)
    env = {GYM_VENV_ENV_VAR: str(gym_venv.root)}
    done = run_script(tmp_path / "block.py", tmp_path, timeout=TIMEOUT_S, env=env)
    assert done.returncode == 0, f"{block.where} failed:\n{code}\n{done.stderr[-3000:]}"


GYM_EXAMPLES = example_files(gym=True)
"""``examples/docs/`` files that start servers and no other test runs (none today: each is
in ``RUN_ELSEWHERE``, run by ``tests/docs/test_examples_gym.py`` on a shared stack)."""

if GYM_EXAMPLES:  # an empty parametrization would only report a skip

    @pytest.mark.parametrize("path", GYM_EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
    def test_gym_example_file(path: Path, gym_venv: GymVenv, tmp_path: Path) -> None:
        env = {GYM_VENV_ENV_VAR: str(gym_venv.root)}
        done = run_script(path, tmp_path, timeout=TIMEOUT_S, env=env)
        assert done.returncode == 0, f"{path.relative_to(REPO)} failed:\n{done.stderr[-3000:]}"
