"""Bounded readers of what strangers wrote (JSON, YAML, paths, regex keys), the one checked safetensors reader
and hasher, streamed safetensors writing.
"""
