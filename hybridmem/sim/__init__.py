"""Simulated serving: vLLM's real scheduler, the organizations, a roofline cost model standing in
for the GPU. See ``hybridmem/sim/README.md``."""
