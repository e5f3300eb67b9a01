"""Names shared by the soft-prior model on every TransformerLens line (no TransformerLens import)."""

from types import MappingProxyType

GATE_MODES = ("learned", "fixed", "scheduled")
LARGE_OVERRIDES = MappingProxyType({"n_layers": 4, "d_model": 128, "d_head": 32, "n_heads": 4})
"""The paper's larger model as overrides of the base config (the JSON form a run config's ``model`` takes)."""
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
