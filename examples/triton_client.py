"""Ask a Triton Inference Server for sentence embeddings of an ortformer model.

The model entry is the one `ortformer triton-repo` writes:

    ortformer triton-repo model.onnx --repo models --name encoder   # prints the tokenizer's path
    docker run --rm -p 8000:8000 -v $PWD/models:/models \\
        nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models
    pip install 'tritonclient[http]' tokenizers
    python examples/triton_client.py --model encoder --tokenizer models/encoder/model.tokenizer.json \\
        "a first text" "a second, longer text"

The inputs follow config.pbtxt: input_ids, attention_mask (and token_type_ids when
the model has them) as int64 [batch, sequence]; a float-feature model (vocab_size = 0)
takes inputs_embeds float32 [batch, sequence, hidden] instead (``--features``).
Which inputs the served model takes is asked from the server, not assumed.
"""
from __future__ import annotations

import argparse

import numpy as np

INPUT_IDS = "input_ids"
INPUTS_EMBEDS = "inputs_embeds"
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"
SENTENCE_EMBEDDING = "sentence_embedding"


def token_inputs(texts: list[str], tokenizer_path: str, input_names: list[str], max_length: int = 128,
                 pad_multiple: int = 16) -> dict[str, np.ndarray]:
    """int64 (B, N) input_ids, attention_mask and, if the model takes it, token_type_ids.

    N is rounded up to a multiple of ``pad_multiple`` (capped at max_length): Triton's
    dynamic batcher only joins requests whose shapes match, so a few fixed lengths let
    concurrent requests share a batch. Padding is masked out, it does not change results.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_path)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)  # max_length must not exceed the model's max_positions
    encodings = tokenizer.encode_batch(texts)
    longest = max(len(e.ids) for e in encodings)
    width = min(max_length, -(-longest // pad_multiple) * pad_multiple)
    ids = np.zeros((len(texts), width), np.int64)
    mask = np.zeros((len(texts), width), np.int64)
    types = np.zeros((len(texts), width), np.int64)
    for row, encoding in enumerate(encodings):
        n = len(encoding.ids)
        ids[row, :n], mask[row, :n], types[row, :n] = encoding.ids, 1, encoding.type_ids
    inputs = {INPUT_IDS: ids, ATTENTION_MASK: mask}
    if TOKEN_TYPE_IDS in input_names:
        inputs[TOKEN_TYPE_IDS] = types
    return inputs


def feature_inputs(features: np.ndarray) -> dict[str, np.ndarray]:
    """float32 (B, N, F) inputs_embeds and an all-ones int64 (B, N) attention_mask."""
    features = np.asarray(features, dtype=np.float32)
    return {INPUTS_EMBEDS: features, ATTENTION_MASK: np.ones(features.shape[:2], np.int64)}


def infer(client, model: str, inputs: dict[str, np.ndarray], output: str = SENTENCE_EMBEDDING) -> np.ndarray:
    """One request; returns the output as numpy, e.g. (B, hidden) float32 sentence embeddings."""
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    request = []
    for name, array in inputs.items():
        item = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        request.append(item)
    result = client.infer(model, request, outputs=[httpclient.InferRequestedOutput(output)])
    return result.as_numpy(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("texts", nargs="*", default=["Triton batches requests.", "ONNX Runtime runs them."])
    parser.add_argument("--url", default="localhost:8000", help="Triton's HTTP endpoint")
    parser.add_argument("--model", required=True, help="model name in the repository")
    parser.add_argument("--tokenizer", help="tokenizer.json (ortformer triton-repo copies it to REPO/NAME/)")
    parser.add_argument("--max-length", type=int, default=128, help="truncate texts to this many tokens")
    parser.add_argument("--features", action="store_true", help="float-feature model: send random features")
    args = parser.parse_args()

    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=args.url)
    metadata = client.get_model_metadata(args.model)
    input_names = [item["name"] for item in metadata["inputs"]]
    if args.features or INPUTS_EMBEDS in input_names:
        hidden = int(next(i for i in metadata["inputs"] if i["name"] == INPUTS_EMBEDS)["shape"][-1])
        inputs = feature_inputs(np.random.default_rng(0).standard_normal((2, 8, hidden)))
    else:
        if not args.tokenizer:
            parser.error("--tokenizer is needed for a token model")
        inputs = token_inputs(args.texts, args.tokenizer, input_names, args.max_length)
    embeddings = infer(client, args.model, inputs)
    print(f"{SENTENCE_EMBEDDING}: shape {embeddings.shape}, dtype {embeddings.dtype}")
    for text, vector in zip(args.texts if INPUT_IDS in inputs else range(len(embeddings)), embeddings):
        print(f"  {str(text)[:40]!r}: [{', '.join(f'{v:+.4f}' for v in vector[:4])}, ...]")


if __name__ == "__main__":
    main()
