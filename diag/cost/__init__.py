"""Cost engine: FLOP formulas, the GPU catalogue, estimates of time and money (pure Python, no torch).

The public API (used by ``diag cost`` and the TUI's Cost tab; see docs/cost.md)::

    from diag.cost import (estimate, compare, plan_phases, parse_phases, from_evidence,
                           estimate_measured, load_catalog, CostError)
"""
from diag.cost.catalog import Catalog, CatalogError, Gpu, Price, load_catalog, user_catalog_path
from diag.cost.estimate import (DEFAULT_PHASES, CostError, Estimate, Measured, Part, Phase, PhasePlan, compare,
                                estimate, estimate_measured, from_evidence, parse_fraction, parse_phases,
                                parse_quantity, parse_target, plan_phases)

__all__ = [
    "Catalog", "CatalogError", "Gpu", "Price", "load_catalog", "user_catalog_path",
    "DEFAULT_PHASES", "CostError", "Estimate", "Measured", "Part", "Phase", "PhasePlan", "compare", "estimate",
    "estimate_measured", "from_evidence", "parse_fraction", "parse_phases", "parse_quantity", "parse_target",
    "plan_phases",
]
