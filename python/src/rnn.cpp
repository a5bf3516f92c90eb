// qkv.GRU / qkv.LSTM: torch.nn.GRU / torch.nn.LSTM (batch-first, unidirectional) over NumPy arrays, with PyTorch's
// gate order, parameter names (weight_ih_l0, ...) and return values (output, h_n) / (output, (h_n, c_n)).
#include <pybind11/stl.h>

#include "bindings.h"
#include "module_binding.h"
#include "qkv/nn/rnn.h"

namespace qkv::python {

namespace {

constexpr const char* kGru = "GRU";
constexpr const char* kLstm = "LSTM";
using PyGru = Bound<nn::GRU>;
using PyLstm = Bound<nn::LSTM>;

nn::RnnOptions make_options(const char* fn, int64_t gates, int64_t input_size, int64_t hidden_size,
                            int64_t num_layers, bool bias, bool batch_first, double dropout, bool bidirectional) {
  if (dropout != 0.0) throw py::value_error(std::string("[") + fn + "] dropout between layers is not supported (use 0.0)");
  if (bidirectional) throw py::value_error(std::string("[") + fn + "] bidirectional=True is not supported");
  check_sizes(fn, {{"input_size", input_size}, {"hidden_size", hidden_size}, {"num_layers", num_layers}});
  check_sizes(fn, {{"gates * hidden_size", gates * hidden_size},
                   {"input_size + hidden_size", input_size + hidden_size},
                   {"num_layers", num_layers}});
  nn::RnnOptions o;
  o.num_layers = num_layers;
  o.bias = bias;
  o.batch_first = batch_first;
  return o;
}

// Unbatched input (T, E) runs as a batch of one: x -> (1, T, E), states (L, H) -> (L, 1, H).
Tensor lift_state(const Tensor& s, bool unbatched, const char* fn, const char* name) {
  if (!s.defined() || !unbatched) return s;
  if (s.dim() != 2) {
    throw py::value_error(std::string("[") + fn + "] " + name + " " + str(s.shape()) +
                          " must be (num_layers, hidden_size) for an unbatched (T, E) input");
  }
  return s.unsqueeze(1);
}
Tensor drop_state(const Tensor& s, bool unbatched) { return unbatched ? s.squeeze(1) : s; }

py::tuple gru_call(PyGru& self, const py::object& input, const py::object& hx) {
  const Tensor x = to_tensor(input, kGru, "input");
  const bool unbatched = x.dim() == 2;
  const int64_t batch_axis = self.batch_first ? 0 : 1;  // where an unbatched input gets its batch of one
  const Tensor h0 = lift_state(to_tensor_or_none(hx, kGru, "hx"), unbatched, kGru, "hx");
  nn::RnnOutput r =
      locked_nogil(self.mu, [&] { return self.m->forward(unbatched ? x.unsqueeze(batch_axis) : x, h0); });
  return py::make_tuple(to_numpy(unbatched ? r.output.squeeze(batch_axis) : r.output),
                        to_numpy(drop_state(r.h_n, unbatched)));
}

py::tuple lstm_call(PyLstm& self, const py::object& input, const py::object& hx) {
  const Tensor x = to_tensor(input, kLstm, "input");
  const bool unbatched = x.dim() == 2;
  const int64_t batch_axis = self.batch_first ? 0 : 1;
  Tensor h0, c0;
  if (!hx.is_none()) {
    if (!py::isinstance<py::tuple>(hx) && !py::isinstance<py::list>(hx)) {
      throw py::type_error("LSTM: hx must be None or a tuple (h_0, c_0)");
    }
    const py::sequence seq = py::reinterpret_borrow<py::sequence>(hx);
    if (seq.size() != 2) throw py::type_error("LSTM: hx must be a tuple (h_0, c_0) of two arrays");
    h0 = lift_state(to_tensor(seq[0], kLstm, "h_0"), unbatched, kLstm, "h_0");
    c0 = lift_state(to_tensor(seq[1], kLstm, "c_0"), unbatched, kLstm, "c_0");
  }
  nn::RnnOutput r =
      locked_nogil(self.mu, [&] { return self.m->forward(unbatched ? x.unsqueeze(batch_axis) : x, h0, c0); });
  return py::make_tuple(to_numpy(unbatched ? r.output.squeeze(batch_axis) : r.output),
                        py::make_tuple(to_numpy(drop_state(r.h_n, unbatched)), to_numpy(drop_state(r.c_n, unbatched))));
}

template <class W>
void def_rnn_properties(py::class_<W>& cls) {
  cls.def_property_readonly("input_size", [](W& s) { return s.m->input_size(); });
  cls.def_property_readonly("hidden_size", [](W& s) { return s.m->hidden_size(); });
  cls.def_property_readonly("num_layers", [](W& s) { return s.m->num_layers(); });
  cls.def_property_readonly("bias", [](W& s) { return s.m->options().bias; });
}

}  // namespace

void bind_rnn(py::module_& m) {
  py::class_<PyGru> gru(m, kGru, R"doc(torch.nn.GRU, unidirectional, over arrays (NumPy, torch tensors, ...).

Gates (r, z, n) packed along 3H as PyTorch: r = σ(W_ir x + b_ir + W_hr h + b_hr), z likewise,
n = tanh(W_in x + b_in + r ∘ (W_hn h + b_hn)), h' = (1 − z) ∘ n + z ∘ h.
Parameters per layer k: weight_ih_l{k} (3H, E or H), weight_hh_l{k} (3H, H), bias_ih_l{k}, bias_hh_l{k} (3H).
Initialised uniform(±1/sqrt(H)) from `seed` or the generator qkv.manual_seed reseeds.
batch_first defaults to False as in PyTorch: input (T, B, E); True: (B, T, E).
Not supported (ValueError): dropout != 0, bidirectional=True.)doc");
  gru.def(py::init([](int64_t input_size, int64_t hidden_size, int64_t num_layers, bool bias, bool batch_first,
                      double dropout, bool bidirectional, const py::object& seed) {
            const nn::RnnOptions o = make_options(kGru, 3, input_size, hidden_size, num_layers, bias, batch_first,
                                                  dropout, bidirectional);
            Rng rng(module_seed(seed));
            auto w = std::make_unique<PyGru>();
            w->batch_first = batch_first;
            w->m = std::make_unique<nn::GRU>(input_size, hidden_size, rng, o);
            return w;
          }),
          py::arg("input_size"), py::arg("hidden_size"), py::arg("num_layers") = 1, py::arg("bias") = true,
          py::arg("batch_first") = false, py::arg("dropout") = 0.0, py::arg("bidirectional") = false, py::kw_only(),
          py::arg("seed") = py::none());
  gru.def("__call__", &gru_call, py::arg("input"), py::arg("hx") = py::none(),
          R"doc(input (T, B, E), hx (L, B, H) or None (zeros) -> (output (T, B, H), h_n (L, B, H)); batch_first=True:
input (B, T, E) -> output (B, T, H).
Unbatched input (T, E) with hx (L, H) gives output (T, H) and h_n (L, H).)doc");
  gru.attr("forward") = gru.attr("__call__");
  def_module_methods(gru, kGru);
  def_rnn_properties(gru);

  py::class_<PyLstm> lstm(m, kLstm, R"doc(torch.nn.LSTM, unidirectional, over arrays (NumPy, torch tensors, ...).

Gates (i, f, g, o) packed along 4H as PyTorch: c' = f ∘ c + i ∘ g, h' = o ∘ tanh(c').
Parameters per layer k: weight_ih_l{k} (4H, E or H), weight_hh_l{k} (4H, H), bias_ih_l{k}, bias_hh_l{k} (4H).
Initialised uniform(±1/sqrt(H)) from `seed` or the generator qkv.manual_seed reseeds.
batch_first defaults to False as in PyTorch: input (T, B, E); True: (B, T, E).
Not supported (ValueError): dropout != 0, bidirectional=True, proj_size != 0.)doc");
  lstm.def(py::init([](int64_t input_size, int64_t hidden_size, int64_t num_layers, bool bias, bool batch_first,
                       double dropout, bool bidirectional, int64_t proj_size, const py::object& seed) {
             if (proj_size != 0) throw py::value_error("[LSTM] proj_size is not supported (use 0)");
             const nn::RnnOptions o = make_options(kLstm, 4, input_size, hidden_size, num_layers, bias, batch_first,
                                                   dropout, bidirectional);
             Rng rng(module_seed(seed));
             auto w = std::make_unique<PyLstm>();
             w->batch_first = batch_first;
             w->m = std::make_unique<nn::LSTM>(input_size, hidden_size, rng, o);
             return w;
           }),
           py::arg("input_size"), py::arg("hidden_size"), py::arg("num_layers") = 1, py::arg("bias") = true,
           py::arg("batch_first") = false, py::arg("dropout") = 0.0, py::arg("bidirectional") = false,
           py::arg("proj_size") = 0, py::kw_only(), py::arg("seed") = py::none());
  lstm.def("__call__", &lstm_call, py::arg("input"), py::arg("hx") = py::none(),
           R"doc(input (T, B, E) (batch_first=True: (B, T, E)), hx (h_0, c_0) each (L, B, H), or None (zeros)
-> (output (T, B, H) (batch_first: (B, T, H)), (h_n, c_n) each (L, B, H)).
Unbatched input (T, E) takes and gives states (L, H).)doc");
  lstm.attr("forward") = lstm.attr("__call__");
  def_module_methods(lstm, kLstm);
  def_rnn_properties(lstm);
}

}  // namespace qkv::python
