"""ortformer's benchmarks: a dev-only project beside the package, never installed with it.

benchmarks/peers/ times ortformer against other engines, each in an interpreter of its own
(`python -m benchmarks --help`); the loose scripts here are one-off measurements (GPU, int8
schemes, long sequences) whose findings ARCHITECTURE.md and the docs quote. Everything here
imports ortformer; nothing in ortformer imports this folder.
"""
