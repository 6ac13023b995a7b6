"""Regenerate tei_pb2.py and tei_pb2_grpc.py from tei.proto (committed: the package needs no
protoc at install time). Needs grpcio-tools, which is no dependency of ortformer (install it in a
venv of its own: it pins protobuf); the committed stubs were made with grpcio-tools 1.75.1, whose
protoc writes protobuf 6.31.1 code, so they load with protobuf >= 6.31.1 (the 7.x runtime reads
6.x code) and grpcio >= 1.75.1 (the 'grpc' extra). Newer tools write code that needs protobuf 7,
which tritonclient[grpc] (the 'triton' extra, protobuf < 7) cannot share one environment with:

    pip install 'grpcio-tools==1.75.1'
    python ortformer/serve/grpc/generate.py

Run from the repository root: the proto is compiled under its package path, so the stubs import
each other as ortformer.serve.grpc.tei_pb2.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO = Path("ortformer/serve/grpc/tei.proto")


def main() -> int:
    from grpc_tools import protoc

    return protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"--python_out={ROOT}", f"--grpc_python_out={ROOT}",
                        str(PROTO)])


if __name__ == "__main__":
    sys.exit(main())
