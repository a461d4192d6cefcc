"""``folovllm proxy``: its flags and its uvicorn server."""
from __future__ import annotations

import argparse
import logging

from folovllm.proxy.pools import ROUTING_POLICIES

logger = logging.getLogger(__name__)


def add_proxy_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``folovllm proxy`` options to ``parser`` and return it."""
    parser.add_argument("--prefill", nargs="+", required=True, metavar="URL",
                        help="prefill (KV producer) servers, e.g. http://127.0.0.1:8100")
    parser.add_argument("--decode", nargs="+", required=True, metavar="URL",
                        help="decode (KV consumer) servers, e.g. http://127.0.0.1:8200")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--policy", choices=ROUTING_POLICIES.names(), default="round_robin",
                        help="how an instance is picked in each pool: in turn, or the one with the fewest "
                             "requests in flight from this proxy")
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                        help="seconds to open a connection to a backend before answering 502")
    parser.add_argument("--read-timeout", type=float, default=3600.0, metavar="S",
                        help="seconds a backend may stay silent (a whole prefill, a gap in a stream) "
                             "before the request fails with 504")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def run_proxy(args: argparse.Namespace) -> int:
    """Serves until SIGINT/SIGTERM; returns the exit code."""
    import uvicorn

    from folovllm.proxy.app import ProxyConfig, build_proxy_app

    for name in ("connect_timeout", "read_timeout"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}.")
    config = ProxyConfig(prefill_urls=args.prefill, decode_urls=args.decode, policy=args.policy,
                         connect_timeout_s=args.connect_timeout, read_timeout_s=args.read_timeout)
    app = build_proxy_app(config)
    proxy = app.state.proxy
    logger.info("PD proxy on http://%s:%d: prefill %s, decode %s (%s)", args.host, args.port,
                [b.url for b in proxy.prefill.backends], [b.url for b in proxy.decode.backends], args.policy)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0
