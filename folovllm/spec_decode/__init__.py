"""Speculative decoding: proposals per request each step, verified by the target in its ragged batch."""
