"""The PEFT LoRA format in one place: keys, scale rules and config; reading adapters; writing them."""
