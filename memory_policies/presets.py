"""The old name of `memory_policies.variants` (a policy's "preset" is now its "variant"), kept
until the next minor version; importing it warns."""

from memory_policies.deprecation import warn_renamed
from memory_policies.variants import DEFAULT_VARIANT as DEFAULT_PRESET
from memory_policies.variants import EVOLVE, PAPER
from memory_policies.variants import VARIANTS as PRESETS
from memory_policies.variants import Variant as Preset
from memory_policies.variants import VariantRules as PresetRules
from memory_policies.variants import check_variant as check_preset
from memory_policies.variants import is_variant as is_preset
from memory_policies.variants import variant_rules as preset_rules

warn_renamed("memory_policies.presets", "memory_policies.variants", stacklevel=2)

__all__ = [
    "DEFAULT_PRESET",
    "EVOLVE",
    "PAPER",
    "PRESETS",
    "Preset",
    "PresetRules",
    "check_preset",
    "is_preset",
    "preset_rules",
]
