// Host harness of cuda/pointwise.cuh: host_<op>_fwd / host_<op>_bwd take the parameter lists the
// registry declares for capsule_<op>_fwd / _bwd and apply the same per-element functions.
#include "pointwise.cuh"

#define HOST_UNARY(op)                                                                            \
    extern "C" void host_##op##_fwd(const float* x, float* y, int64_t n) {                       \
        for (int64_t i = 0; i < n; ++i) y[i] = capsule_##op##_f(x[i]);                          \
    }                                                                                             \
    extern "C" void host_##op##_bwd(const float* x, const float* g, float* dx, int64_t n) {      \
        for (int64_t i = 0; i < n; ++i) dx[i] = capsule_##op##_df(x[i], g[i]);                  \
    }

#define HOST_BINARY(op)                                                                                         \
    extern "C" void host_##op##_fwd(const float* x, const float* y, float* out, int64_t n) {                   \
        for (int64_t i = 0; i < n; ++i) out[i] = capsule_##op##_f(x[i], y[i]);                                \
    }                                                                                                           \
    extern "C" void host_##op##_bwd(const float* x, const float* y, const float* g, float* dx, float* dy, int64_t n) { \
        for (int64_t i = 0; i < n; ++i) capsule_##op##_df(x[i], y[i], g[i], dx[i], dy[i]);                   \
    }

HOST_UNARY(relu)
HOST_UNARY(gelu)
HOST_UNARY(abs)
HOST_UNARY(sqrt)
HOST_UNARY(sigmoid)
HOST_UNARY(tanh)
HOST_UNARY(softplus)
HOST_UNARY(exp)
HOST_UNARY(sin)
HOST_UNARY(cos)
HOST_UNARY(log)
HOST_UNARY(inv)

HOST_BINARY(add)
HOST_BINARY(sub)
HOST_BINARY(mul)
HOST_BINARY(max)
HOST_BINARY(min)

extern "C" void host_scale_fwd(const float* x, float* y, float c, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = capsule_scale_f(x[i], c);
}

extern "C" void host_scale_bwd(const float* g, float* dx, float c, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dx[i] = capsule_scale_df(g[i], c);
}

extern "C" void host_clamp_fwd(const float* x, float* y, float lo, float hi, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = capsule_clamp_f(x[i], lo, hi);
}

extern "C" void host_clamp_bwd(const float* x, const float* g, float* dx, float lo, float hi, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dx[i] = capsule_clamp_df(x[i], g[i], lo, hi);
}

extern "C" void host_safe_log_fwd(const float* x, float* y, float eps, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = capsule_safe_log_f(x[i], eps);
}

extern "C" void host_safe_log_bwd(const float* x, const float* g, float* dx, float eps, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dx[i] = capsule_safe_log_df(x[i], g[i], eps);
}
