"""What ``bench serve`` sends and when, from its command line: the dataset and arrival options and the
request list they name. Shared by ``bench serve`` and ``folovllm simulate`` (no HTTP here)."""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from folovllm.bench import datasets as ds


def add_workload_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Adds the dataset group and the arrival options; returns the "load" group for more options."""
    d = parser.add_argument_group("dataset")
    d.add_argument("--dataset", "--dataset-name", dest="dataset", choices=ds.DATASETS, default="random",
                   help="random, shared-prefix, sharegpt-like, a reference workload "
                        "(its count, lengths and arrivals; e.g. mixed = 50%% 1024-token prompts, Poisson 64/s), "
                        "or jsonl (--dataset-path)")
    d.add_argument("--dataset-path", default=None,
                   help='jsonl: one {"prompt"|"messages", "max_tokens", "arrival_s"?, "class"?} per line')
    d.add_argument("--num-prompts", type=int, default=None,
                   help="requests (default: 64 for random/shared-prefix, 500 sharegpt-like, the table's "
                        "count for seed workloads, the whole file for jsonl)")
    d.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=None,
                   help="prompt tokens (random: 128; shared-prefix: the suffix; mixed: the long class)")
    d.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=None,
                   help="max_tokens (random/shared-prefix: 64)")
    d.add_argument("--random-range-ratio", type=float, default=None,
                   help="lengths uniform in [L*(1-R), L*(1+R)] around --input-len and --output-len")
    d.add_argument("--input-len-range", default=None, metavar="A:B", help="prompt tokens uniform in [A, B]")
    d.add_argument("--output-len-range", default=None, metavar="A:B", help="max_tokens uniform in [A, B]")
    d.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: tokens of the common prefix")
    d.add_argument("--token-id-range", default="%d:%d" % ds.DEFAULT_TOKEN_ID_RANGE, metavar="A:B",
                   help="token ids of synthetic completions prompts are drawn from [A, B)")
    a = parser.add_argument_group("load")
    a.add_argument("--request-rate", type=float, default=None,
                   help="requests/s; inf = all at once (default: the dataset's, e.g. 64 for mixed, else inf; "
                        "jsonl with arrival_s replays them)")
    a.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the inter-arrival times: 1 = Poisson, < 1 burstier, > 1 steadier")
    a.add_argument("--seed", type=int, default=0, help="seeds the dataset and the arrivals")
    a.add_argument("--ignore-eos", action="store_true",
                   help="every request ignores EOS (synthetic datasets always do: it fixes their lengths)")
    return a


def _ranged(value: int | None, ratio: float | None, name: str) -> str | None:
    """``--random-range-ratio`` as an A:B range around a fixed length."""
    if ratio is None or value is None:
        return None
    if not 0 <= ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {ratio}.")
    return f"{max(1, int(value * (1 - ratio)))}:{max(1, int(value * (1 + ratio)))}"


def _len_bounds(fixed: int | None, text: str | None, default: int | None, name: str) -> tuple[int, int] | None:
    if fixed is not None and text is not None:
        raise ValueError(f"give --{name} or --{name}-range, not both.")
    if text is not None:
        return ds.parse_len_range(text, f"--{name}-range")
    value = default if fixed is None else fixed
    if value is not None and value < 1:
        raise ValueError(f"--{name} must be at least 1, got {value}.")
    return None if value is None else (value, value)


def build_workload_requests(args: argparse.Namespace, max_model_len: int | None, endpoint: str = "completions",
                            maker: ds.PromptMaker | None = None) -> list[ds.ServeRequest]:
    """The dataset ``args`` name, shaped for ``endpoint``; ``maker`` makes the prompts (default: token
    ids, or words for chat, from ``--token-id-range`` seeded with ``--seed``)."""
    if args.num_prompts is not None and args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {args.num_prompts}.")
    if maker is None:
        fmt = "ids" if endpoint in ("completions", "embeddings") else "text"
        maker = ds.PromptMaker(fmt, np.random.default_rng(args.seed),
                               ds.parse_len_range(args.token_id_range, "--token-id-range"))
    name, n = args.dataset, args.num_prompts
    if name == "jsonl":
        if not args.dataset_path:
            raise ValueError("--dataset jsonl needs --dataset-path.")
        requests = ds.load_jsonl(args.dataset_path, n)
    elif name in ds.SEED_WORKLOADS:
        ins = _len_bounds(args.input_len, args.input_len_range, None, "input-len")
        outs = _len_bounds(args.output_len, args.output_len_range, None, "output-len")
        requests = ds.seed_workload(name, n, maker, ins, outs)
    elif name == "sharegpt-like":
        requests = ds.sharegpt_like_dataset(n or 500, maker, max_model_len)
    else:
        ratio = args.random_range_ratio
        if ratio is not None and (args.input_len_range or args.output_len_range):
            raise ValueError("give --random-range-ratio or --input-len-range/--output-len-range, not both.")
        in_len = 128 if args.input_len is None else args.input_len
        out_len = 64 if args.output_len is None else args.output_len
        ins = _len_bounds(None if ratio is not None else args.input_len,
                          _ranged(in_len, ratio, "input-len") or args.input_len_range, 128, "input-len")
        outs = _len_bounds(None if ratio is not None else args.output_len,
                           _ranged(out_len, ratio, "output-len") or args.output_len_range, 64, "output-len")
        requests = (ds.random_dataset(n or 64, ins, outs, maker) if name == "random" else
                    ds.shared_prefix_dataset(n or 64, args.prefix_len, ins, outs, maker))
    if args.ignore_eos:
        requests = [dataclasses.replace(r, ignore_eos=True) for r in requests]
    return ds.adapt_to_endpoint(requests, endpoint)
