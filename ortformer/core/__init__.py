"""The bottom layer: typed errors, atomic-write helpers, argument checks, the CPU count,
the offline corpus (torch-free, imports nothing else of ortformer)."""
