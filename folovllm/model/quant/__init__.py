"""Quantized weight formats: how packed low-bit weights are held, repacked and multiplied."""
