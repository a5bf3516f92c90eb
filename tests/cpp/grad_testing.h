// Gradient-check harness for the autograd tests: analytic gradients of L = Σ f(x) ∘ r from a Tape, compared with
// central differences of a float64 twin of f, or (for ops affine in each input) of f itself with a large step.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ops_testing.h"
#include "qkv/core/rng.h"
#include "qkv/core/tensor.h"
#include "qkv/ops/autograd.h"

namespace qkv::testing {

using ad::Tape;
using ad::Var;

// f: the op under test on Vars (one per input).
using VarFn = std::function<Var(const std::vector<Var>&)>;
// Its float64 twin on row-major copies of the inputs -> row-major output.
using TwinFn = std::function<std::vector<double>(const std::vector<std::vector<double>>&)>;

// Float32 analytic gradients against float64 central differences (error ~1e-6 relative from float rounding).
inline constexpr Tol kTwinGradTol{1e-5, 1e-4};
// Float32 forward against its float64 twin.
inline constexpr Tol kTwinForwardTol{1e-5, 1e-5};
// Ops affine in each input, differenced on their own float32 forward with step 1 (exact up to rounding).
inline constexpr Tol kAffineGradTol{1e-5, 1e-5};
// Whole recurrent layers / models through time: longer float32 chains.
inline constexpr Tol kChainGradTol{5e-5, 5e-4};

struct Analytic {
  Tensor out;
  std::vector<Tensor> grads;  // zeros where no gradient reached an input
  std::vector<double> r;      // the random upstream weights
};

// Records f on a tape with every input a leaf, backward with a random upstream gradient r (seeded).
inline Analytic analytic_grads(const VarFn& f, const std::vector<Tensor>& xs, uint64_t seed) {
  Tape tape;
  std::vector<Var> vars;
  for (const Tensor& x : xs) vars.push_back(tape.leaf(x));
  const Var out = f(vars);
  Analytic a;
  a.out = out.value;
  const Tensor r = randn(out.shape(), seed);
  a.r = to_double(r);
  tape.backward(out, r);
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor g = vars[i].grad();
    a.grads.push_back(g.defined() ? g : Tensor::zeros(xs[i].shape()));
  }
  return a;
}

inline std::vector<std::vector<double>> to_doubles(const std::vector<Tensor>& xs) {
  std::vector<std::vector<double>> d;
  for (const Tensor& x : xs) d.push_back(to_double(x));
  return d;
}

// Gradients of f against central differences of `twin` (float64, step h), for the inputs listed in `check`
// (all when empty). Also checks that f's forward agrees with the twin.
inline ::testing::AssertionResult GradsMatchTwin(const VarFn& f, const TwinFn& twin, const std::vector<Tensor>& xs,
                                                 uint64_t seed, Tol tol = kTwinGradTol,
                                                 std::vector<size_t> check = {}, double h = 1e-6) {
  const Analytic a = analytic_grads(f, xs, seed);
  const std::vector<std::vector<double>> base = to_doubles(xs);
  const std::vector<double> ref_out = twin(base);
  if (auto ok = AllClose(a.out, ref_out, kTwinForwardTol, grad_scale(ref_out)); !ok) return ok << " (forward)";
  if (check.empty())
    for (size_t i = 0; i < xs.size(); ++i) check.push_back(i);
  for (size_t i : check) {
    const std::vector<double> fd = finite_diff(
        [&](const std::vector<double>& xi) {
          std::vector<std::vector<double>> in = base;
          in[i] = xi;
          return dot(twin(in), a.r);
        },
        base[i], h);
    if (auto ok = AllClose(a.grads[i], fd, tol, grad_scale(fd)); !ok) return ok << " (gradient of input " << i << ")";
  }
  return ::testing::AssertionSuccess();
}

// For f affine in each input separately (views, copies, lookups, products in one operand): central differences
// of f's own float32 forward (no tape) with step h; L accumulated in double.
inline ::testing::AssertionResult GradsMatchAffine(const VarFn& f, const std::vector<Tensor>& xs, uint64_t seed,
                                                   Tol tol = kAffineGradTol, double h = 1.0) {
  const Analytic a = analytic_grads(f, xs, seed);
  for (size_t i = 0; i < xs.size(); ++i) {
    std::vector<double> fd(static_cast<size_t>(xs[i].numel()));
    for (int64_t e = 0; e < xs[i].numel(); ++e) {
      double l[2];
      for (int s = 0; s < 2; ++s) {
        std::vector<Tensor> in;
        for (const Tensor& x : xs) in.push_back(x.clone());
        in[i].data()[e] += static_cast<float>(s == 0 ? h : -h);
        std::vector<Var> vars(in.begin(), in.end());
        l[s] = dot(to_double(f(vars).value), a.r);
      }
      fd[static_cast<size_t>(e)] = (l[0] - l[1]) / (2.0 * h);
    }
    if (auto ok = AllClose(a.grads[i], fd, tol, grad_scale(fd)); !ok) return ok << " (gradient of input " << i << ")";
  }
  return ::testing::AssertionSuccess();
}

inline bool AllZero(const Tensor& t) {
  for (float v : t.to_vector())
    if (v != 0.0f) return false;
  return true;
}

}  // namespace qkv::testing
