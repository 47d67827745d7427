"""Layer 4: laying models onto cores — mapping specs, TP-group layouts, the mapper."""

from npusim.mapping.layout import Group, place_groups
from npusim.mapping.mapper import Mapped, map_model
from npusim.mapping.spec import MappingSpec, load_mapping, spec_from_flags

__all__ = ["Group", "Mapped", "MappingSpec", "load_mapping", "map_model", "place_groups", "spec_from_flags"]
