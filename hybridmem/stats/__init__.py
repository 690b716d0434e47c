"""Seed-paired statistics of the paper (§4.1, App. B.5, G.4): see README.md in this folder."""

from hybridmem.stats.errors import StatsError
from hybridmem.stats.holm import holm
from hybridmem.stats.longtable import LongTable, arm, load_long
from hybridmem.stats.paired import (
    TEST_SCALES,
    PairedContrast,
    TInterval,
    check_level,
    contrast,
    geometric_mean,
    log_ratios,
    pair_seeds,
    paired_t_interval,
)
from hybridmem.stats.signflip import sign_flip_p
from hybridmem.stats.tdist import t_cdf, t_quantile, t_sf
from hybridmem.stats.twolook import two_look

__all__ = [
    "LongTable", "PairedContrast", "StatsError", "TInterval", "arm", "check_level", "contrast",
    "geometric_mean", "holm", "load_long", "log_ratios", "pair_seeds", "paired_t_interval",
    "sign_flip_p", "t_cdf", "t_quantile", "t_sf", "two_look", "TEST_SCALES",
]
