"""Names shared by the soft-prior model on every TransformerLens line (no TransformerLens import)."""

GATE_MODES = ("learned", "fixed", "scheduled")
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
