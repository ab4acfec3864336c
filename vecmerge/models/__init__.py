"""Whole models: extract a LoRA from a fine-tune, fuse a LoRA into its base, which tensors are modules."""
