"""circuitfade: annealable soft-prior Transformers and circuit analysis across checkpoints."""

__version__ = "0.1.0"

