"""fedsv: shared code for coordinator and participants (models, data, partitions, training, wire codec, CLI)."""

__version__ = "0.1.0"
