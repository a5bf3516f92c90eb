// qkv.corpus_bleu / qkv.corpus_chrf: the C++ translation metrics (include/qkv/eval/metrics.h), exposed so that the
// tests can check them against sacrebleu. Results are dicts with sacrebleu's field names.
#include <pybind11/stl.h>

#include "bindings.h"
#include "qkv/eval/metrics.h"

namespace qkv::python {

void bind_metrics(py::module_& m) {
  m.def(
      "corpus_bleu",
      [](const std::vector<std::string>& hyps, const std::vector<std::string>& refs, const std::string& tokenize) {
        const eval::BleuTokenizer tok = eval::bleu_tokenizer_from_string(tokenize);
        eval::BleuScore s;
        {
          py::gil_scoped_release nogil;
          s = eval::corpus_bleu(hyps, refs, tok);
        }
        py::dict d;
        d["score"] = s.score;
        d["counts"] = std::vector<int64_t>(s.correct.begin(), s.correct.end());
        d["totals"] = std::vector<int64_t>(s.total.begin(), s.total.end());
        d["precisions"] = std::vector<double>(s.precisions.begin(), s.precisions.end());
        d["bp"] = s.bp;
        d["sys_len"] = s.sys_len;
        d["ref_len"] = s.ref_len;
        return d;
      },
      py::arg("hypotheses"), py::arg("references"), py::arg("tokenize") = "13a",
      "Corpus BLEU-4 with one reference per hypothesis, as sacrebleu.corpus_bleu(hyps, [refs], tokenize=...).\n"
      "hypotheses, references: lists of str of the same length; tokenize: '13a' | 'zh' | 'none'.\n"
      "-> dict(score, counts, totals, precisions, bp, sys_len, ref_len).");
  m.def(
      "corpus_chrf",
      [](const std::vector<std::string>& hyps, const std::vector<std::string>& refs, int char_order, int beta) {
        eval::ChrfScore s;
        {
          py::gil_scoped_release nogil;
          s = eval::corpus_chrf(hyps, refs, char_order, beta);
        }
        return s.score;
      },
      py::arg("hypotheses"), py::arg("references"), py::arg("char_order") = 6, py::arg("beta") = 2,
      "Corpus chrF (word_order 0) with one reference per hypothesis, as sacrebleu.corpus_chrf(hyps, [refs]).\n"
      "-> the score in [0, 100].");
  m.def("tokenize_13a", [](const std::string& s) { return eval::tokenize_13a(s); }, py::arg("line"),
        "sacrebleu's 13a tokenisation of one line (tokens joined by single spaces).");
  m.def("tokenize_zh", [](const std::string& s) { return eval::tokenize_zh(s); }, py::arg("line"),
        "sacrebleu's zh tokenisation of one line (tokens joined by single spaces).");
}

}  // namespace qkv::python
