"""Serving-engine integration: the embedded tiny model, the trace sink, and the vLLM run driver."""
