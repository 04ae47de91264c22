"""axolotl's released NeMo Gym parser, loaded from its installed wheel for the kit's checks.

``load_peer_parser()`` executes only ``axolotl/integrations/nemo_gym/multi_turn.py``
(axolotl 0.19.0, from ``.venv-axolotl``) and returns its ``_parse_agent_response``. The
module's one axolotl import is a logger factory; it is given ``logging.getLogger``
while the module loads (and removed again), so neither axolotl nor torch is imported.
Nothing of axolotl's code is copied here.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_INTEGRATION = "site-packages/axolotl/integrations/nemo_gym"
_FOUND = sorted((ROOT / ".venv-axolotl").glob(f"lib/python3.*/{_INTEGRATION}"))
PEER_FILE = (
    _FOUND[0] if _FOUND else ROOT / f".venv-axolotl/lib/python3.11/{_INTEGRATION}"
) / "multi_turn.py"
PEER_VERSION = "0.19.0"
_STUBS = ("axolotl", "axolotl.utils", "axolotl.utils.logging")


def peer_version() -> str | None:
    """The installed axolotl's version, from its dist-info, or None."""
    found = sorted(PEER_FILE.parents[3].glob("axolotl-*.dist-info"))
    return found[0].name.removeprefix("axolotl-").removesuffix(".dist-info") if found else None


def load_peer_parser() -> Callable[[Any, int], Any]:
    """axolotl's ``_parse_agent_response(response, eos_token_id) -> dict``."""
    saved = {name: sys.modules.get(name) for name in _STUBS}
    for name in _STUBS:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["axolotl.utils.logging"].get_logger = logging.getLogger  # type: ignore[attr-defined]
    try:
        spec = importlib.util.spec_from_file_location("axolotl_nemo_gym_multi_turn", PEER_FILE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    parse: Callable[[Any, int], Any] = module._parse_agent_response
    return parse
