"""Code generation: kernel and dispatcher source, and loading them through the disk cache."""
