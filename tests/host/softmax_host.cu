// Host harness of cuda/softmax.cuh: the per-element formulas of the three row ops applied row by
// row (sequential max and sums), the path choice and the row split, callable from ctypes.
#include "softmax.cuh"

extern "C" void host_softmax_rows(int op, const float* x, const float* mask, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) {
            const float score = op == CAPSULE_MASKED_SOFTMAX ? capsule_masked_score(xr[c], mask[r * cols + c]) : xr[c];
            m = capsule_nanmax(m, score);
        }
        const float shift = capsule_row_shift(op, m);
        float s = 0.0f;
        for (int64_t c = 0; c < cols; ++c) {
            const float score = op == CAPSULE_MASKED_SOFTMAX ? capsule_masked_score(xr[c], mask[r * cols + c]) : xr[c];
            s += capsule_exp_term(score, shift);
        }
        const float d = op == CAPSULE_LOG_SOFTMAX ? logf(s) : capsule_row_denominator(op, m, s);
        for (int64_t c = 0; c < cols; ++c) {
            const float score = op == CAPSULE_MASKED_SOFTMAX ? capsule_masked_score(xr[c], mask[r * cols + c]) : xr[c];
            y[r * cols + c] = capsule_row_value(op, score, shift, d);
        }
    }
}

extern "C" void host_softmax_grad_rows(int op, const float* y, const float* g, float* dx, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float reduced = 0.0f;
        for (int64_t c = 0; c < cols; ++c) reduced += capsule_grad_term(op, y[r * cols + c], g[r * cols + c]);
        for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = capsule_row_grad(op, y[r * cols + c], g[r * cols + c], reduced);
    }
}

// The group path's shape for cols: lanes, values per lane and rows at a time, or 0s for the block path.
extern "C" void host_softmax_path(int64_t cols, int64_t group_cols, int* lanes, int* values, int* batch) {
    *lanes = cols > group_cols ? 0 : capsule_softmax_lanes(cols);
    *values = cols > group_cols ? 0 : capsule_softmax_values(cols);
    *batch = cols > group_cols ? 0 : capsule_softmax_batch(cols);
}

extern "C" int64_t host_softmax_group_cols(int backward) {
    return backward ? CAPSULE_SOFTMAX_GRAD_GROUP_COLS : CAPSULE_SOFTMAX_GROUP_COLS;
}

extern "C" int host_softmax_threads() { return CAPSULE_SOFTMAX_THREADS; }

extern "C" void host_row_split(uint64_t addr, int64_t len, int vector, int64_t* out) {
    const CapsuleRowSplit split = capsule_row_split(addr, len, vector != 0);
    out[0] = split.head;
    out[1] = split.body4;
}
