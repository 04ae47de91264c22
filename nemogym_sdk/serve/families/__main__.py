"""Build the model families' cached directories ahead of time, once per machine:

    python -m nemogym_sdk.serve.families                  # every family's tiny model
    python -m nemogym_sdk.serve.families --taught         # and each one taught its markup
    python -m nemogym_sdk.serve.families qwen3 --taught   # one family

A directory already built is reused (`family_model_dir`, `taught_model_dir`; the cache root
is ``$NEMOGYM_FAMILY_MODELS``, else ``~/.cache/nemogym_sdk/family-models``). Teaching all
five takes about two minutes on two cores; `make family-models` runs this beside the venvs,
so that ``make test`` and a first ``nemogym-train --model-family`` find them built.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from nemogym_sdk.errors import ConfigError
from nemogym_sdk.serve.families.build import cache_root, family_model_dir
from nemogym_sdk.serve.families.catalog import FAMILIES, family_named
from nemogym_sdk.serve.families.family import Family
from nemogym_sdk.serve.families.teach import taught_model_dir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nemogym_sdk.serve.families",
        description="Build (or find) the model families' cached directories.",
    )
    parser.add_argument(
        "families", nargs="*", help=f"families to build (default: all of {', '.join(FAMILIES)})"
    )
    parser.add_argument(
        "--taught", action="store_true", help="also build each family's taught model"
    )
    parser.add_argument("--seed", type=int, default=0, help="the models' weights' seed (0)")
    return parser


def _build(label: str, make: Callable[[Family, int], Path], family: Family, seed: int) -> None:
    began = time.perf_counter()
    path = make(family, seed)
    print(f"{label}: {path} ({time.perf_counter() - began:.1f} s)", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        chosen: list[Family] = [family_named(name) for name in args.families] or list(
            FAMILIES.values()
        )
    except ConfigError as exc:
        print(f"nemogym_sdk.serve.families: {exc}", file=sys.stderr)
        return 2
    # the cores are shared (make test builds the venvs meanwhile): waiting torch threads sleep
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    print(f"family models in {cache_root()}", flush=True)
    for family in chosen:
        _build(family.name, family_model_dir, family, args.seed)
        if args.taught:
            _build(f"{family.name} taught", taught_model_dir, family, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
