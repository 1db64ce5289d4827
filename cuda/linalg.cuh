// The linalg family's per-thread code (spec "Linear algebra and losses"), __host__ __device__
// where the tests run it on the host: the SGEMM core behind matmul and linear, mse_loss's terms and
// reduction steps, and linear's bias gradient (column sums). Plain float32 FMA, no tensor cores.
//
// SGEMM core: C = op(A)·op(B) per batch entry, C (m×n) row-major, contraction length k.
// A block computes one BM×BN tile of C: k-tiles of BK = 16 are copied into shared memory by
// cp.async (16-byte copies where the layout allows, element by element where an operand is
// k-contiguous and must be transposed), k-major, in a ring of three stages: the copies of k-tiles
// t + 1 and t + 2 are in flight while tile t is multiplied, one barrier per k-tile. Each thread
// keeps a TM×TN micro-tile of accumulators in registers and reads its A and B fragments as
// 16-byte shared loads, those of step p + 1 while the FMAs of step p run. Elements beyond m, n or
// k are copied as zeros, so the inner product loop has no bounds tests. Every output is a
// sequential FMA chain over p = 0, 1, ..., k-1 (then zero terms): deterministic, and the same
// bits for any grid and either tile shape. Split-K: a block may take one of `splits` ranges of
// whole SPLIT_STEPs of k instead (its FMA chain runs over that range only) and write its partial
// tile to a workspace; a second launch adds the partials in split order (split_sum). The bits
// then depend on the split count, which the plan derives from the shape alone, never on the grid.
// The main loop needs barriers and cp.async: kernel code only (the CPU emulator included).
//
// GEMV (linear's forward for at most 16 rows): w is stored out×in, so each output column's
// weights are contiguous along k. A warp takes a few columns (GemvTile) and one of k_warps
// interleaved slices of k; each lane reads 16-byte chunks of the columns (and of x's rows) and
// keeps a sequential FMA chain per output over its chunks; then a butterfly over the lanes, the
// k_warps slices added in order, and the bias.
#pragma once

#include <cmath>
#include <cstdint>
#if defined(CAPSULE_EMU)
#include <cstring>
#endif

#include "common.cuh"

namespace capsule_la {

// -- single roundings and memory access, device intrinsics or their host equivalents -----------

using capsule::add_rn;
using capsule::aligned16;
using capsule::fma_rn;
using capsule::ldg;
using capsule::mul_rn;
using capsule::sub_rn;

CAPSULE_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

CAPSULE_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Four read-only global floats from an aligned address (the non-coherent path on the device).
CAPSULE_HD void ldg4(const float* p, float v[4]) {
#if defined(__CUDA_ARCH__)
    const float4 t = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
#else
    for (int x = 0; x < 4; ++x) v[x] = p[x];
#endif
}

// 16-byte global store of an aligned address (cached in L2 only: outputs are not read back).
CAPSULE_HD void stg4(float* p, const float v[4]) {
#if defined(__CUDA_ARCH__)
    __stcg(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
#else
    for (int x = 0; x < 4; ++x) p[x] = v[x];
#endif
}

// 16-byte load / store of an aligned shared-memory address.
CAPSULE_HD void ld4(const float* p, float v[4]) {
#if defined(__CUDA_ARCH__)
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
#else
    for (int x = 0; x < 4; ++x) v[x] = p[x];
#endif
}

CAPSULE_HD void st4(float* p, const float v[4]) {
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
#else
    for (int x = 0; x < 4; ++x) p[x] = v[x];
#endif
}

// -- SGEMM tiles ----------------------------------------------------------------------------------

// A block tile of BM×BN outputs, TM×TN per thread. Threads are laid out 8 (x) × 4 (y) per warp,
// so a warp's A fragments span 4 float4 and its B fragments 8 float4 (one shared-memory
// wavefront each). A thread's rows are 4-row groups TY·4 apart, its columns 4-column groups
// TX·4 apart (tile_row, tile_col). A stage holds one k-tile of both operands, k-major and
// unpadded (as[p·BM + i], bs[p·BN + j]); STAGES of them form the ring the copies run ahead in.
template <int BM_, int BN_, int TM_, int TN_>
struct GemmTile {
    static constexpr int BM = BM_, BN = BN_, BK = 16, STAGES = 3, TM = TM_, TN = TN_;
    static constexpr int TX = BN / TN, TY = BM / TM, THREADS = TX * TY;
    static constexpr int A_STAGE = BK * BM, STAGE = BK * (BM + BN);
    static constexpr int SMEM_FLOATS = STAGES * STAGE;
    static_assert(TM % 4 == 0 && TN % 4 == 0 && TX % 8 == 0 && TY % 4 == 0, "whole 8x4 warps, 4-wide fragments");
    static_assert(THREADS % BM == 0 && THREADS % BN == 0 && BM % 32 == 0 && BN % 32 == 0,
                  "k-contiguous copies: a warp takes 32 consecutive rows, the block whole slices of k");
    static_assert(BK * BM % (4 * THREADS) == 0 && BK * BN % (4 * THREADS) == 0, "16-byte copies cover the k-tile");
};

using BigTile = GemmTile<128, 128, 8, 8>;  // 256 threads: large problems
using SmallTile = GemmTile<64, 64, 8, 4>;  // 128 threads: four times the blocks, for small grids

template <class T>
CAPSULE_HD int thread_x(int tid) { return ((tid >> 5) % (T::TX / 8)) * 8 + (tid & 7); }

template <class T>
CAPSULE_HD int thread_y(int tid) { return ((tid >> 5) / (T::TX / 8)) * 4 + ((tid & 31) >> 3); }

// Row of the block tile held by micro-tile row r (< TM) of the thread at y = ty; columns alike.
template <class T>
CAPSULE_HD int tile_row(int ty, int r) { return (r / 4) * (T::TY * 4) + ty * 4 + (r % 4); }

template <class T>
CAPSULE_HD int tile_col(int tx, int c) { return (c / 4) * (T::TX * 4) + tx * 4 + (c % 4); }

// Tile t of a batch of tiles_m × tiles_n tiles → (batch entry, tile row, tile column). Within a
// batch entry, groups of 8 tile rows are swept column by column, so blocks running together
// share A rows and B columns in L2.
CAPSULE_HD void tile_coords(int64_t t, int64_t tiles_m, int64_t tiles_n, int64_t& bt, int64_t& tm, int64_t& tn) {
    constexpr int64_t GROUP = 8;
    const int64_t per_batch = tiles_m * tiles_n;
    bt = t / per_batch;
    const int64_t r = t - bt * per_batch;
    const int64_t group = r / (GROUP * tiles_n), first = group * GROUP;
    const int64_t size = min64(tiles_m - first, GROUP), within = r - group * GROUP * tiles_n;
    tm = first + within % size;
    tn = within / size;
}

// One GEMM: C = op(A)·op(B) for each of `batch` entries; op(A) is m×k, op(B) k×n, C m×n. A stored
// transposed (AT) is k×m; B stored transposed (BT) is n×k. Batch strides: m·k, k·n, m·n.
struct Gemm {
    const float* a;
    const float* b;
    float* c;
    int64_t batch, m, n, k;
    float* partial = nullptr;  // split-K: `splits` partial products of C's size, split by split
    int64_t splits = 1;
};

// The entry points as GEMMs: which buffer is A and B, their transposition, and (m, n, k).
struct MatmulFwd {  // y = a·b
    static constexpr bool AT = false, BT = false;
    CAPSULE_HD static Gemm map(const float* a, const float* b, float* y, int64_t batch, int64_t m, int64_t k, int64_t n) {
        return Gemm{a, b, y, batch, m, n, k};
    }
};

struct MatmulBwdA {  // da = g·bᵀ: (m×n)·(n×k), b stored k×n
    static constexpr bool AT = false, BT = true;
    CAPSULE_HD static Gemm map(const float* g, const float* b, float* da, int64_t batch, int64_t m, int64_t k, int64_t n) {
        return Gemm{g, b, da, batch, m, k, n};
    }
};

struct MatmulBwdB {  // db = aᵀ·g: (k×m)·(m×n), a stored m×k
    static constexpr bool AT = true, BT = false;
    CAPSULE_HD static Gemm map(const float* a, const float* g, float* db, int64_t batch, int64_t m, int64_t k, int64_t n) {
        return Gemm{a, g, db, batch, k, n, m};
    }
};

struct LinearFwd {  // y = x·wᵀ (+ b in the epilogue), w stored out×in
    static constexpr bool AT = false, BT = true;
    CAPSULE_HD static Gemm map(const float* x, const float* w, float* y, int64_t rows, int64_t in, int64_t out) {
        return Gemm{x, w, y, 1, rows, out, in};
    }
};

struct LinearBwdX {  // dx = g·w: (rows×out)·(out×in)
    static constexpr bool AT = false, BT = false;
    CAPSULE_HD static Gemm map(const float* g, const float* w, float* dx, int64_t rows, int64_t in, int64_t out) {
        return Gemm{g, w, dx, 1, rows, in, out};
    }
};

struct LinearBwdW {  // dw = gᵀ·x: (out×rows)·(rows×in), g stored rows×out
    static constexpr bool AT = true, BT = false;
    CAPSULE_HD static Gemm map(const float* x, const float* g, float* dw, int64_t rows, int64_t in, int64_t out) {
        return Gemm{g, x, dw, 1, out, in, rows};
    }
};

// The epilogue: the value stored for accumulator v in column j; without_bias() that of a split-K
// partial (the bias comes with the partials' sum).
struct NoBias {
    CAPSULE_HD float operator()(float v, int64_t) const { return v; }
    CAPSULE_HD NoBias without_bias() const { return *this; }
};

struct AddBias {
    const float* bias;  // null: none
    CAPSULE_HD float operator()(float v, int64_t j) const { return bias ? add_rn(v, ldg(bias + j)) : v; }
    CAPSULE_HD AddBias without_bias() const { return AddBias{nullptr}; }
};

// One operand of a tile: its base (this batch entry, from the split's first k on), leading
// dimension, free extent (m for A, n for B) and whether 16-byte copies are legal (aligned base,
// leading dimension a multiple of 4).
struct Operand {
    const float* p;
    int64_t ld, ext;
    bool vec;
};

CAPSULE_HD Operand operand(const float* base, int64_t ld, int64_t ext) {
    return Operand{base, ld, ext, aligned16(base) && ld % 4 == 0};
}

// The thread's outputs that fall inside C, through the epilogue; 16-byte stores when legal.
template <class T, class Epi>
CAPSULE_HD void store_outputs(float* c, int64_t m, int64_t n, bool vec, int64_t i0, int64_t j0, int tx, int ty,
                              const float acc[T::TM][T::TN], const Epi& epi) {
#pragma unroll
    for (int i = 0; i < T::TM; ++i) {
        const int64_t r = i0 + tile_row<T>(ty, i);
        if (r >= m) continue;
        float* row = c + r * n;
#pragma unroll
        for (int h = 0; h < T::TN / 4; ++h) {
            const int64_t j = j0 + tile_col<T>(tx, 4 * h);
            if (vec && j + 4 <= n) {
                float o[4];
                for (int x = 0; x < 4; ++x) o[x] = epi(acc[i][4 * h + x], j + x);
                stg4(row + j, o);
            } else {
                for (int x = 0; x < 4; ++x) {
                    if (j + x < n) row[j + x] = epi(acc[i][4 * h + x], j + x);
                }
            }
        }
    }
}

// The k range [k0, k0 + len) of split s of `splits` (≥ 1): whole steps of SPLIT_STEP, the first
// splits taking ⌈steps / splits⌉ each (a split past the end is empty: its partial is zeros). The
// step is not the k-tile: a range may end inside a k-tile (its last one is then a tail).
constexpr int SPLIT_STEP = 8;

struct KRange {
    int64_t k0, len;
};

CAPSULE_HD KRange split_range(int64_t k, int64_t splits, int64_t s) {
    const int64_t per = cdiv(cdiv(k, SPLIT_STEP), splits < 1 ? 1 : splits) * SPLIT_STEP;
    const int64_t k0 = min64(k, s * per);
    return KRange{k0, min64(k - k0, per)};
}

// Element e of the sum of `splits` partials of `count` elements each, split 0 first.
CAPSULE_HD float split_sum(const float* partial, int64_t count, int64_t splits, int64_t e) {
    float s = ldg(partial + e);
    for (int64_t k = 1; k < splits; ++k) s = add_rn(s, ldg(partial + k * count + e));
    return s;
}

// -- the SGEMM main loop (kernel code only) -------------------------------------------------------
#if defined(__CUDACC__) || defined(__global__)

// Asynchronous copies from global to shared memory (cp.async): issued, committed as a group,
// and complete for the issuing thread once wait_async<N> returns with at most N younger groups
// outstanding (other threads see them after a barrier that follows the wait). live == false
// copies zeros (the zero-fill form: nothing is read from src). 16-byte copies need both addresses
// 16-byte aligned.
#if defined(CAPSULE_EMU)
// The emulator defers each copy to the wait that retires its group, in the issuing thread (a
// queue per thread, in its fiber_local bytes), so shared memory read before that wait still holds
// the emulator's NaN pattern or an older k-tile, as it may on the GPU. The queues are the
// emulator's bookkeeping, unseen by racecheck; the copies themselves are the thread's accesses,
// made at the wait.
namespace emu_async {
struct Copy {
    float* dst;
    const float* src;
    int floats;  // 1 or 4
    bool live;
    uint32_t group;
};

constexpr int kCopies = 64;

struct Queue {
    Copy copies[kCopies];
    int head, count;
    uint32_t group;  // the group being filled; older ones are committed
};

static_assert(sizeof(Queue) <= capsule_emu::kFiberLocalBytes, "a thread's queue fits its fiber_local bytes");

CAPSULE_EMU_INTERNAL inline Queue& mine() { return *static_cast<Queue*>(capsule_emu::fiber_local()); }

CAPSULE_EMU_INTERNAL inline void reset() {
    Queue& q = mine();
    q.head = q.count = 0;
    q.group = 0;
}

CAPSULE_EMU_INTERNAL inline bool push(float* dst, const float* src, int floats, bool live) {
    Queue& q = mine();
    if (q.count == kCopies) return false;
    q.copies[(q.head + q.count++) % kCopies] = Copy{dst, src, floats, live, q.group};
    return true;
}

CAPSULE_EMU_INTERNAL inline void commit() { ++mine().group; }

// The oldest copy of a group with more than n committed groups after it, off the queue.
CAPSULE_EMU_INTERNAL inline bool due(uint32_t n, Copy& out) {
    Queue& q = mine();
    if (q.count == 0 || q.copies[q.head].group + n >= q.group) return false;
    out = q.copies[q.head];
    q.head = (q.head + 1) % kCopies;
    --q.count;
    return true;
}
}  // namespace emu_async
#endif

// Before a block's first copy: nothing on the device; the emulator drops what a block that ended
// in an error left queued.
__device__ __forceinline__ void begin_async() {
#if defined(CAPSULE_EMU)
    emu_async::reset();
#endif
}

__device__ __forceinline__ void copy4_async(float* dst, const float* src, bool live) {
#if defined(CAPSULE_EMU)
    if (!emu_async::push(dst, src, 4, live)) __trap();
#else
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(live ? 16 : 0) : "memory");
#endif
}

__device__ __forceinline__ void copy1_async(float* dst, const float* src, bool live) {
#if defined(CAPSULE_EMU)
    if (!emu_async::push(dst, src, 1, live)) __trap();
#else
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(live ? 4 : 0) : "memory");
#endif
}

__device__ __forceinline__ void commit_async() {
#if defined(CAPSULE_EMU)
    emu_async::commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wait_async() {
#if defined(CAPSULE_EMU)
    emu_async::Copy c;
    while (emu_async::due(N, c)) {
        if (c.floats == 4) {
            *reinterpret_cast<float4*>(c.dst) = c.live ? *reinterpret_cast<const float4*>(c.src) : float4{};
        } else {
            *c.dst = c.live ? *c.src : 0.0f;
        }
    }
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// A thread's copies of one operand's k-tiles into the stages (E: the operand's free extent in the
// tile, BM or BN). K-contiguous operands (A, or B stored transposed) are transposed element by
// element: the thread takes row tid mod E (a warp 32 consecutive rows, so the shared stores hit
// distinct banks) and COPIES consecutive k from slice tid / E. The others move 16-byte chunks
// along the free axis: columns 4·(tid mod E/4) … + 3, k rows tid / (E/4) + c·ROWS, c < COPIES;
// element by element (zeros past the extent) where 16-byte copies are illegal. Past the k-tile's
// valid length everything is zero, so the multiply needs no bounds tests.
template <class T, int E, bool KCONTIG>
struct Loader {
    static constexpr int COPIES = KCONTIG ? E * T::BK / T::THREADS : E * T::BK / (4 * T::THREADS);
    static constexpr int ROWS = KCONTIG ? 1 : T::THREADS / (E / 4);
    const float* src;  // the thread's first element of the current k-tile
    int64_t ld;
    int dst;   // its offset in a stage's part of this operand
    int kq;    // its first k within a k-tile
    int live;  // K-contiguous: 1 when its row is inside; otherwise bit x: column + x inside
    bool vec;  // 16-byte copies

    __device__ __forceinline__ void init(const Operand& op, int64_t e0, int tid) {
        ld = op.ld;
        if (KCONTIG) {
            const int64_t e = e0 + tid % E;
            kq = tid / E * COPIES;
            live = e < op.ext ? 1 : 0;
            src = op.p + (live ? e * op.ld + kq : 0);
            dst = kq * E + tid % E;
            vec = false;
        } else {
            const int64_t e = e0 + tid % (E / 4) * 4;
            kq = tid / (E / 4);
            live = 0;
            for (int x = 0; x < 4; ++x) live |= (e + x < op.ext ? 1 : 0) << x;
            src = op.p + (live ? kq * op.ld + e : 0);
            dst = kq * E + tid % (E / 4) * 4;
            vec = op.vec && live == 15;
        }
    }

    // The current k-tile, kl ≥ 1 elements of k long, into stage part s; then on to the next.
    __device__ __forceinline__ void copy(float* s, int kl) {
        const int kin = kl - kq;  // copy c is inside the k-tile when c·ROWS < kin
#pragma unroll
        for (int c = 0; c < COPIES; ++c) {
            if (KCONTIG) {
                copy1_async(s + dst + c * E, src + c, live && c < kin);
            } else {
                const bool in = c * ROWS < kin;
                const float* from = src + c * ROWS * ld;
                float* to = s + dst + c * ROWS * E;
                if (vec) {
                    copy4_async(to, from, in);
                } else {
#pragma unroll
                    for (int x = 0; x < 4; ++x) copy1_async(to + x, from + x, in && ((live >> x) & 1));
                }
            }
        }
        src += KCONTIG ? T::BK : T::BK * ld;
    }
};

#if defined(CAPSULE_EMU)
// The emulator's multiply: the same FMA chains as the GPU's below (acc[i][j] once per p, p
// ascending, each FMA one rounding), spelt with four-float vectors, which g++ makes packed FMAs;
// its own vectorisation of the scalar loops keeps an 8×8 micro-tile in memory, 7× slower. No
// second fragment buffer: the host has no load latency to hide.
typedef float emu_f4 __attribute__((vector_size(16)));

// UBSan's per-access alignment checks among the FMAs would keep them scalar; the loads test the
// alignment themselves, the rest are registers. (g++ inlines no function into one whose sanitizer
// attributes differ: hence on each.)
#define CAPSULE_LA_NO_UBSAN_ALIGNMENT __attribute__((no_sanitize("alignment")))

// A 16-byte shared-memory load: the GPU's faults at an address that is not a multiple of 16, and
// UBSan checks nothing here, so the test is made by hand.
CAPSULE_LA_NO_UBSAN_ALIGNMENT __forceinline__ emu_f4 emu_ld4(const float* p) {
    capsule_emu::require_aligned(p, 16);
    emu_f4 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

CAPSULE_LA_NO_UBSAN_ALIGNMENT __forceinline__ emu_f4 emu_fma4(emu_f4 a, emu_f4 b, emu_f4 c) {
#if defined(__FMA__)
    return __builtin_ia32_vfmaddps(a, b, c);
#else
    return emu_f4{fma_rn(a[0], b[0], c[0]), fma_rn(a[1], b[1], c[1]), fma_rn(a[2], b[2], c[2]), fma_rn(a[3], b[3], c[3])};
#endif
}

template <class T>
CAPSULE_LA_NO_UBSAN_ALIGNMENT __forceinline__ void multiply_stage(const float* as, const float* bs, int tx, int ty,
                                                                 float (&acc)[T::TM][T::TN]) {
    emu_f4 c[T::TM][T::TN / 4];  // c[i][h]: acc[i][4h … 4h + 3]
    std::memcpy(c, acc, sizeof c);
#pragma GCC unroll 16
    for (int p = 0; p < T::BK; ++p) {
        emu_f4 b[T::TN / 4];
        for (int h = 0; h < T::TN / 4; ++h) b[h] = emu_ld4(bs + p * T::BN + tile_col<T>(tx, 4 * h));
        for (int g = 0; g < T::TM / 4; ++g) {
            const emu_f4 a = emu_ld4(as + p * T::BM + tile_row<T>(ty, 4 * g));
            for (int r = 0; r < 4; ++r) {
                const emu_f4 ar = {a[r], a[r], a[r], a[r]};
                for (int h = 0; h < T::TN / 4; ++h) c[4 * g + r][h] = emu_fma4(ar, b[h], c[4 * g + r][h]);
            }
        }
    }
    std::memcpy(acc, c, sizeof c);
}
#else
// The thread's A and B fragments of step p of a stage: 16-byte shared loads.
template <class T>
__device__ __forceinline__ void fragments(const float* as, const float* bs, int p, int tx, int ty, float a[T::TM],
                                          float b[T::TN]) {
#pragma unroll
    for (int g = 0; g < T::TM / 4; ++g) ld4(as + p * T::BM + tile_row<T>(ty, 4 * g), a + 4 * g);
#pragma unroll
    for (int h = 0; h < T::TN / 4; ++h) ld4(bs + p * T::BN + tile_col<T>(tx, 4 * h), b + 4 * h);
}

// acc += the thread's share of one stage, p ascending; the fragments of p + 1 load while the FMAs
// of p run (two fragment buffers).
template <class T>
__device__ __forceinline__ void multiply_stage(const float* as, const float* bs, int tx, int ty,
                                               float (&acc)[T::TM][T::TN]) {
    float a[2][T::TM], b[2][T::TN];
    fragments<T>(as, bs, 0, tx, ty, a[0], b[0]);
#pragma unroll
    for (int p = 0; p < T::BK; ++p) {
        if (p + 1 < T::BK) fragments<T>(as, bs, p + 1, tx, ty, a[(p + 1) & 1], b[(p + 1) & 1]);
#pragma unroll
        for (int i = 0; i < T::TM; ++i) {
#pragma unroll
            for (int j = 0; j < T::TN; ++j) acc[i][j] = fma_rn(a[p & 1][i], b[p & 1][j], acc[i][j]);
        }
    }
}
#endif

// Work item `tile` of the GEMM by one block (blockDim.x == T::THREADS). Split-K makes the splits
// an outer batch: the item is a tile of entry e (tile_coords over batch·splits entries), of batch
// entry e mod batch over split e / batch's k range, and entry e of the partials (laid out split
// by split) is where it goes, without bias; with g.splits == 1 that is the tile of C itself,
// through the epilogue. The copies run STAGES − 1 k-tiles ahead of the multiply, one commit group
// per k-tile (empty ones past the last, so that the wait depth stays STAGES − 2).
template <class T, bool AT, bool BT, class Epi>
__device__ __forceinline__ void gemm_tile(const Gemm& g, int64_t tile, float* smem, const Epi& epi) {
    int64_t entry, tm, tn;
    tile_coords(tile, cdiv(g.m, T::BM), cdiv(g.n, T::BN), entry, tm, tn);
    const int64_t i0 = tm * T::BM, j0 = tn * T::BN;
    const int64_t split = entry / g.batch, bt = entry - split * g.batch;
    const KRange kr = split_range(g.k, g.splits, split);
    const int tid = static_cast<int>(threadIdx.x);
    Loader<T, T::BM, !AT> la;
    Loader<T, T::BN, BT> lb;
    la.init(operand(g.a + bt * g.m * g.k + (AT ? kr.k0 * g.m : kr.k0), AT ? g.m : g.k, g.m), i0, tid);
    lb.init(operand(g.b + bt * g.k * g.n + (BT ? kr.k0 : kr.k0 * g.n), BT ? g.k : g.n, g.n), j0, tid);
    const int tx = thread_x<T>(tid), ty = thread_y<T>(tid);
    float acc[T::TM][T::TN];
#pragma unroll
    for (int i = 0; i < T::TM; ++i) {
#pragma unroll
        for (int j = 0; j < T::TN; ++j) acc[i][j] = 0.0f;
    }

    const int64_t ktiles = cdiv(kr.len, T::BK);
    int64_t issued = 0;
    const auto copy_next = [&](int stage) {
        if (issued < ktiles) {
            const int64_t kleft = kr.len - issued * T::BK;
            float* const s = smem + stage * T::STAGE;
            la.copy(s, kleft < T::BK ? static_cast<int>(kleft) : T::BK);
            lb.copy(s + T::A_STAGE, kleft < T::BK ? static_cast<int>(kleft) : T::BK);
            ++issued;
        }
        commit_async();
    };
#pragma unroll
    for (int s = 0; s < T::STAGES - 1; ++s) copy_next(s);
    int read = 0, write = T::STAGES - 1;
    for (int64_t t = 0; t < ktiles; ++t) {
        wait_async<T::STAGES - 2>();
        // k-tile t is in shared memory, and every thread is done with k-tile t − 1, whose stage
        // the next copies overwrite.
        __syncthreads();
        copy_next(write);
        multiply_stage<T>(smem + read * T::STAGE, smem + read * T::STAGE + T::A_STAGE, tx, ty, acc);
        read = read + 1 == T::STAGES ? 0 : read + 1;
        write = write + 1 == T::STAGES ? 0 : write + 1;
    }
    __syncthreads();  // every thread is done with the stages before the next item's copies

    const bool whole = g.splits == 1;
    float* const c = (whole ? g.c : g.partial) + entry * g.m * g.n;
    store_outputs<T>(c, g.m, g.n, aligned16(c) && g.n % 4 == 0, i0, j0, tx, ty, acc, whole ? epi : epi.without_bias());
}

#endif

// -- GEMV: linear's forward for few rows ------------------------------------------------------------

// A GEMV tile: each lane keeps ROWS × COLS FMA chains (rows of x × output columns): each 16-byte
// chunk of w feeds ROWS rows and each of x COLS columns. Gemv8 fits 64 registers (four blocks of
// 256 threads per multiprocessor), Gemv16 128 (two), on sm_80 and sm_90 without spilling (8 × 3
// spills at 64, 16 × 4 at 128 on sm_80). The plan (capsule_core/plans/linalg.py) holds the same
// numbers.
template <int ROWS_, int COLS_>
struct GemvTile {
    static constexpr int ROWS = ROWS_, COLS = COLS_;
};

using Gemv8 = GemvTile<8, 2>;
using Gemv16 = GemvTile<16, 3>;
constexpr int GEMV_THREADS = 256;  // threads per block at most

// acc += x·w over one chunk, element order.
CAPSULE_HD float dot4(const float x[4], const float w[4], float acc) {
    acc = fma_rn(x[0], w[0], acc);
    acc = fma_rn(x[1], w[1], acc);
    acc = fma_rn(x[2], w[2], acc);
    return fma_rn(x[3], w[3], acc);
}

// -- mse_loss ---------------------------------------------------------------------------------------

// pred − target in double: exact for two floats (barring a 2^29 exponent gap); squares and
// their sums in double do not overflow where the mean does not.
CAPSULE_HD double mse_diff(float p, float t) { return static_cast<double>(p) - static_cast<double>(t); }

// s + (pred − target)², one rounding.
CAPSULE_HD double mse_accumulate(double s, float p, float t) {
    const double d = mse_diff(p, t);
    return fma_rn(d, d, s);
}

// Thread tid's share of the squared differences over [lo, hi): float4 pairs lo + 4·tid,
// lo + 4·(tid + threads), ... into one accumulator per lane of the float4 (vec: both inputs
// 16-byte aligned and lo a multiple of 4), then the scalar rest.
CAPSULE_HD double mse_thread_sum(const float* pred, const float* target, int64_t lo, int64_t hi, int tid, int threads,
                                 bool vec) {
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t rest = lo;
    if (vec) {
        rest = lo + (hi - lo) / 4 * 4;
#pragma unroll 4
        for (int64_t v = lo + 4 * static_cast<int64_t>(tid); v < rest; v += 4 * static_cast<int64_t>(threads)) {
            float p[4], t[4];
            ldg4(pred + v, p);
            ldg4(target + v, t);
#pragma unroll
            for (int x = 0; x < 4; ++x) s[x] = mse_accumulate(s[x], p[x], t[x]);
        }
    }
    for (int64_t i = rest + tid; i < hi; i += threads) s[0] = mse_accumulate(s[0], ldg(pred + i), ldg(target + i));
    return (s[0] + s[1]) + (s[2] + s[3]);
}

// mean = sum / n, rounded once to float.
CAPSULE_HD float mse_mean(double sum, int64_t n) { return static_cast<float>(sum / static_cast<double>(n)); }

// g · (2/n): 2/n rounded to float first, as the spec's formula 2(pred − target)·g/n is evaluated.
CAPSULE_HD float mse_grad_scale(float g, int64_t n) {
    return mul_rn(g, static_cast<float>(2.0 / static_cast<double>(n)));
}

// dpred = (pred − target) · scale; dtarget is its negation (exact).
CAPSULE_HD float mse_grad(float p, float t, float scale) { return mul_rn(sub_rn(p, t), scale); }

// -- linear's bias gradient: column sums over row chunks --------------------------------------------

// Σ g[r][j] over rows r ≡ r0 + phase (mod phases) in [r0, r1): four interleaved accumulators
// (four loads in flight), added pairwise at the end.
CAPSULE_HD float column_partial(const float* g, int64_t cols, int64_t r0, int64_t r1, int64_t j, int phase, int phases) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    const int64_t step = phases;
    int64_t r = r0 + phase;
    for (; r + 3 * step < r1; r += 4 * step) {
        s0 = add_rn(s0, ldg(g + r * cols + j));
        s1 = add_rn(s1, ldg(g + (r + step) * cols + j));
        s2 = add_rn(s2, ldg(g + (r + 2 * step) * cols + j));
        s3 = add_rn(s3, ldg(g + (r + 3 * step) * cols + j));
    }
    for (; r < r1; r += step) s0 = add_rn(s0, ldg(g + r * cols + j));
    return add_rn(add_rn(s0, s1), add_rn(s2, s3));
}

// How many row chunks the column sums produce: at least one, so that zero rows give zeros.
CAPSULE_HD int64_t column_chunks(int64_t rows, int64_t row_chunk) {
    const int64_t c = cdiv(rows, row_chunk < 1 ? 1 : row_chunk);
    return c < 1 ? 1 : c;
}

}  // namespace capsule_la
