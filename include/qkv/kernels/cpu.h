// The one CPU-feature probe of the library: which instruction sets this CPU has (checked once with
// __builtin_cpu_supports) and which the kernels' run-time dispatchers use. QKV_ISA in the environment caps the
// widest path for tests and comparisons.
#pragma once

namespace qkv::kernels {

// Kernel paths, narrowest to widest. kAvx2 means AVX2 + FMA; kAvx512 means AVX-512 F, BW, DQ and VL (every AVX-512
// kernel also uses AVX2 + FMA); kAvx512Vnni adds AVX512-VNNI (the int8 product's vpdpbusd zmm); kAvx512Bf16 adds
// AVX512-BF16 as well (the bf16 product's vdpbf16ps); kAmx adds AMX-TILE, AMX-BF16 and AMX-INT8 with the OS's tile
// state and Linux's permission to use it (the bf16 and int8 products' tdpbf16ps and tdpbusd from 16 rows). Only the
// low-precision kernels (qkv/kernels/lowp.h) have builds past kAvx512: the float32 kernels run their AVX-512 build
// there, and the fused attention its amx set on kAmx (the avx512bf16 set with its bf16 products on tiles).
// kAvx2Vnni (AVX2 + FMA + AVX-VNNI: the VEX-encoded vpdpbusd ymm of CPUs with AVX2 but no AVX-512, such as Alder
// Lake) is a side branch, not a rung of the ladder: it sits between kAvx2 and kAvx512 so that `>= kAvx2` and
// `>= kAvx512` stay right (it runs every AVX2 kernel and no AVX-512 one), but the AVX-512 levels do not imply
// AVX-VNNI and never use it. Only the packed int8 product has an avx2vnni build; compare with == for it.
enum class Isa { kPortable = 0, kAvx2 = 1, kAvx2Vnni = 2, kAvx512 = 3, kAvx512Vnni = 4, kAvx512Bf16 = 5, kAmx = 6 };

// What the hardware has, probed once.
struct CpuFeatures {
  bool avx2 = false;     // AVX2 and FMA
  bool avx512 = false;   // AVX-512 F, BW, DQ and VL (and AVX2 + FMA)
  bool avx512_vnni = false;  // and AVX512-VNNI
  bool avx512_bf16 = false;  // and AVX512-BF16 (set only with avx512_vnni: every such CPU has both)
  bool avx_vnni = false;     // AVX-VNNI (VEX vpdpbusd ymm) with avx2; independent of the AVX-512 flags
  // AMX-TILE, AMX-BF16 and AMX-INT8 usable (set only with avx512_bf16): the CPU reports them, the OS enables the
  // tile state (XCR0 bits 17, 18) and Linux grants this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM,
  // asked once, by the probe). Where the CPU reports AMX but one of the others fails, amx stays false and
  // amx_refused says why, in one line (`qkv info`, qkv.cpu_info()); empty otherwise.
  bool amx = false;
  const char* amx_refused = "";
};
const CpuFeatures& cpu_features();

// Whether this CPU can run `isa`'s kernels (kPortable: always); cpu_supports(isa, features) for given features.
bool cpu_supports(Isa isa);
bool cpu_supports(Isa isa, const CpuFeatures& features);

// The widest path the dispatchers pick: the widest this CPU has (the AVX-512 ladder where it has AVX-512, else
// avx2vnni where it has AVX2 + AVX-VNNI, else avx2 or portable), capped by QKV_ISA (read once, at the first call):
//   QKV_ISA=portable | avx2 | avx2vnni | avx512 | avx512vnni | avx512bf16 | amx   (unset or empty: no cap)
// QKV_ISA=avx2vnni is accepted wherever the CPU has AVX2 + AVX-VNNI, AVX-512 or not (that is how a CPU with both
// tests the avx2vnni build). QKV_ISA naming a path this CPU lacks, or any other value, throws std::runtime_error
// "[cpu] ..." from every call (the path asked for can never silently become another one).
Isa active_isa();

// resolve_isa(QKV_ISA value or nullptr, features): the rule active_isa() applies, for tests.
Isa resolve_isa(const char* env_value, const CpuFeatures& features);

// "portable", "avx2", "avx2vnni", "avx512", "avx512vnni", "avx512bf16", "amx".
const char* isa_name(Isa isa);

}  // namespace qkv::kernels
