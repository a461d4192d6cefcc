"""Post-training weight quantization (GPTQ and round-to-nearest) into a GPTQ checkpoint folder.

Run by ``folovllm quantize``; nothing below the CLI imports this package.
"""
