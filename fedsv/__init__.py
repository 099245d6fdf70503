"""fedsv: code shared by coordinator and participants (models, data, partitions, training, codec, CLI)."""

__version__ = "0.1.0"
