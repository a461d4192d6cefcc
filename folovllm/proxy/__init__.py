"""The prefill/decode proxy (``folovllm proxy``): one OpenAI endpoint in front of prefill (producer)
and decode (consumer) servers. It relays HTTP only and imports nothing of the engine."""
