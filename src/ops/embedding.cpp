// Embedding lookup: copies the rows of a (V, E) table picked by integer ids.
// Ids are checked against V before anything is written; the backward scatters rows of dy back, adding.
#include "qkv/ops/embedding.h"

#include <cstring>

#include "qkv/core/error.h"

namespace qkv {

Tensor embedding(const Tensor& weight, const Ids& ids) {
  QKV_CHECK_ARG(weight.defined(), "[embedding] undefined weight");
  QKV_CHECK_ARG(weight.dim() == 2, "[embedding] weight must be (V, E), got ", str(weight.shape()));
  const int64_t n = shape_numel(ids.shape);
  QKV_CHECK_ARG(static_cast<int64_t>(ids.data.size()) == n, "[embedding] ids hold ", ids.data.size(),
                " values for shape ", str(ids.shape));
  const int64_t v = weight.size(0), e = weight.size(1);
  for (int64_t id : ids.data)
    QKV_CHECK_ARG(id >= 0 && id < v, "[embedding] id ", id, " is out of range for a table of V = ", v,
                  " rows (weight ", str(weight.shape()), ")");
  Shape out_shape = ids.shape;
  out_shape.push_back(e);
  Tensor out = Tensor::empty(out_shape);
  if (out.numel() == 0) return out;
  const float* pw = weight.data();
  const int64_t s0 = weight.stride(0), s1 = weight.stride(1);
  float* po = out.data();
  for (int64_t i = 0; i < n; ++i) {
    const float* row = pw + ids.data[static_cast<size_t>(i)] * s0;
    float* dst = po + i * e;
    if (s1 == 1) {
      std::memcpy(dst, row, static_cast<size_t>(e) * sizeof(float));
    } else {
      for (int64_t j = 0; j < e; ++j) dst[j] = row[j * s1];
    }
  }
  return out;
}

void embedding_backward(Tensor& dweight, const Ids& ids, const Tensor& dy_in) {
  QKV_CHECK_ARG(dweight.defined() && dy_in.defined(), "[embedding_backward] undefined dweight or dy");
  QKV_CHECK_ARG(dweight.dim() == 2, "[embedding_backward] dweight must be (V, E), got ", str(dweight.shape()));
  const int64_t v = dweight.size(0), e = dweight.size(1);
  const int64_t s0 = dweight.stride(0), s1 = dweight.stride(1);
  QKV_CHECK_ARG((v <= 1 || s0 != 0) && (e <= 1 || s1 != 0), "[embedding_backward] dweight ",
                str(dweight.shape()), " is an expanded view (stride 0); writes would alias");
  const int64_t n = shape_numel(ids.shape);
  QKV_CHECK_ARG(static_cast<int64_t>(ids.data.size()) == n, "[embedding_backward] ids hold ", ids.data.size(),
                " values for shape ", str(ids.shape));
  Shape want = ids.shape;
  want.push_back(e);
  QKV_CHECK_ARG(dy_in.shape() == want, "[embedding_backward] dy ", str(dy_in.shape()), " must be ", str(want),
                " for ids ", str(ids.shape), " and dweight ", str(dweight.shape()));
  for (int64_t id : ids.data)
    QKV_CHECK_ARG(id >= 0 && id < v, "[embedding_backward] id ", id, " is out of range for a table of V = ", v,
                  " rows");
  if (n == 0 || e == 0) return;
  const Tensor dy = dy_in.contiguous();
  const float* pg = dy.data();
  float* pw = dweight.data();
  for (int64_t i = 0; i < n; ++i) {
    float* row = pw + ids.data[static_cast<size_t>(i)] * s0;
    const float* g = pg + i * e;
    for (int64_t j = 0; j < e; ++j) row[j * s1] += g[j];
  }
}

}  // namespace qkv
