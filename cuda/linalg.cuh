// The linalg family's per-thread code (spec "Linear algebra and losses"), __host__ __device__ so
// that the tests run it on the host: the SGEMM core behind matmul and linear, mse_loss's terms and
// reduction steps, and linear's bias gradient (column sums). Plain float32 FMA, no tensor cores.
//
// SGEMM core: C = op(A)·op(B) per batch entry, C (m×n) row-major, contraction length k.
// A block computes one BM×BN tile of C: each k-tile of BK = 8 is staged in shared memory, k-major
// (as[p][i], bs[p][j]), double-buffered (the global loads of k-tile t+1 are in flight while
// tile t is multiplied); each thread keeps a TM×TN micro-tile of accumulators in registers and
// reads its A and B fragments as 16-byte shared loads. Elements beyond m, n or k load as zeros,
// so the inner product loop has no bounds tests. Every output is a sequential FMA chain over
// p = 0, 1, ..., k-1 (then zero terms): deterministic, and the same bits for any grid and either
// tile shape. Split-K: a block may take one of `splits` ranges of whole k-tiles instead (its FMA
// chain runs over that range only) and write its partial tile to a workspace; a second launch
// adds the partials in split order (split_sum). The bits then depend on the split count, which
// the plan derives from the shape alone, never on the grid.
//
// GEMV (linear's forward for at most 16 rows): w is stored out×in, so each output column's
// weights are contiguous along k. A warp takes a few columns (GemvTile) and one of k_warps
// interleaved slices of k; each lane reads 16-byte chunks of the columns (and of x's rows) and
// keeps a sequential FMA chain per output over its chunks; then a butterfly over the lanes, the
// k_warps slices added in order, and the bias.
#pragma once

#include <cmath>
#include <cstdint>

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
// TX·4 apart (tile_row, tile_col). Shared rows are padded by 4 floats: the transposing stores
// of k-contiguous operands then hit distinct banks, and rows stay 16-byte aligned. UNROLL: how
// many k-steps of the multiply are unrolled (an 8×8 micro-tile keeps its fragments to one step
// so that 256 threads fit 128 registers, two blocks per multiprocessor, without spilling).
template <int BM_, int BN_, int TM_, int TN_, int UNROLL_>
struct GemmTile {
    static constexpr int BM = BM_, BN = BN_, BK = 8, TM = TM_, TN = TN_, UNROLL = UNROLL_;
    static constexpr int TX = BN / TN, TY = BM / TM, THREADS = TX * TY;
    static constexpr int LDA = BM + 4, LDB = BN + 4;
    static constexpr int A_STAGE = BK * LDA, B_STAGE = BK * LDB;
    static constexpr int SMEM_FLOATS = 2 * (A_STAGE + B_STAGE);
    static constexpr int A_CHUNKS = BM * BK / 4 / THREADS, B_CHUNKS = BN * BK / 4 / THREADS;
    static_assert(TM % 4 == 0 && TN % 4 == 0 && TX % 8 == 0 && TY % 4 == 0, "whole 8x4 warps, 4-wide fragments");
    static_assert(A_CHUNKS >= 1 && A_CHUNKS * THREADS * 4 == BM * BK, "A k-tile splits into whole float4 chunks");
    static_assert(B_CHUNKS >= 1 && B_CHUNKS * THREADS * 4 == BN * BK, "B k-tile splits into whole float4 chunks");
};

using BigTile = GemmTile<128, 128, 8, 8, 1>;   // 256 threads: large problems
using SmallTile = GemmTile<64, 64, 8, 4, 8>;   // 128 threads: four times the blocks, for small grids

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

// One operand of a tile: its base (this batch entry), leading dimension, free extent (m for A,
// n for B) and whether 16-byte loads are legal (aligned base, leading dimension a multiple of 4).
struct Operand {
    const float* p;
    int64_t ld, ext;
    bool vec;
};

CAPSULE_HD Operand operand(const float* base, int64_t ld, int64_t ext) {
    return Operand{base, ld, ext, aligned16(base) && ld % 4 == 0};
}

// A thread's chunk q (of BK·E/4) of every k-tile: 4 consecutive elements along the operand's
// contiguous axis. K-contiguous operands (A, or B stored transposed) hold element (e, p) at
// p[e·ld + p] and the chunk runs along p; the others hold it at p[p·ld + e] and the chunk runs
// along e. Set up once per tile (what does not change along k), then advanced k-tile by k-tile.
template <int E, int BK, bool KCONTIG>
struct Chunk {
    const float* src;  // the chunk's first element in the current k-tile
    int kpos;          // its offset along k within a k-tile
    int live;          // K-contiguous: 1 when its row e is inside; otherwise bit x: e + x inside
    bool vec;          // 16-byte loads legal once the k-tile covers the chunk

    CAPSULE_HD void init(const Operand& op, int64_t e0, int q) {
        if (KCONTIG) {
            const int64_t e = e0 + q / (BK / 4);
            kpos = (q % (BK / 4)) * 4;
            live = e < op.ext ? 1 : 0;
            src = op.p + (live ? e * op.ld + kpos : 0);
            vec = op.vec && live;
        } else {
            const int64_t e = e0 + (q % (E / 4)) * 4;
            kpos = q / (E / 4);
            live = 0;
            for (int x = 0; x < 4; ++x) live |= (e + x < op.ext ? 1 : 0) << x;
            src = op.p + (live ? kpos * op.ld + e : 0);
            vec = op.vec && live == 15;
        }
    }

    // The chunk of a k-tile holding kl ≥ 1 elements along k (BK but in the last k-tile).
    CAPSULE_HD void load(int kl, float v[4]) const {
        if (KCONTIG) {
            if (vec && kpos + 4 <= kl) {
                ldg4(src, v);
            } else {
                for (int x = 0; x < 4; ++x) v[x] = live && kpos + x < kl ? ldg(src + x) : 0.0f;
            }
        } else if (kpos < kl) {
            if (vec) {
                ldg4(src, v);
            } else {
                for (int x = 0; x < 4; ++x) v[x] = (live >> x) & 1 ? ldg(src + x) : 0.0f;
            }
        } else {
            for (int x = 0; x < 4; ++x) v[x] = 0.0f;
        }
    }

    // To the next k-tile: BK along the row, or BK rows down.
    CAPSULE_HD void advance(int64_t ld) {
        if (live) src += KCONTIG ? BK : BK * ld;
    }
};

// Chunk q into the k-major shared tile s (row pitch LD): transposed by 4 scalar stores for
// k-contiguous operands, one 16-byte store otherwise.
template <int E, int LD, int BK, bool KCONTIG>
CAPSULE_HD void store_chunk(float* s, int q, const float v[4]) {
    if (KCONTIG) {
        const int e = q / (BK / 4), p = (q % (BK / 4)) * 4;
        for (int x = 0; x < 4; ++x) s[(p + x) * LD + e] = v[x];
    } else {
        const int p = q / (E / 4), e = (q % (E / 4)) * 4;
        st4(s + p * LD + e, v);
    }
}

// Per-thread state: the accumulators, the chunk cursors and the staged chunks of a k-tile.
template <class T, bool AT, bool BT>
struct GemmRegs {
    float acc[T::TM][T::TN];
    Chunk<T::BM, T::BK, !AT> ca[T::A_CHUNKS];
    Chunk<T::BN, T::BK, BT> cb[T::B_CHUNKS];
    float a[T::A_CHUNKS][4];
    float b[T::B_CHUNKS][4];

    CAPSULE_HD void init(const Operand& oa, const Operand& ob, int64_t i0, int64_t j0, int tid) {
#pragma unroll
        for (int i = 0; i < T::TM; ++i) {
#pragma unroll
            for (int j = 0; j < T::TN; ++j) acc[i][j] = 0.0f;
        }
#pragma unroll
        for (int c = 0; c < T::A_CHUNKS; ++c) ca[c].init(oa, i0, tid + c * T::THREADS);
#pragma unroll
        for (int c = 0; c < T::B_CHUNKS; ++c) cb[c].init(ob, j0, tid + c * T::THREADS);
    }

    // The k-tile with kleft > 0 elements of k from its start on.
    CAPSULE_HD void load(int64_t kleft) {
        const int kl = kleft < T::BK ? static_cast<int>(kleft) : T::BK;
#pragma unroll
        for (int c = 0; c < T::A_CHUNKS; ++c) ca[c].load(kl, a[c]);
#pragma unroll
        for (int c = 0; c < T::B_CHUNKS; ++c) cb[c].load(kl, b[c]);
    }

    CAPSULE_HD void advance(int64_t lda, int64_t ldb) {
#pragma unroll
        for (int c = 0; c < T::A_CHUNKS; ++c) ca[c].advance(lda);
#pragma unroll
        for (int c = 0; c < T::B_CHUNKS; ++c) cb[c].advance(ldb);
    }

    CAPSULE_HD void store(float* as, float* bs, int tid) const {
#pragma unroll
        for (int c = 0; c < T::A_CHUNKS; ++c) store_chunk<T::BM, T::LDA, T::BK, !AT>(as, tid + c * T::THREADS, a[c]);
#pragma unroll
        for (int c = 0; c < T::B_CHUNKS; ++c) store_chunk<T::BN, T::LDB, T::BK, BT>(bs, tid + c * T::THREADS, b[c]);
    }
};

// acc += the thread's share of one staged k-tile, p ascending.
template <class T>
CAPSULE_HD void multiply_stage(const float* as, const float* bs, int tx, int ty, float acc[T::TM][T::TN]) {
#pragma unroll(T::UNROLL)
    for (int p = 0; p < T::BK; ++p) {
        float a[T::TM], b[T::TN];
#pragma unroll
        for (int g = 0; g < T::TM / 4; ++g) ld4(as + p * T::LDA + tile_row<T>(ty, 4 * g), a + 4 * g);
#pragma unroll
        for (int h = 0; h < T::TN / 4; ++h) ld4(bs + p * T::LDB + tile_col<T>(tx, 4 * h), b + 4 * h);
#pragma unroll
        for (int i = 0; i < T::TM; ++i) {
#pragma unroll
            for (int j = 0; j < T::TN; ++j) acc[i][j] = fma_rn(a[i], b[j], acc[i][j]);
        }
    }
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

// The threads of a block as the device runs them: each thread is its own single slot.
struct DeviceThreads {
    static constexpr int kSlots = 1;
    CAPSULE_HD int tid(int) const {
#if defined(__CUDA_ARCH__)
        return static_cast<int>(threadIdx.x);
#else
        return 0;
#endif
    }
    CAPSULE_HD void sync() const {
#if defined(__CUDA_ARCH__)
        __syncthreads();
#endif
    }
};

// The k range [k0, k0 + len) of split s of `splits` (≥ 1): whole k-tiles of BK, the first
// splits taking ⌈tiles / splits⌉ each (a split past the end is empty: its partial is zeros).
struct KRange {
    int64_t k0, len;
};

template <int BK>
CAPSULE_HD KRange split_range(int64_t k, int64_t splits, int64_t s) {
    const int64_t per = cdiv(cdiv(k, BK), splits < 1 ? 1 : splits) * BK;
    const int64_t k0 = min64(k, s * per);
    return KRange{k0, min64(k - k0, per)};
}

// Work item `tile` of the GEMM by one block. Split-K makes the splits an outer batch: the item is
// a tile of entry e (tile_coords over batch·splits entries), of batch entry e mod batch over
// split e / batch's k range, and entry e of the partials (laid out split by split) is where it
// goes, without bias; with g.splits == 1 that is the tile of C itself, through the epilogue.
// `Threads` runs the block's threads: on the device each thread runs itself (one slot); the
// host harness runs all T::THREADS slots one after the other between barriers, each to the next
// barrier, so a shared-memory race shows there too.
template <class T, bool AT, bool BT, class Threads, class Epi>
CAPSULE_HD void gemm_tile(const Threads& threads, const Gemm& g, int64_t tile, float* smem, GemmRegs<T, AT, BT>* regs,
                          const Epi& epi) {
    int64_t entry, tm, tn;
    tile_coords(tile, cdiv(g.m, T::BM), cdiv(g.n, T::BN), entry, tm, tn);
    const int64_t i0 = tm * T::BM, j0 = tn * T::BN;
    const int64_t split = entry / g.batch, bt = entry - split * g.batch;
    const KRange kr = split_range<T::BK>(g.k, g.splits, split);
    const Operand a = operand(g.a + bt * g.m * g.k + (AT ? kr.k0 * g.m : kr.k0), AT ? g.m : g.k, g.m);
    const Operand b = operand(g.b + bt * g.k * g.n + (BT ? kr.k0 : kr.k0 * g.n), BT ? g.k : g.n, g.n);
    float* const as = smem;
    float* const bs = smem + 2 * T::A_STAGE;

    for (int s = 0; s < Threads::kSlots; ++s) {
        regs[s].init(a, b, i0, j0, threads.tid(s));
        if (kr.len > 0) {
            regs[s].load(kr.len);
            regs[s].store(as, bs, threads.tid(s));
        }
    }
    threads.sync();
    int cur = 0;
    for (int64_t kleft = kr.len; kleft > 0; kleft -= T::BK) {
        const bool more = kleft > T::BK;
        for (int s = 0; s < Threads::kSlots; ++s) {
            const int tid = threads.tid(s);
            if (more) {
                regs[s].advance(a.ld, b.ld);
                regs[s].load(kleft - T::BK);
            }
            multiply_stage<T>(as + cur * T::A_STAGE, bs + cur * T::B_STAGE, thread_x<T>(tid), thread_y<T>(tid), regs[s].acc);
            if (more) regs[s].store(as + (cur ^ 1) * T::A_STAGE, bs + (cur ^ 1) * T::B_STAGE, tid);
        }
        cur ^= 1;
        threads.sync();
    }
    const bool whole = g.splits == 1;
    float* const c = (whole ? g.c : g.partial) + entry * g.m * g.n;
    const bool cvec = aligned16(c) && g.n % 4 == 0;
    const Epi e = whole ? epi : epi.without_bias();
    for (int s = 0; s < Threads::kSlots; ++s) {
        const int tid = threads.tid(s);
        store_outputs<T>(c, g.m, g.n, cvec, i0, j0, thread_x<T>(tid), thread_y<T>(tid), regs[s].acc, e);
    }
}

// Element e of the sum of `splits` partials of `count` elements each, split 0 first.
CAPSULE_HD float split_sum(const float* partial, int64_t count, int64_t splits, int64_t e) {
    float s = ldg(partial + e);
    for (int64_t k = 1; k < splits; ++k) s = add_rn(s, ldg(partial + k * count + e));
    return s;
}

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
