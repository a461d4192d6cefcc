"""Which HTTP parser and event loop uvicorn runs the API server on.

A streamed completion writes one SSE chunk per token per request: at 64 streams that is thousands
of writes a second, each through the HTTP parser's send path and the event loop. The C
implementations (httptools, uvloop) spend far less CPU per write than the pure-Python ones (h11,
asyncio), and on a CPU-only host that CPU comes out of the engine's forward passes. ``auto`` is
uvicorn's own rule: the C one when its package is installed, else the pure-Python one.
"""
from __future__ import annotations

import importlib.util

HTTP_CHOICES = ("auto", "h11", "httptools")
LOOP_CHOICES = ("auto", "asyncio", "uvloop")
_C_PACKAGE = {"http": "httptools", "loop": "uvloop"}  # the package each C choice needs


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def check_http_stack(http: str, loop: str) -> None:
    """ValueError naming the package to install when a C implementation is asked for but missing."""
    for option, choice in (("http", http), ("loop", loop)):
        package = _C_PACKAGE[option]
        if choice == package and not _installed(package):
            raise ValueError(f"--uvicorn-{option} {choice} needs the {package} package "
                             f"(pip install {package}), or use --uvicorn-{option} auto")


def describe_http_stack(http: str, loop: str) -> str:
    """What ``auto`` resolves to here, for the start-up log: e.g. ``httptools + uvloop``."""
    def pick(option: str, choice: str, fallback: str) -> str:
        if choice != "auto":
            return choice
        return _C_PACKAGE[option] if _installed(_C_PACKAGE[option]) else fallback

    return f"{pick('http', http, 'h11')} + {pick('loop', loop, 'asyncio')}"
