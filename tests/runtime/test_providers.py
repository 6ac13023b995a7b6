"""What Runtime asks onnxruntime for (checked without a GPU: the request, not the device)."""
from ortformer.runtime import providers


def test_cuda_request_is_float32_exact_with_a_bounded_arena_and_cpu_last():
    request = providers.provider_list("cuda", 3)
    (name, options), last = request
    assert name == providers.CUDA_EP and last == providers.CPU_EP
    # TF32 off: onnxruntime's default rounds float32 MatMul inputs to a 10-bit mantissa
    assert options == {"device_id": "3", "arena_extend_strategy": "kSameAsRequested", "use_tf32": "0"}
    assert providers.provider_list("cpu", 0) == [providers.CPU_EP]
