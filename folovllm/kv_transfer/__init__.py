"""KV transfer between engine instances (prefill/decode disaggregation): the connector interface
(``base``), its transports (``shared_storage``, ``torch_distributed``) and their set-up from a config."""
