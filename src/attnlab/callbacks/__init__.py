"""Lightning callbacks: analyses of attention (hybrid weights, explained-away) and run safety."""

from attnlab.callbacks.explained_away import ExplainedAway
from attnlab.callbacks.hybrid_weights import HybridWeights
from attnlab.callbacks.preemption import PreemptionCheckpoint, RngState

__all__ = ["ExplainedAway", "HybridWeights", "PreemptionCheckpoint", "RngState"]
