"""Runtime checkers for the four invariants of App. D.2 and the Hypothesis state machines that
drive every memory organization against a plain reference model."""
