"""Code generation: kernel and dispatcher source, loading them through the disk cache, and
compiling cold ones in worker processes."""
