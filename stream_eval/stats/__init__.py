"""Pure A/B statistics (numpy and the standard library only): mergeable per-arm sufficient statistics over
randomisation units, cluster-robust (delta-method) variances, fixed-sample intervals beside always-valid
confidence sequences and p-values, sample ratio mismatch and the GSB sign test.

No knowledge of Kafka, windows or workers: sums in, numbers out (the shape of GrowthBook's gbstats).
"""

from __future__ import annotations

from stream_eval.stats.compare import Comparison, Difference, compare, decide, difference
from stream_eval.stats.cuped import adjusted, pooled_theta
from stream_eval.stats.fdr import e_bh
from stream_eval.stats.ratio import ArmSums, PreSums, ratio_mean_variance
from stream_eval.stats.sign import SignTest, sign_test
from stream_eval.stats.special import Floats, chi2_sf
from stream_eval.stats.srm import SrmTest, srm_test

__all__ = [
    "ArmSums",
    "Comparison",
    "Difference",
    "Floats",
    "PreSums",
    "SignTest",
    "SrmTest",
    "adjusted",
    "chi2_sf",
    "compare",
    "decide",
    "difference",
    "e_bh",
    "pooled_theta",
    "ratio_mean_variance",
    "sign_test",
    "srm_test",
]
