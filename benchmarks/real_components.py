"""How many tests exercise each real component: a pytest plugin that counts at collection.

    PYTHONPATH=benchmarks .venv/bin/python -m pytest --collect-only -q -p real_components

A test counts for a component when its own source, or the source of any fixture it uses
(transitively: a module fixture that starts a cluster counts for each of its tests), names
the way that component is started. The rules are textual, so they count the same way on
any revision of the suite: run it before and after a change to see that none was dropped.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter

import pytest

COMPONENTS: dict[str, re.Pattern[str]] = {
    "NeMo Gym (real servers)": re.compile(
        r"GymStack|GymLauncher|stack_factory|toy_deployment|"
        r"nemogym_sdk\.train|gym_venv"
    ),
    "vLLM": re.compile(r"start_vllm|vllm_backend|demo\.yaml|--backend\W+vllm"),
    "vllm-router": re.compile(r"start_router|start_samplers|--replicas|find_router"),
    "torchrun": re.compile(r"torch\.distributed\.run|torchrun"),
    "TRL GRPOTrainer": re.compile(r"GRPOTrainer"),
    "axolotl": re.compile(r"axolotl_venv|\.venv-axolotl|AXOLOTL_VENV"),
    "trackers": re.compile(r"--report-to|read_wandb|read_mlflow|read_tensorboard"),
    # Building the wheel, not naming one: a test of the docs' pip commands spells `.whl`.
    "wheel": re.compile(r"python\W+-m\W+build|bdist_wheel|build_wheel"),
}


def sources(item: pytest.Item) -> str:
    """The test's source and that of every fixture it uses."""
    texts = []
    function = getattr(item, "function", None)
    if function is not None:
        texts.append(inspect.getsource(function))
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for definition in info.name2fixturedefs.get(name, ()) if info else ():
            try:
                texts.append(inspect.getsource(definition.func))
            except (OSError, TypeError):
                continue
    return "\n".join(texts)


def pytest_collection_finish(session: pytest.Session) -> None:
    counts: Counter[str] = Counter()
    for item in session.items:
        real = item.get_closest_marker("gym") or item.get_closest_marker("slow")
        text = sources(item)
        for component, pattern in COMPONENTS.items():
            if pattern.search(text) and (real or component != "NeMo Gym (real servers)"):
                counts[component] += 1
    print("\nreal-component tests (benchmarks/real_components.py):")
    for component in COMPONENTS:
        print(f"  {component}: {counts[component]}")
