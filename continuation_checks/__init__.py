"""Retained-state continuation versus recomputation of the same prompt (App. D.5): token ids,
first divergent position, and state-byte agreement at the boundary."""
