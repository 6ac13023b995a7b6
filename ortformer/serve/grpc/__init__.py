"""`ortformer serve --grpc-port`: text-embeddings-inference's gRPC API (tei.proto, TEI v1.9.3)
through grpcio, beside the HTTP routes (needs the ``grpc`` extra).

- ``tei.proto``: TEI's file as published; ``tei_pb2.py`` / ``tei_pb2_grpc.py``: the stubs made
  from it by grpcio-tools 1.85.1, committed (``generate.py`` regenerates them);
- ``service.py``: the servicers (Info, Embed, Predict, Rerank, Tokenize and their streams) over
  the served models' operations (model.py), so gRPC and HTTP share one batcher per model, its
  limits and its metrics; ``with_grpc(app, host, port)`` starts the server with the app.
"""
from ...core.errors import require

require("ortformer serve --grpc-port", "grpc", "grpc", "google.protobuf")

from .service import with_grpc

__all__ = ["with_grpc"]
