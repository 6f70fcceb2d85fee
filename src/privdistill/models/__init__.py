"""Networks by name. Classifiers expose `features(x)` (backbone output before the last linear layer) and
return logits from `forward`; they take any channel count, class count and (small) image size."""

from privdistill.models.registry import create_model, get_entry, list_models, register_model

__all__ = ["create_model", "get_entry", "list_models", "register_model"]
