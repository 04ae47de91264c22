"""Environment-server entry point without Ray, executed by the NeMo Gym venv's interpreter.

Not imported by nemogym_sdk: ``GymStack(..., environment_servers=True)`` runs it as
``<venv>/bin/python -P relay_main.py`` in the directory of NeMo Gym's ``legacy_agent``
environment server (on ``PYTHONPATH``), with the stack's global config in
``NEMO_GYM_CONFIG_DICT`` and the instance in ``NEMO_GYM_CONFIG_PATH``, as ``gym env start``
runs its ``app.py``. The relay (``/run`` forwarded to its agent, which NeMo Gym's own rollout
collection and ``gym eval run`` post to) does not declare ``ray_enabled``, so NeMo Gym 0.7.0
starts a Ray cluster for it although it never uses Ray. This runs NeMo Gym's own relay class,
through a subclass that declares ``ray_enabled = False``: the same routes and code, no Ray.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Serve the relay named by ``NEMO_GYM_CONFIG_PATH`` until stopped."""
    import app  # type: ignore[import-not-found]  # the relay's module, from its directory

    class RelayWithoutRay(app.LegacyAgentEnvironmentServer):  # type: ignore[misc]
        ray_enabled = False

    RelayWithoutRay.run_webserver()
    return 0


if __name__ == "__main__":
    sys.exit(main())
