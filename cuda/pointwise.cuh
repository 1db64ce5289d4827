// Per-element math of the pointwise family (spec "Pointwise"): forward capsule_<op>_f and
// backward capsule_<op>_df, __host__ __device__ so that the tests run them on the host.
// Every rounding is an explicit correctly rounded operation (add_rn, mul_rn, ... from common.cuh),
// so the compiler cannot contract them into FMAs differently on different architectures.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.cuh"

namespace capsule_pw {

using capsule::add_rn;
using capsule::div_rn;
using capsule::mul_rn;
using capsule::rcp_rn;
using capsule::sqrt_rn;
using capsule::sub_rn;

CAPSULE_HD bool is_nan(float a) { return a != a; }

CAPSULE_HD bool negative(float a) { return copysignf(1.0f, a) < 0.0f; }

// Selections of fmax / fmin with -0 < +0 (IEEE 754-2019 maximumNumber / minimumNumber):
// written out rather than fmaxf/fminf, whose signed-zero order the C and PTX specs leave open.
CAPSULE_HD bool max_picks_x(float x, float y) { return x > y || is_nan(y) || (x == y && !negative(x)); }

CAPSULE_HD bool min_picks_x(float x, float y) { return x < y || is_nan(y) || (x == y && negative(x)); }

// Stable logistic pieces of e = exp(-|x|): sigmoid(|x|) = 1/(1 + e), sigmoid(-|x|) = e/(1 + e);
// e never overflows, so both are finite (never NaN) for every non-NaN x.
CAPSULE_HD float sigmoid(float x) {
    const float e = expf(-fabsf(x));
    const float d = add_rn(1.0f, e);
    return x >= 0.0f ? div_rn(1.0f, d) : div_rn(e, d);
}

// sigmoid'(x) = sigmoid(x)·sigmoid(-x) = sigmoid(|x|)·sigmoid(-|x|): no cancellation in 1 - y.
CAPSULE_HD float sigmoid_grad(float x, float g) {
    const float e = expf(-fabsf(x));
    const float d = add_rn(1.0f, e);
    return mul_rn(mul_rn(g, div_rn(1.0f, d)), div_rn(e, d));
}

// max(x, 0) + log1p(exp(-|x|)) with no threshold switch; NaN propagates through the log term.
CAPSULE_HD float softplus(float x) {
    return add_rn(x > 0.0f ? x : 0.0f, log1pf(expf(-fabsf(x))));
}

constexpr float kGeluK = 0.7978845608028654f;   // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
constexpr float kGeluA3 = 0.134145f;            // 3·0.044715

}  // namespace capsule_pw

// -- unary: y = f(x), dx = df(x, g) -----------------------------------------------------------

// x if x > 0 else +0: NaN and -0 give +0; relu'(0) = 0.
CAPSULE_HD float capsule_relu_f(float x) { return x > 0.0f ? x : 0.0f; }
CAPSULE_HD float capsule_relu_df(float x, float g) { return x > 0.0f ? g : 0.0f; }

// ½·x·(1 + t), t = tanh(√(2/π)·(x + 0.044715·x³)).
CAPSULE_HD float capsule_gelu_f(float x) {
    using namespace capsule_pw;
    const float x3 = mul_rn(mul_rn(x, x), x);
    const float t = tanhf(mul_rn(kGeluK, add_rn(x, mul_rn(kGeluA, x3))));
    return mul_rn(mul_rn(0.5f, x), add_rn(1.0f, t));
}

// g·[½(1 + t) + ½·x·(1 - t²)·√(2/π)·(1 + 3·0.044715·x²)]. Where t has saturated (1 - t² = 0,
// |x| above about 5.8) the second term is exactly 0: skipping it keeps x² = inf from making
// 0·inf = NaN for huge |x|.
CAPSULE_HD float capsule_gelu_df(float x, float g) {
    using namespace capsule_pw;
    const float x2 = mul_rn(x, x);
    const float t = tanhf(mul_rn(kGeluK, add_rn(x, mul_rn(kGeluA, mul_rn(x2, x)))));
    const float half = mul_rn(0.5f, add_rn(1.0f, t));
    const float sech2 = mul_rn(sub_rn(1.0f, t), add_rn(1.0f, t));
    if (!(sech2 > 0.0f)) return mul_rn(g, half);
    const float poly = mul_rn(kGeluK, add_rn(1.0f, mul_rn(kGeluA3, x2)));
    return mul_rn(g, add_rn(half, mul_rn(mul_rn(mul_rn(0.5f, x), sech2), poly)));
}

// |x| (-0 gives +0); the gradient is sign(x)·g with sign(±0) = sign(NaN) = 0.
CAPSULE_HD float capsule_abs_f(float x) { return fabsf(x); }
CAPSULE_HD float capsule_abs_df(float x, float g) { return x > 0.0f ? g : (x < 0.0f ? -g : 0.0f); }

// Correctly rounded: x < 0 gives NaN, -0 gives -0. dx = g/(2√x) for x > 0, else 0.
CAPSULE_HD float capsule_sqrt_f(float x) { return capsule_pw::sqrt_rn(x); }
CAPSULE_HD float capsule_sqrt_df(float x, float g) {
    using namespace capsule_pw;
    return x > 0.0f ? div_rn(g, mul_rn(2.0f, sqrt_rn(x))) : 0.0f;
}

CAPSULE_HD float capsule_sigmoid_f(float x) { return capsule_pw::sigmoid(x); }
CAPSULE_HD float capsule_sigmoid_df(float x, float g) { return capsule_pw::sigmoid_grad(x, g); }

// tanhf saturates to ±1; dx = g·(1 - y²) with 1 - y² as (1 - y)(1 + y).
CAPSULE_HD float capsule_tanh_f(float x) { return tanhf(x); }
CAPSULE_HD float capsule_tanh_df(float x, float g) {
    using namespace capsule_pw;
    const float y = tanhf(x);
    return mul_rn(g, mul_rn(sub_rn(1.0f, y), add_rn(1.0f, y)));
}

CAPSULE_HD float capsule_softplus_f(float x) { return capsule_pw::softplus(x); }
CAPSULE_HD float capsule_softplus_df(float x, float g) { return capsule_pw::mul_rn(g, capsule_pw::sigmoid(x)); }

CAPSULE_HD float capsule_exp_f(float x) { return expf(x); }
CAPSULE_HD float capsule_exp_df(float x, float g) { return capsule_pw::mul_rn(g, expf(x)); }

CAPSULE_HD float capsule_sin_f(float x) { return sinf(x); }
CAPSULE_HD float capsule_sin_df(float x, float g) { return capsule_pw::mul_rn(g, cosf(x)); }

CAPSULE_HD float capsule_cos_f(float x) { return cosf(x); }
CAPSULE_HD float capsule_cos_df(float x, float g) { return capsule_pw::mul_rn(-g, sinf(x)); }

// No guard: 0 gives -inf, x < 0 gives NaN.
CAPSULE_HD float capsule_log_f(float x) { return logf(x); }
CAPSULE_HD float capsule_log_df(float x, float g) { return capsule_pw::div_rn(g, x); }

// 1/x correctly rounded (±0 gives ±inf). dx = -g/x² as (-g/x)/x: x² would underflow for
// |x| < 1e-19 although g/x² is representable, and 1/x overflows for subnormal x (0·inf = NaN).
CAPSULE_HD float capsule_inv_f(float x) { return capsule_pw::rcp_rn(x); }
CAPSULE_HD float capsule_inv_df(float x, float g) { return capsule_pw::div_rn(capsule_pw::div_rn(-g, x), x); }

// -- unary with parameters ---------------------------------------------------------------------

CAPSULE_HD float capsule_scale_f(float x, float c) { return capsule_pw::mul_rn(c, x); }
CAPSULE_HD float capsule_scale_df(float g, float c) { return capsule_pw::mul_rn(c, g); }

// min(max(x, lo), hi) with the max/min selections: NaN gives lo. Gradient strictly inside.
CAPSULE_HD float capsule_clamp_f(float x, float lo, float hi) {
    const float m = capsule_pw::max_picks_x(x, lo) ? x : lo;
    return capsule_pw::min_picks_x(m, hi) ? m : hi;
}
CAPSULE_HD float capsule_clamp_df(float x, float g, float lo, float hi) { return x > lo && x < hi ? g : 0.0f; }

// ln(softplus(x) + eps); dx = g·sigmoid(x)/(softplus(x) + eps).
CAPSULE_HD float capsule_safe_log_f(float x, float eps) {
    return logf(capsule_pw::add_rn(capsule_pw::softplus(x), eps));
}
CAPSULE_HD float capsule_safe_log_df(float x, float g, float eps) {
    using namespace capsule_pw;
    return div_rn(mul_rn(g, sigmoid(x)), add_rn(softplus(x), eps));
}

// -- binary: out = f(x, y), (dx, dy) = df(x, y, g) ----------------------------------------------

CAPSULE_HD float capsule_add_f(float x, float y) { return capsule_pw::add_rn(x, y); }
CAPSULE_HD void capsule_add_df(float, float, float g, float& dx, float& dy) {
    dx = g;
    dy = g;
}

CAPSULE_HD float capsule_sub_f(float x, float y) { return capsule_pw::sub_rn(x, y); }
CAPSULE_HD void capsule_sub_df(float, float, float g, float& dx, float& dy) {
    dx = g;
    dy = -g;
}

CAPSULE_HD float capsule_mul_f(float x, float y) { return capsule_pw::mul_rn(x, y); }
CAPSULE_HD void capsule_mul_df(float x, float y, float g, float& dx, float& dy) {
    dx = capsule_pw::mul_rn(g, y);
    dy = capsule_pw::mul_rn(g, x);
}

// The winner gets g, the loser +0; ties (including ±0 against ∓0) and NaN split ½g each.
CAPSULE_HD void capsule_select_df(bool x_wins, bool y_wins, float g, float& dx, float& dy) {
    const float half = capsule_pw::mul_rn(0.5f, g);
    dx = x_wins ? g : (y_wins ? 0.0f : half);
    dy = y_wins ? g : (x_wins ? 0.0f : half);
}

CAPSULE_HD float capsule_max_f(float x, float y) { return capsule_pw::max_picks_x(x, y) ? x : y; }
CAPSULE_HD void capsule_max_df(float x, float y, float g, float& dx, float& dy) {
    capsule_select_df(x > y, y > x, g, dx, dy);
}

CAPSULE_HD float capsule_min_f(float x, float y) { return capsule_pw::min_picks_x(x, y) ? x : y; }
CAPSULE_HD void capsule_min_df(float x, float y, float g, float& dx, float& dy) {
    capsule_select_df(x < y, y < x, g, dx, dy);
}
