"""A draft model for speculative decoding: a GGUF model's first N decoder layers, its embedding, final norm
and head kept (same tokenizer and vocabulary), written as a new GGUF file.

    python benchmarks/truncate_gguf.py --layers 10 --out /tmp/smollm2-draft-10.gguf   # the default model's
    folovllm bench spec --speculative-config '{"model": "/tmp/smollm2-draft-10.gguf", "num_speculative_tokens": 3}'
"""
from __future__ import annotations

import argparse
import re

import gguf

from folovllm.model.loader import default_model_path


def truncate(source: str, layers: int, out: str) -> None:
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    total = reader.fields[f"{arch}.block_count"].contents()
    if not 1 <= layers < total:
        raise SystemExit(f"--layers must be in [1, {total - 1}] for this {total}-layer model; got {layers}")
    writer = gguf.GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes these itself
        value = layers if name == f"{arch}.block_count" else field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        block = re.match(r"blk\.(\d+)\.", tensor.name)
        if block is None or int(block.group(1)) < layers:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)  # quantized: its bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="the GGUF file (default: the default model)")
    parser.add_argument("--layers", type=int, required=True, help="decoder layers to keep, from the first")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    truncate(args.model or default_model_path(), args.layers, args.out)
