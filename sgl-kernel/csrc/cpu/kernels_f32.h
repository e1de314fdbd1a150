// The fp32 kernels (decode attention, RMSNorm, SiluAndMul, rotary) of the levels below avx512_bf16, where the
// runtime serves fp32 activations and an fp32 KV pool. Each algorithm is written once (decode_attention_f32_impl.h,
// elementwise_f32_impl.h) over the vector interface of vec_f32.h and compiled here once per level, in its own
// namespace and for its own target only:
//   f32_avx512   F32x16, AVX-512 F/BW/VL/DQ   used at avx512_vnni and above
//   f32_avx2     F32x8,  AVX2 + FMA           used at avx2
// Callers pick the namespace from the level the module dispatches on (isa.h); nothing runs below avx2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "decode_attention.h"  // SGL_DECODE_HEAD_DIMS
#include "isa.h"
#include "vec_f32.h"

namespace sgl_cpu {

namespace f32_avx512 {
using V = F32x16;
#define SGL_F32_TARGET SGL_AVX512
#include "decode_attention_f32_impl.h"
#include "elementwise_f32_impl.h"
#undef SGL_F32_TARGET
}  // namespace f32_avx512

namespace f32_avx2 {
using V = F32x8;
#define SGL_F32_TARGET SGL_AVX2
#include "decode_attention_f32_impl.h"
#include "elementwise_f32_impl.h"
#undef SGL_F32_TARGET
}  // namespace f32_avx2

// Whether the fp32 kernels run at the current level.
inline bool f32_supported() { return isa_at_least(CpuIsa::kAvx2); }

// Whether the current level takes the 512-bit namespace (else the AVX2 one).
inline bool f32_wide() { return isa_at_least(CpuIsa::kAvx512Vnni); }

}  // namespace sgl_cpu

// Calls sgl_cpu::f32_avx512::NAME(args...) at avx512_vnni and above, sgl_cpu::f32_avx2::NAME(args...) at avx2.
#define SGL_F32_CALL(NAME, ...) \
  (sgl_cpu::f32_wide() ? sgl_cpu::f32_avx512::NAME(__VA_ARGS__) : sgl_cpu::f32_avx2::NAME(__VA_ARGS__))
