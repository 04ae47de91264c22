"""``python -m nemogym_sdk.train``: run ``nemogym-train`` (see :mod:`nemogym_sdk.train`)."""

from __future__ import annotations

import sys

from nemogym_sdk.train import main

if __name__ == "__main__":
    sys.exit(main())
