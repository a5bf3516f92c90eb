// The CPU-feature probe (__builtin_cpu_supports, once) and the QKV_ISA cap that every kernel dispatcher reads
// through active_isa().
#include "qkv/kernels/cpu.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace qkv::kernels {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    c.avx512 = c.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    c.avx512_vnni = c.avx512 && __builtin_cpu_supports("avx512vnni");
    c.avx512_bf16 = c.avx512_vnni && __builtin_cpu_supports("avx512bf16");
    return c;
  }();
  return f;
}

bool cpu_supports(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return true;
    case Isa::kAvx2: return cpu_features().avx2;
    case Isa::kAvx512: return cpu_features().avx512;
    case Isa::kAvx512Vnni: return cpu_features().avx512_vnni;
    case Isa::kAvx512Bf16: return cpu_features().avx512_bf16;
  }
  return false;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Vnni: return "avx512vnni";
    case Isa::kAvx512Bf16: return "avx512bf16";
  }
  return "unknown";
}

Isa resolve_isa(const char* env_value, const CpuFeatures& f) {
  const Isa widest = f.avx512_bf16 ? Isa::kAvx512Bf16
                     : f.avx512_vnni ? Isa::kAvx512Vnni
                     : f.avx512      ? Isa::kAvx512
                     : f.avx2        ? Isa::kAvx2
                                     : Isa::kPortable;
  if (env_value == nullptr || *env_value == '\0') return widest;
  const std::string v(env_value);
  Isa want;
  if (v == "portable") want = Isa::kPortable;
  else if (v == "avx2") want = Isa::kAvx2;
  else if (v == "avx512") want = Isa::kAvx512;
  else if (v == "avx512vnni") want = Isa::kAvx512Vnni;
  else if (v == "avx512bf16") want = Isa::kAvx512Bf16;
  else
    throw std::runtime_error("[cpu] QKV_ISA='" + v + "' is not one of portable, avx2, avx512, avx512vnni, avx512bf16");
  if (static_cast<int>(want) > static_cast<int>(widest))
    throw std::runtime_error("[cpu] QKV_ISA=" + v + " asks for " + isa_name(want) + " kernels but this CPU has only " +
                             isa_name(widest));
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
