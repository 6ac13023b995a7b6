"""`ortformer bench`: eager PyTorch and onnxruntime side by side (run.py; needs torch).

This package file stays import-light: `python -m ortformer.bench.point` measures
onnxruntime's peak memory in a process that must not load torch.
"""
