"""Serving and batch inference beyond one process.

- ``write_triton_repo``: lay out an ortformer ONNX model as a Triton Inference Server
  model repository entry (torch-free, onnx only).
- ``embed_corpus``: embed a text corpus on a Ray cluster (or a local Ray instance) into
  resumable parquet shards; needs the optional ``ray`` extra, imported on first call.
"""
from .ray_batch import embed_corpus
from .triton import check_name, triton_config, write_triton_repo

__all__ = ["write_triton_repo", "triton_config", "check_name", "embed_corpus"]
