"""Hardware descriptions: schema, loading (with presets and ``extends:``) and derived figures."""

from npusim.arch.derived import ArchSummary, hbm_attach_routers, summarize
from npusim.arch.load import PRESET_DIR, list_presets, load_arch
from npusim.arch.schema import DTYPE_BYTES, Arch

__all__ = ["Arch", "ArchSummary", "DTYPE_BYTES", "PRESET_DIR", "hbm_attach_routers", "list_presets", "load_arch", "summarize"]
