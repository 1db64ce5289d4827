// Row normalisation (softmax, log_softmax, hard_masked_softmax): the per-element math and the
// choice of kernel path, shared by cuda/softmax.cu and its host tests.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.cuh"

// Threads per block of every kernel of the family (the plans launch exactly this many).
constexpr int CAPSULE_SOFTMAX_THREADS = 256;
// Blocks per multiprocessor the lean kernels (block and split paths) are built for: 8 blocks of
// 256 threads, the whole multiprocessor (so at most 32 registers). The group kernels hold rows in
// registers and are built for 4.
constexpr int CAPSULE_SOFTMAX_LEAN_BLOCKS = 8;
constexpr int CAPSULE_SOFTMAX_GROUP_BLOCKS = 4;

// Which formula a row kernel applies.
enum CapsuleRowOp { CAPSULE_SOFTMAX = 0, CAPSULE_LOG_SOFTMAX = 1, CAPSULE_MASKED_SOFTMAX = 2 };

// Rows up to this many columns are held in registers by a group of lanes (one group per row);
// longer rows take a whole block each.
constexpr int64_t CAPSULE_SOFTMAX_GROUP_COLS = 1024;
// The backward holds y and g: half as many columns keep its registers at the forward's count.
constexpr int64_t CAPSULE_SOFTMAX_GRAD_GROUP_COLS = 512;

// Lanes per row on the group path: the smallest power of two >= cols, at most 32.
CAPSULE_HD int capsule_softmax_lanes(int64_t cols) {
    int lanes = 1;
    while (lanes < 32 && lanes < cols) lanes *= 2;
    return lanes;
}

// Values per lane on the group path: a power of two with lanes * values >= cols.
CAPSULE_HD int capsule_softmax_values(int64_t cols) {
    const int lanes = capsule_softmax_lanes(cols);
    int values = 1;
    while (static_cast<int64_t>(lanes) * values < cols) values *= 2;
    return values;
}

// Rows a lane group takes at a time on the group path: 8 / values for up to 4 values per lane
// (so that every lane has at least 8 loads in flight), else 1.
CAPSULE_HD int capsule_softmax_batch(int64_t cols) {
    const int values = capsule_softmax_values(cols);
    return values <= 4 ? 8 / values : 1;
}

// The row maximum that propagates NaN (fmaxf would drop it): NaN in, NaN out, as numpy's max.
CAPSULE_HD float capsule_nanmax(float a, float b) { return (a > b || a != a) ? a : b; }

// hard_masked_softmax: an entry takes part iff mask != 0 (NaN counts as nonzero); a blocked
// entry becomes -inf, so its x (even NaN or +inf) never reaches the max, the sum or the result.
CAPSULE_HD float capsule_masked_score(float x, float mask) { return mask != 0.0f ? x : -INFINITY; }

// The shift subtracted before exp: the row maximum, except that a masked row with no allowed
// finite score (maximum -inf) is shifted by 0 so that its entries give exp(-inf) = 0, not NaN.
CAPSULE_HD float capsule_row_shift(int op, float row_max) {
    return (op == CAPSULE_MASKED_SOFTMAX && row_max == -INFINITY) ? 0.0f : row_max;
}

// The denominator: the row's sum of exp, except 1 for such a dead masked row (all zeros out).
CAPSULE_HD float capsule_row_denominator(int op, float row_max, float sum) {
    return (op == CAPSULE_MASKED_SOFTMAX && row_max == -INFINITY) ? 1.0f : sum;
}

// The split-row path (few long rows): each row is cut into chunks of `chunk` columns (the last
// one shorter); chunk <= 0 or chunk >= cols is one chunk of the whole row.
CAPSULE_HD int64_t capsule_softmax_chunks(int64_t cols, int64_t chunk) {
    return (chunk <= 0 || chunk >= cols) ? 1 : (cols + chunk - 1) / chunk;
}

// Segment q = row * chunks + c of the split rows: its first element and its length.
struct CapsuleRowSegment {
    int64_t row;
    int64_t start;
    int64_t length;
};

CAPSULE_HD CapsuleRowSegment capsule_softmax_segment(int64_t q, int64_t cols, int64_t chunk, int64_t chunks) {
    if (chunks == 1) return {q, q * cols, cols};
    const int64_t row = q / chunks;
    const int64_t c = q - row * chunks;
    const int64_t rest = cols - c * chunk;
    return {row, row * cols + c * chunk, rest < chunk ? rest : chunk};
}

// The shift a chunk's partial sum of exp is taken at: the chunk's maximum, or 0 when that is -inf
// (every entry -inf or blocked: the partial sum is then 0, not the NaN of exp(-inf - -inf)).
CAPSULE_HD float capsule_chunk_shift(float chunk_max) { return chunk_max == -INFINITY ? 0.0f : chunk_max; }

// A chunk's partial sum of exp(x - chunk shift) carried to the row's shift: s_c * exp(m_c - shift).
// A chunk of -inf (s_c = 0) adds exp(-inf - shift) * 0: 0, or NaN where the row's shift is -inf
// too, exactly as its terms exp(-inf - shift) would in one pass over the row.
CAPSULE_HD float capsule_chunk_rescaled(float chunk_sum, float chunk_max, float shift) {
    return chunk_sum * expf(chunk_max - shift);
}

// z = x - m: the shifted score.
CAPSULE_HD float capsule_shifted(float score, float shift) { return score - shift; }

// One term of the row sum, e = exp(x - m).
CAPSULE_HD float capsule_exp_term(float score, float shift) { return expf(capsule_shifted(score, shift)); }

// y of softmax and hard_masked_softmax from e and the denominator: e / s.
CAPSULE_HD float capsule_softmax_from_exp(float e, float denominator) { return e / denominator; }

// y of log_softmax from z and ln s (computed once per row): z - ln s.
CAPSULE_HD float capsule_log_softmax_from_shifted(float z, float log_sum) { return z - log_sum; }

// The row value of op from a score (masked already), the shift and the denominator (log_softmax:
// ln of the row sum): the kernels compute exactly this, some holding e or z in between.
CAPSULE_HD float capsule_row_value(int op, float score, float shift, float denominator_or_log_sum) {
    if (op == CAPSULE_LOG_SOFTMAX) return capsule_log_softmax_from_shifted(capsule_shifted(score, shift), denominator_or_log_sum);
    return capsule_softmax_from_exp(capsule_exp_term(score, shift), denominator_or_log_sum);
}

// Backward, softmax and hard_masked_softmax: dx = y (g - sum g y); 0 where y is 0 (blocked).
CAPSULE_HD float capsule_softmax_grad(float y, float g, float dot) { return y * (g - dot); }

// Backward, log_softmax: dx = g - exp(y) sum g.
CAPSULE_HD float capsule_log_softmax_grad(float y, float g, float g_sum) { return g - expf(y) * g_sum; }

// The row reduction the backward needs: g*y (softmax, masked) or g (log_softmax).
CAPSULE_HD float capsule_grad_term(int op, float y, float g) { return op == CAPSULE_LOG_SOFTMAX ? g : g * y; }

CAPSULE_HD float capsule_row_grad(int op, float y, float g, float reduced) {
    return op == CAPSULE_LOG_SOFTMAX ? capsule_log_softmax_grad(y, g, reduced) : capsule_softmax_grad(y, g, reduced);
}

// A row at address `addr` (bytes, 4-aligned) split for 16-byte accesses: `head` scalar elements
// up to the first 16-byte boundary, `body4` float4s, then a scalar tail from head + 4 * body4.
// `vector` false (the buffers' rows are not equally aligned) makes the whole row the head.
struct CapsuleRowSplit {
    int64_t head;
    int64_t body4;
};

CAPSULE_HD CapsuleRowSplit capsule_row_split(uint64_t addr, int64_t len, bool vector) {
    if (!vector || (addr & 3u) != 0) return {len, 0};
    int64_t head = static_cast<int64_t>(((16u - (addr & 15u)) & 15u) >> 2);
    if (head > len) head = len;
    return {head, (len - head) / 4};
}
