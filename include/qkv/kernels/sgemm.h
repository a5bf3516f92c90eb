// Row-major single-precision GEMM used by every matmul and linear layer: qkv's own AVX-512 kernel (packed panels,
// register-blocked microkernel, OpenMP over C blocks) when the CPU has AVX-512 F/BW/DQ/VL, else OpenBLAS.
#pragma once

#include <cstdint>
#include <memory>

namespace qkv::kernels {

// op(B) of sgemm packed once into the AVX-512 kernel's panels (a weight that many products read): the same panels,
// in the same K blocks, that sgemm packs on every call, so a product over them gives sgemm's bits exactly.
// sgemm_pack_b leaves it empty (packed() false) where sgemm would not run its own kernel (no AVX-512, QKV_ISA below
// avx512, QKV_SGEMM=openblas).
inline constexpr int64_t kSgemmPanel = 32;  // columns per packed panel
struct SgemmPackedB {
  std::shared_ptr<const float> data;  // per K block at pc: ceil(n / 32) panels of kc x 32 floats, from pc · 32 · panels
  int64_t k = 0, n = 0;
  bool packed() const { return data != nullptr; }
};

// Packs op(B) (k, n) (B stored (k, n) with ldb, or (n, k) when trans_b) for sgemm; 4·k·ceil(n/32)·32 bytes.
void sgemm_pack_b(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb, SgemmPackedB& out);

// C (m, n) = alpha · op(A) · op(B) + beta · C, all row-major (CBLAS semantics, CblasRowMajor).
//   op(A) (m, k): A stored (m, k) with lda >= max(1, k), or when trans_a stored (k, m) with lda >= max(1, m)
//   op(B) (k, n): B stored (k, n) with ldb >= max(1, n), or when trans_b stored (n, k) with ldb >= max(1, k)
//   C (m, n) with ldc >= max(1, n)
// beta == 0: C is only written (NaN or garbage in C does not leak). k == 0 or alpha == 0: C = beta · C.
// Deterministic: K is never split across threads, so for given inputs the result is bit-identical from run to run
// and for any thread count. Multithreaded (omp_get_max_threads()) unless called inside an active parallel region.
// Small products (m·n·k below 48^3) and CPUs without AVX-512 go to OpenBLAS, as does QKV_ISA=avx2 or portable
// (qkv/kernels/cpu.h). QKV_SGEMM=openblas in the environment (read once) forces OpenBLAS everywhere.
// Throws std::invalid_argument "[sgemm] ..." on negative sizes, too-small leading dimensions or null pointers with
// non-empty operands.
// packed: op(B) already packed (sgemm_pack_b of the matrix whose columns [packed_col0, packed_col0 + n) are this
// op(B); packed_col0 a multiple of 32, packed->k() == k). Where the product runs the AVX-512 kernel its panels are
// read from there instead of packed from b; every other path reads b. The bits are the same either way.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const SgemmPackedB* packed = nullptr,
           int64_t packed_col0 = 0);

// Same contract, always cblas_sgemm (the plain reference kept beside the fast kernel). Sizes and leading dimensions
// must also fit in int (std::runtime_error otherwise).
void sgemm_reference(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Same contract, always the AVX-512 kernel whatever the size (tests, benchmarks). Throws std::runtime_error when
// the CPU lacks AVX-512 F/BW/DQ/VL (see sgemm_avx512_supported()).
void sgemm_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Whether this CPU has AVX-512 F, BW, DQ and VL (cpu_supports(Isa::kAvx512)).
bool sgemm_avx512_supported();

// Backend that sgemm() uses for large products: "avx512" or "openblas" (no AVX-512, QKV_ISA below avx512, or
// QKV_SGEMM=openblas).
const char* sgemm_backend();

}  // namespace qkv::kernels
