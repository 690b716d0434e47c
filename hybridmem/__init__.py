"""hybridmem: memory organization for hybrid attention-SSM LLM serving.

Geometry (:mod:`hybridmem.geometry`), allocation units (:mod:`hybridmem.units`), storage cost
(:mod:`hybridmem.storage_cost`) and the budget planner (:mod:`hybridmem.budget`) follow SPEC §1-4.
"""

__version__ = "0.1.0"
