// Element-wise reduction kernels of the collectives, and the float16 / bfloat16 conversions
// they use.
//
// Every kernel is a plain loop over typed pointers that GCC and Clang vectorise at -O3
// (reduce.cpp is compiled with -O3 whatever the build type); on x86-64 the same loops are
// also instantiated for AVX2 + F16C and chosen at run time when the CPU has them (float16
// then converts in hardware: ~20x the emulated rate). float16 and bfloat16 elements
// are widened to float32, combined, and rounded back to nearest-even once per kernel call.
// In the ring algorithms every hop is one kernel call, so partial sums travel between ranks
// in the wire type and are rounded at each hop — the precision NCCL gives for these types
// (its ring also moves partial results in the buffer's type). The error of a float16 sum
// over n ranks is therefore bounded by about n·2^-11 relative to the sum of magnitudes
// (bfloat16: n·2^-8), not by float32's epsilon.
//
// Signed integer sum and product wrap around (two's complement), as on GPUs; nothing here is
// undefined behaviour for any input. max/min of floating-point values containing NaN return
// one of the operands (which one is unspecified, as with x86 maxps/minps).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ccl/ccl.h"

namespace softrdma::ccl {

/// acc[i] = acc[i] op in[i] for i < count. kAvg reduces like kSum (the division is
/// scale_avg's, once, at the end). `acc` and `in` must not overlap. Throws
/// std::invalid_argument for an unknown type or op.
void reduce_into(void* acc, const void* in, size_t count, DataType type, RedOp op);

/// out[i] = a[i] op b[i] for i < count. `out` may be exactly `a` or exactly `b` (then this
/// is reduce_into); otherwise no two of the ranges may overlap. Every supported op is
/// commutative, bit for bit, so the operand order never changes the result.
void reduce_to(void* out, const void* a, const void* b, size_t count, DataType type, RedOp op);

/// data[i] = data[i] / nranks — the final step of kAvg. Integers truncate toward zero (C++
/// division); float16/bfloat16 divide in float32 and round to nearest-even.
void scale_avg(void* data, size_t count, DataType type, int nranks);

namespace detail {
/// Test hook: false makes the kernels use the portable loops even where the CPU has
/// AVX2/F16C (x86-64 dispatches to those at run time by default).
void use_simd_dispatch(bool enabled);
}  // namespace detail

/// IEEE 754 binary16 bits → float32 (exact: every half is a float; NaN payloads kept).
float half_to_float(uint16_t h);
/// float32 → binary16 bits, round to nearest, ties to even; overflow → ±inf; NaN → quiet NaN.
uint16_t float_to_half(float f);
/// bfloat16 bits (the top half of a float32) → float32 (exact).
float bfloat16_to_float(uint16_t b);
/// float32 → bfloat16 bits, round to nearest, ties to even; NaN → quiet NaN (sign kept).
uint16_t float_to_bfloat16(float f);

/// Element `i` of a buffer of `t` as a double (exact for every type but 64-bit integers
/// beyond ±2^53; float16/bfloat16 through float32): for tools and tests that fill and check
/// typed buffers without a switch of their own.
double load_element(const void* p, DataType t, size_t i);
/// Stores `v` at element `i` of a buffer of `t`: float types rounded to nearest (through
/// float32 for float16/bfloat16), integer types truncated toward zero (values out of the
/// type's range are the caller's error, as with static_cast).
void store_element(void* p, DataType t, size_t i, double v);

}  // namespace softrdma::ccl
