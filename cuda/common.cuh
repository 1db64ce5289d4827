// Shared by every kernel family: index arithmetic, the grid-stride loop and the SplitMix64 stream;
// in namespace capsule the correctly rounded scalar operations and read-only loads, and (kernel
// code only) float4 access, thread indices and the warp and block reductions.
// Per-element math is __host__ __device__ so that the tests compile it for the host too.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define CAPSULE_HD __host__ __device__ __forceinline__
#else
#define CAPSULE_HD inline
#endif

// Grid-stride loop over [0, n) with 64-bit indices: correct for any grid size and any n.
#define CAPSULE_GRID_STRIDE(i, n)                                                              \
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);   \
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// SplitMix64 finaliser (Steele, Lea, Flood 2014): the spec's mix(z), all arithmetic mod 2^64.
CAPSULE_HD uint64_t capsule_splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Element i of the counter stream of `seed`: the low 32 bits of mix(mix(seed) + i).
CAPSULE_HD uint32_t capsule_stream_bits(uint64_t seed, uint64_t i) {
    return static_cast<uint32_t>(capsule_splitmix64(capsule_splitmix64(seed) + i));
}

// u = (r >> 8) * 2^-24: 24 random bits, exactly representable, in [0, 1).
CAPSULE_HD float capsule_uniform(uint32_t r) {
    return static_cast<float>(r >> 8) * 5.9604644775390625e-08f;
}

// Output length of conv and the pools: floor((in + 2p - k) / s) + 1, or 0 when in + 2p < k.
CAPSULE_HD int64_t capsule_window_out_len(int64_t in, int64_t k, int64_t s, int64_t p) {
    const int64_t span = in + 2 * p - k;
    return span < 0 ? 0 : span / s + 1;
}

// Output length of conv_transpose: max(0, (in - 1) * s + k - 2p).
CAPSULE_HD int64_t capsule_transpose_out_len(int64_t in, int64_t k, int64_t s, int64_t p) {
    const int64_t len = (in - 1) * s + k - 2 * p;
    return len < 0 ? 0 : len;
}

namespace capsule {

// -- single roundings, device intrinsics or their host equivalents ------------------------------
// Each is one correctly rounded IEEE operation: _rn intrinsics on the device (never contracted
// into an FMA), plain arithmetic on the host (SSE, round to nearest, no FMA contraction at the
// default -march; glibc's fmaf and fma are correctly rounded).

CAPSULE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

CAPSULE_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

CAPSULE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

CAPSULE_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

CAPSULE_HD float rcp_rn(float a) {
#if defined(__CUDA_ARCH__)
    return __frcp_rn(a);
#else
    return 1.0f / a;
#endif
}

CAPSULE_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
    return __fsqrt_rn(a);
#else
    return std::sqrt(a);
#endif
}

// a·b + c with one rounding.
CAPSULE_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fmaf(a, b, c);
#endif
}

CAPSULE_HD double fma_rn(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
    return __fma_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

// -- memory access, device intrinsics or their host equivalents ---------------------------------

CAPSULE_HD bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Read-only global loads: through the read-only (non-coherent) data cache on the device.
CAPSULE_HD float ldg(const float* p) {
#if defined(__CUDA_ARCH__)
    return __ldg(p);
#else
    return *p;
#endif
}

}  // namespace capsule

// -- CUDA's side: float4 access, thread indices, warp and block reductions ----------------------
// Only under nvcc or a CPU emulator that defines the CUDA keywords and vector types: plain C++
// that includes this header for the scalar math above does not see them.
#if defined(__CUDACC__) || defined(__global__)

namespace capsule {

// The float4 v of a 16-byte aligned p (floats 4v … 4v + 3), read-only.
CAPSULE_HD float4 load4(const float* p, int64_t v) {
#if defined(__CUDA_ARCH__)
    return __ldg(reinterpret_cast<const float4*>(p) + v);
#else
    return reinterpret_cast<const float4*>(p)[v];
#endif
}

CAPSULE_HD void store4(float* p, int64_t v, float4 a) { reinterpret_cast<float4*>(p)[v] = a; }

// p[e + k] = v[k] for the k < 4 with e + k < n: one 16-byte store when `vector` (p 16-byte
// aligned, e a multiple of 4) and all four are in range.
CAPSULE_HD void store4_upto(float* p, int64_t e, int64_t n, bool vector, const float (&v)[4]) {
    if (vector && e + 4 <= n) {
        *reinterpret_cast<float4*>(p + e) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (e + k < n) p[e + k] = v[k];
    }
}

constexpr unsigned kFullMask = 0xffffffffu;

// The launch's dynamic shared memory (16-byte aligned) and its size in bytes; the CPU emulator
// (capsule_emu.h) provides both.
template <class T>
__device__ __forceinline__ T* dynamic_shared() {
#if defined(CAPSULE_EMU)
    return reinterpret_cast<T*>(capsule_emu_dynamic_shared());
#else
    extern __shared__ __align__(16) unsigned char capsule_dynamic_shared_bytes[];
    return reinterpret_cast<T*>(capsule_dynamic_shared_bytes);
#endif
}

__device__ __forceinline__ unsigned dynamic_shared_bytes() {
#if defined(CAPSULE_EMU)
    return capsule_emu_dynamic_shared_bytes();
#else
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
#endif
}


// This thread's index in a 1-D grid, and the grid's thread count (the grid-stride step).
__device__ __forceinline__ int64_t thread_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }

__device__ __forceinline__ int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Butterfly sums inside aligned groups of G lanes (G a power of two, at most 32): every lane ends
// with the same bits, as IEEE addition commutes. group_sum_rn adds with add_rn (never contracted).
template <int G, class T>
__device__ __forceinline__ T group_sum(T v) {
#pragma unroll
    for (int offset = G / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

template <int G>
__device__ __forceinline__ float group_sum_rn(float v) {
#pragma unroll
    for (int offset = G / 2; offset > 0; offset >>= 1) v = add_rn(v, __shfl_xor_sync(kFullMask, v, offset));
    return v;
}

// Block reduction (blockDim.x a multiple of 32, scratch of 32 values): warps reduce by warp_reduce,
// warp leaders publish, then every warp reduces the same published values (`identity` past the
// last warp) in the same order, so all threads hold the same bits without a broadcast. The first
// barrier lets a previous reduction's readers finish with scratch.
template <class T, class WarpReduce>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity, WarpReduce warp_reduce) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_reduce(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_reduce(lane < warps ? scratch[lane] : identity);
}

template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
    return block_reduce(v, scratch, T(0), [](T x) { return group_sum<32>(x); });
}

}  // namespace capsule

#endif
