"""How each linear holds and multiplies its weight: the ``LinearMethod`` per weight format (plain, packed
for a CPU kernel, GPTQ, int8, GGUF 4-bit, the int8 LM head) and the quantized kernels they hold."""
