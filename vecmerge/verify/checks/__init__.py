"""verify's checks of an output: files, figures, the identity laws, the recomputed update, the real PEFT client."""
