"""Lightning callbacks: analyses of attention (the schemes' own parameters, explained-away, head diversity,
head importance, calibration, sinks and outliers, training stability), training rules of schemes (repulsive attention, MA+R) and run safety.

Analyses that run their own evaluations once test is done are `AfterTestAnalysis`es (the
runner finds them by type); training rules come with their model config (conf/rules/)."""

from attnlab.callbacks.after_test import AfterTestAnalysis, analysis_progress
from attnlab.callbacks.calibration import Calibration
from attnlab.callbacks.diagnostics import OutlierDiagnostics
from attnlab.callbacks.explained_away import ExplainedAway
from attnlab.callbacks.head_diversity import HeadDiversity
from attnlab.callbacks.head_importance import HeadImportance
from attnlab.callbacks.preemption import MidEpochCheckpoint, PreemptionCheckpoint, RngState
from attnlab.callbacks.repulsive import DisagreementRegularizer, RepulsiveAttention
from attnlab.callbacks.scheme_parameters import SchemeParameters
from attnlab.callbacks.stability import StabilityMonitor

__all__ = [
    "AfterTestAnalysis",
    "Calibration",
    "DisagreementRegularizer",
    "ExplainedAway",
    "HeadDiversity",
    "HeadImportance",
    "MidEpochCheckpoint",
    "OutlierDiagnostics",
    "PreemptionCheckpoint",
    "RepulsiveAttention",
    "RngState",
    "SchemeParameters",
    "StabilityMonitor",
    "analysis_progress",
]
