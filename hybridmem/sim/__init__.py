"""Simulated serving: vLLM's real scheduler, the organizations, a roofline cost model standing in
for the GPU (issue 13). See ``hybridmem/sim/README.md``."""
