// The x86 instruction-set levels the kernels are built for, the best one this CPU and OS support (native), and the
// process-wide level the kernels dispatch on (default native; set lower to run and test a lower level's code here).
//
// Levels, each including the ones before it:
//   scalar       no kernel of ours (callers take the torch path)
//   avx2         AVX2 + FMA + F16C                      quant_linear's AVX2 kernel (quant_gemm_avx2.h)
//   avx512_vnni  AVX-512 F/BW/VL/DQ + VNNI              quant_linear's VPDPBUSD kernel (quant_gemm.h)
//   avx512_bf16  + AVX-512 BF16                         every kernel (the bf16 ones need VCVTNEPS2BF16 / VDPBF16PS)
//   amx          + AMX tile/bf16/int8 and the OS's permission for the tile state
// __builtin_cpu_supports also checks that the OS saves the vector state (XCR0) for AVX and AVX-512.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace sgl_cpu {

enum class CpuIsa : int { kScalar = 0, kAvx2 = 1, kAvx512Vnni = 2, kAvx512Bf16 = 3, kAmx = 4 };

constexpr const char* kCpuIsaNames[] = {"scalar", "avx2", "avx512_vnni", "avx512_bf16", "amx"};
constexpr int kCpuIsaCount = 5;

inline const char* cpu_isa_name(CpuIsa isa) { return kCpuIsaNames[(int)isa]; }

// false when `name` is none of kCpuIsaNames
inline bool cpu_isa_from_name(const std::string& name, CpuIsa* out) {
  for (int i = 0; i < kCpuIsaCount; ++i)
    if (name == kCpuIsaNames[i]) {
      *out = (CpuIsa)i;
      return true;
    }
  return false;
}

// Linux hands out the AMX tile state only to processes that ask for it (once per process).
inline bool amx_request_permission() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

inline CpuIsa detect_native_isa() {
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
    return CpuIsa::kScalar;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni")))
    return CpuIsa::kAvx2;
  if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::kAvx512Vnni;
  if (!(__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
        __builtin_cpu_supports("amx-int8") && amx_request_permission()))
    return CpuIsa::kAvx512Bf16;
  return CpuIsa::kAmx;
}

// Detected once per process.
inline CpuIsa native_isa() {
  static const CpuIsa isa = detect_native_isa();
  return isa;
}

inline std::atomic<int>& current_isa_slot() {
  static std::atomic<int> slot{(int)native_isa()};
  return slot;
}

// The level the kernels dispatch on.
inline CpuIsa current_isa() { return (CpuIsa)current_isa_slot().load(std::memory_order_relaxed); }

// false (and nothing changed) when `isa` is above native_isa()
inline bool set_current_isa(CpuIsa isa) {
  if ((int)isa > (int)native_isa()) return false;
  current_isa_slot().store((int)isa, std::memory_order_relaxed);
  return true;
}

inline bool isa_at_least(CpuIsa level) { return (int)current_isa() >= (int)level; }

}  // namespace sgl_cpu
