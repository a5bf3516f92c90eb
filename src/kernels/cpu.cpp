// The CPU-feature probe (__builtin_cpu_supports, once) and the QKV_ISA cap that every kernel dispatcher reads
// through active_isa().
#include "qkv/kernels/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace qkv::kernels {

namespace {

// AMX: CPUID leaf 7 subleaf 0, EDX bits 22 (AMX-BF16), 24 (AMX-TILE) and 25 (AMX-INT8); the OS must have enabled
// the tile state in XCR0 (bits 17 XTILECFG and 18 XTILEDATA), and Linux (5.16 on) hands the 8 KB of tile data to
// a process only when it asks, once, with arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). Any refusal leaves
// amx false with its reason: the kernels then run the AVX512-BF16 / VNNI builds, and nothing crashes.
void probe_amx(CpuFeatures& c) {
  unsigned a = 0, b = 0, cx = 0, d = 0;
  if (!c.avx512_bf16 || !__get_cpuid_count(7, 0, &a, &b, &cx, &d)) return;
  if ((d & (1u << 22)) == 0 || (d & (1u << 24)) == 0 || (d & (1u << 25)) == 0) return;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));  // OSXSAVE holds: the AVX-512 flags needed it
  if ((lo & (3u << 17)) != (3u << 17)) {
    c.amx_refused = "AMX unused: the OS has not enabled the tile state (XCR0 bits 17-18)";
    return;
  }
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  const int saved = errno;
  const long r = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata);
  const int err = errno;
  errno = saved;
  if (r != 0) {
    c.amx_refused = err == EINVAL ? "AMX unused: the kernel does not grant tile data (arch_prctl EINVAL: Linux < 5.16)"
                    : err == EPERM ? "AMX unused: the kernel refused tile data (arch_prctl EPERM)"
                    : err == ENOSPC ? "AMX unused: a thread's signal stack is too small for the tile state (ENOSPC)"
                                   : "AMX unused: arch_prctl(ARCH_REQ_XCOMP_PERM) failed";
    return;
  }
  c.amx = true;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    c.avx512 = c.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    c.avx512_vnni = c.avx512 && __builtin_cpu_supports("avx512vnni");
    c.avx512_bf16 = c.avx512_vnni && __builtin_cpu_supports("avx512bf16");
    // AVX-VNNI: CPUID leaf 7 subleaf 1, EAX bit 4 (clang 14's __builtin_cpu_supports has no name for it; the
    // OS's ymm state is already implied by avx2 above)
    unsigned a = 0, b = 0, cx = 0, d = 0;
    c.avx_vnni = c.avx2 && __get_cpuid_count(7, 1, &a, &b, &cx, &d) && (a & (1u << 4)) != 0;
    probe_amx(c);
    return c;
  }();
  return f;
}

bool cpu_supports(Isa isa, const CpuFeatures& f) {
  switch (isa) {
    case Isa::kPortable: return true;
    case Isa::kAvx2: return f.avx2;
    case Isa::kAvx2Vnni: return f.avx2 && f.avx_vnni;
    case Isa::kAvx512: return f.avx512;
    case Isa::kAvx512Vnni: return f.avx512_vnni;
    case Isa::kAvx512Bf16: return f.avx512_bf16;
    case Isa::kAmx: return f.avx512_bf16 && f.amx;
  }
  return false;
}

bool cpu_supports(Isa isa) { return cpu_supports(isa, cpu_features()); }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx2Vnni: return "avx2vnni";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Vnni: return "avx512vnni";
    case Isa::kAvx512Bf16: return "avx512bf16";
    case Isa::kAmx: return "amx";
  }
  return "unknown";
}

Isa resolve_isa(const char* env_value, const CpuFeatures& f) {
  // The AVX-512 ladder where there is AVX-512 (its int8 build is the zmm one), else the AVX2 side branch.
  const Isa widest = f.avx512_bf16 && f.amx        ? Isa::kAmx
                     : f.avx512_bf16               ? Isa::kAvx512Bf16
                     : f.avx512_vnni               ? Isa::kAvx512Vnni
                     : f.avx512                    ? Isa::kAvx512
                     : f.avx2 && f.avx_vnni        ? Isa::kAvx2Vnni
                     : f.avx2                      ? Isa::kAvx2
                                                   : Isa::kPortable;
  if (env_value == nullptr || *env_value == '\0') return widest;
  const std::string v(env_value);
  Isa want;
  if (v == "portable") want = Isa::kPortable;
  else if (v == "avx2") want = Isa::kAvx2;
  else if (v == "avx2vnni") want = Isa::kAvx2Vnni;
  else if (v == "avx512") want = Isa::kAvx512;
  else if (v == "avx512vnni") want = Isa::kAvx512Vnni;
  else if (v == "avx512bf16") want = Isa::kAvx512Bf16;
  else if (v == "amx") want = Isa::kAmx;
  else
    throw std::runtime_error("[cpu] QKV_ISA='" + v +
                             "' is not one of portable, avx2, avx2vnni, avx512, avx512vnni, avx512bf16, amx");
  // By feature, not by order: avx2vnni is no rung of the AVX-512 ladder (an AVX-512 CPU may lack AVX-VNNI, and
  // an AVX-VNNI CPU AVX-512).
  if (!cpu_supports(want, f))
    throw std::runtime_error("[cpu] QKV_ISA=" + v + " asks for " + isa_name(want) +
                             " kernels but this CPU lacks them (its widest path is " + isa_name(widest) + ")");
  return want;
}

Isa active_isa() {
  struct Resolved {
    Isa isa = Isa::kPortable;
    std::string error;  // non-empty: QKV_ISA is unusable, every call throws it
  };
  static const Resolved r = [] {
    Resolved out;
    try {
      out.isa = resolve_isa(std::getenv("QKV_ISA"), cpu_features());
    } catch (const std::runtime_error& e) {
      out.error = e.what();
    }
    return out;
  }();
  if (!r.error.empty()) throw std::runtime_error(r.error);
  return r.isa;
}

}  // namespace qkv::kernels
