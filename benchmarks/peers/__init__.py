"""The peer harness: ortformer against the engines a user would pick instead.

real: all-MiniLM-L6-v2 against sentence-transformers (eager, and its ONNX backend from the
peers overlay); serve: `ortformer serve` against Infinity under HTTP load; cpu-engines:
OpenVINO and CTranslate2 on the same sentences. The peers live outside the dev venv (pins in
this folder's *.txt), installed by `python -m benchmarks --setup-peers`.
"""
