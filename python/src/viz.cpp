// Binding of the viewer's page data writer (qkv::plot::viz_data), which qkv.viz calls: the same JSON as `qkv viz`.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "qkv/plot/viewer_data.h"

namespace qkv::python {

void bind_viz(py::module_& m) {
  m.def(
      "_viz_page_data",
      [](const py::list& snapshots, const std::string& title, const std::string& dtype, const std::string& lang) {
        const char* fn = "viz";
        plot::VizDtype d = plot::VizDtype::kAuto;
        if (dtype == "f16") d = plot::VizDtype::kF16;
        else if (dtype == "u8") d = plot::VizDtype::kU8;
        else if (dtype == "sparse") d = plot::VizDtype::kSparse;
        else if (dtype != "auto")
          throw py::value_error("[viz] dtype must be 'auto', 'f16', 'u8' or 'sparse', got '" + dtype + "'");
        std::vector<plot::VizSnapshot> snaps;
        for (const auto& s : snapshots) {
          const py::tuple st = s.cast<py::tuple>();
          plot::VizSnapshot snap;
          snap.label = st[0].cast<std::string>();
          for (const auto& g : st[1].cast<py::list>()) {
            const py::tuple gt = g.cast<py::tuple>();
            plot::VizGroup group;
            group.name = gt[0].cast<std::string>();
            group.cross = gt[1].cast<std::string>() == "cross";
            group.q_tokens = gt[2].cast<std::vector<std::string>>();
            group.k_tokens = gt[3].cast<std::vector<std::string>>();
            const Tensor w = to_tensor(gt[4], fn, "attentions");  // (L, H, Tq, Tk)
            for (int64_t l = 0; l < w.size(0); ++l) group.layers.push_back(w.select(0, l));
            group.causal = gt[5].cast<bool>();
            snap.groups.push_back(std::move(group));
          }
          snaps.push_back(std::move(snap));
        }
        std::string out;
        {
          py::gil_scoped_release nogil;
          json::Value data = plot::viz_data(snaps, title, d);
          data.set("lang", lang);
          out = plot::script_json(data);
        }
        return out;
      },
      py::arg("snapshots"), py::arg("title"), py::arg("dtype"), py::arg("lang"),
      "The viewer's page data as the text of its <script> element. snapshots: [(label, [(name, 'self' | 'cross', "
      "q_tokens, k_tokens, float32 (L, H, Tq, Tk), causal), ...]), ...]. Used by qkv.viz.");
}

}  // namespace qkv::python
