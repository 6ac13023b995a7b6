"""Start Infinity's server (`infinity_emb v2 ARGS`) with THREADS compute threads.

Run by the Infinity peer's own interpreter as a script (``python infinity_launch.py THREADS
ARGS...``), never imported by ortformer: that venv has no ortformer. Infinity has no thread
flag; its torch engine takes torch's default and its optimum engine builds onnxruntime
sessions with default options (both: every physical core). So the same thread count as
the server it is compared with is set here before Infinity loads: torch.set_num_threads,
and every onnxruntime session built with intra_op_num_threads = THREADS (one inter-op
thread, as onnxruntime's sequential executor runs anyway).
"""
import sys


def pin_threads(threads: int) -> None:
    import onnxruntime
    import torch

    torch.set_num_threads(threads)
    session = onnxruntime.InferenceSession

    class PinnedSession(session):
        def __init__(self, path_or_bytes, sess_options=None, *args, **kwargs):
            sess_options = sess_options or onnxruntime.SessionOptions()
            sess_options.intra_op_num_threads = threads
            sess_options.inter_op_num_threads = 1
            super().__init__(path_or_bytes, sess_options, *args, **kwargs)

    onnxruntime.InferenceSession = PinnedSession


def main(argv: list[str]) -> None:
    threads = int(argv[0])
    pin_threads(threads)
    from infinity_emb.cli import cli

    sys.argv = ["infinity_emb", "v2", *argv[1:]]
    cli()


if __name__ == "__main__":
    main(sys.argv[1:])
