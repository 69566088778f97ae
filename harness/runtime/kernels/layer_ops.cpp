// The small per-layer operations of a decoding forward, fused, for the kernel path: RMSNorm with the
// residual add, rotary embedding with the KV-cache write, and SiLU(gate) * up.
//
// Why: a decoding step runs 1-10 rows, where each of these is a few microseconds of arithmetic but
// torch spends 10-60 us per call on dispatch, allocation and reductions (RMSNorm alone costs ~40 us per
// call on a Zen 3 core at one row). Thirty layers of ~15 such calls were a third of a 1-token forward.
//
// Exactness: every output row is computed by the same code in the same order whatever the row count, so a
// row's result is bitwise independent of the other rows (as the matmul kernel's are); SiLU's exp is at::vec's
// vector exp, elementwise and lane-independent (the tail goes through a partial vector), so an element's
// value depends on nothing but its input. RMSNorm's sum of squares runs in 16 fixed lanes and RoPE is
// elementwise, so those two also give the same bits on every ISA (AVX-512, AVX2, the generic build). The
// arithmetic follows transformers' LLaMA modules (float32 variance, x * rsqrt(var + eps) * w; q * cos +
// rotate_half(q) * sin; silu(g) = g / (1 + exp(-g))) without promising the same bits: every decoder runs
// through this same code, which is what exactness against `ar` needs.
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t VS = Vec::size();
// RMSNorm's sum of squares runs in this many lanes whatever the vector width (see add_rms_norm)
constexpr int64_t SS_LANES = 16;
static_assert(SS_LANES % VS == 0, "the sum-of-squares lanes must be whole vectors");
constexpr int64_t SS_VECS = SS_LANES / VS;

void check_f32(const at::Tensor& t, const char* what, int64_t dim) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.device().is_cpu() && t.is_contiguous() && t.dim() == dim, what,
              ": contiguous float32 CPU tensor of ", dim, " dims expected");
}

}  // namespace

// (external linkage: layer.cpp calls them too)

// x [k, h] += r [k, h] (r may be undefined: no add); returns RMSNorm(x) * w, [k, h]
at::Tensor add_rms_norm(at::Tensor x, const c10::optional<at::Tensor>& r, const at::Tensor& w, double eps) {
  check_f32(x, "add_rms_norm: x", 2);
  check_f32(w, "add_rms_norm: weight", 1);
  const int64_t k = x.size(0), h = x.size(1);
  TORCH_CHECK(w.size(0) == h, "add_rms_norm: weight has ", w.size(0), " entries, x has ", h, " columns");
  float* xp = x.data_ptr<float>();
  const float* rp = nullptr;
  if (r.has_value() && r->defined()) {
    check_f32(*r, "add_rms_norm: residual", 2);
    TORCH_CHECK(r->sizes() == x.sizes(), "add_rms_norm: residual shape differs from x");
    rp = r->data_ptr<float>();
  }
  auto y = at::empty({k, h}, x.options());
  float* yp = y.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  for (int64_t i = 0; i < k; ++i) {
    float* xi = xp + i * h;
    float* yi = yp + i * h;
    if (rp != nullptr)
      for (int64_t j = 0; j < h; j += VS) {
        const int64_t n = std::min<int64_t>(VS, h - j);
        (Vec::loadu(xi + j, n) + Vec::loadu(rp + i * h + j, n)).store(xi + j, n);
      }
    // the sum of squares in SS_LANES fixed lanes (element j in lane j % SS_LANES), then the lanes in
    // order: the same sum on every ISA, in vectors. Why: the one scalar chain before (the compiler may not
    // reorder float adds) cost ~1 ns an element; a SmolLM2 step's 61 norms at 6 rows took 0.17-0.23 ms
    // more than at 1 row, now ~0.05 ms (Zen 4, 2026-12-04, timers in a copy of layer.cpp)
    Vec acc[SS_VECS];
    for (int64_t v = 0; v < SS_VECS; ++v) acc[v] = Vec(0.f);
    for (int64_t j = 0; j < h; j += SS_LANES)
      for (int64_t v = 0; v < SS_VECS && j + v * VS < h; ++v) {
        const int64_t n = std::min<int64_t>(VS, h - j - v * VS);
        const Vec xv = Vec::loadu(xi + j + v * VS, n);  // zeros past h: adding 0 * 0 changes nothing
        acc[v] = acc[v] + xv * xv;
      }
    float lanes[SS_LANES];
    for (int64_t v = 0; v < SS_VECS; ++v) acc[v].store(lanes + v * VS);
    float ss = 0.f;
    for (int64_t l = 0; l < SS_LANES; ++l) ss += lanes[l];
    const Vec inv(1.f / std::sqrt(ss / float(h) + float(eps)));
    for (int64_t j = 0; j < h; j += VS) {
      const int64_t n = std::min<int64_t>(VS, h - j);
      (Vec::loadu(wp + j, n) * (Vec::loadu(xi + j, n) * inv)).store(yi + j, n);
    }
  }
  return y;
}

// qkv [k, (H + 2 Hkv) d] -> q [1, H, k, d] rotated; k rotated and v written to the layer's cache
// vc [Hkv, capacity, d] and kc (the same, or [Hkv, blocks, d, B] when keys_blocked: the layout our
// attention reads, entry j at block j / B, column j % B) at entries L..L+k. cos/sin [k, d] for the k positions.
at::Tensor rope_to_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kc,
                         at::Tensor vc, int64_t L, int64_t H, int64_t Hkv, bool keys_blocked) {
  check_f32(qkv, "rope_to_cache: qkv", 2);
  check_f32(cos, "rope_to_cache: cos", 2);
  check_f32(sin, "rope_to_cache: sin", 2);
  check_f32(kc, "rope_to_cache: key cache", keys_blocked ? 4 : 3);
  check_f32(vc, "rope_to_cache: value cache", 3);
  const int64_t k = qkv.size(0), d = vc.size(2), half = d / 2, cap = vc.size(1);
  const int64_t B = keys_blocked ? kc.size(3) : 0;
  const bool kc_ok = keys_blocked ? (kc.size(0) == Hkv && kc.size(1) * B >= cap && kc.size(2) == d)
                                  : kc.sizes() == vc.sizes();
  TORCH_CHECK(d % 2 == 0 && qkv.size(1) == (H + 2 * Hkv) * d && vc.size(0) == Hkv && kc_ok,
              "rope_to_cache: qkv, heads and cache shapes disagree");
  TORCH_CHECK(cos.size(0) == k && cos.size(1) == d && sin.sizes() == cos.sizes(), "rope_to_cache: cos/sin must be [k, d]");
  TORCH_CHECK(L >= 0 && L + k <= cap, "rope_to_cache: cache overflow");
  auto q = at::empty({1, H, k, d}, qkv.options());
  const float* in = qkv.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kp = kc.data_ptr<float>();
  float* vp = vc.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t width = qkv.size(1);
  // q * cos + rotate_half(q) * sin, in vectors (each element the scalar formula's operations)
  auto rotate = [&](const float* src, const float* c, const float* s, float* dst) {
    for (int64_t j = 0; j < half; j += VS) {
      const int64_t n = std::min<int64_t>(VS, half - j);
      const Vec lo = Vec::loadu(src + j, n), hi = Vec::loadu(src + half + j, n);
      (lo * Vec::loadu(c + j, n) + hi.neg() * Vec::loadu(s + j, n)).store(dst + j, n);
      (hi * Vec::loadu(c + half + j, n) + lo * Vec::loadu(s + half + j, n)).store(dst + half + j, n);
    }
  };
  std::vector<float> key(static_cast<size_t>(d));
  for (int64_t i = 0; i < k; ++i) {
    const float* row = in + i * width;
    const float* c = cp + i * d;
    const float* s = sp + i * d;
    for (int64_t hh = 0; hh < H; ++hh) rotate(row + hh * d, c, s, qp + (hh * k + i) * d);
    for (int64_t hh = 0; hh < Hkv; ++hh) {
      if (keys_blocked) {  // entry L+i: column (L+i) % B of block (L+i) / B of head hh's [blocks, d, B] keys
        rotate(row + (H + hh) * d, c, s, key.data());
        float* dst = kp + ((hh * kc.size(1) + (L + i) / B) * d) * B + (L + i) % B;
        for (int64_t j = 0; j < d; ++j) dst[j * B] = key[j];
      } else {
        rotate(row + (H + hh) * d, c, s, kp + (hh * cap + L + i) * d);
      }
      const float* v = row + (H + Hkv + hh) * d;
      float* vd = vp + (hh * cap + L + i) * d;
      for (int64_t j = 0; j < d; ++j) vd[j] = v[j];
    }
  }
  return q;
}

// o[j] = silu(g[j]) * u[j] for j < n, in vectors (a vector exp: ~5x the scalar's speed on 1536 columns). The one
// SiLU formula: small_gemm.cpp's swiglu applies it too, so the two give the same bits.
void silu_mul_row(const float* g, const float* u, float* o, int64_t n) {
  const Vec one(1.f);
  for (int64_t j = 0; j < n; j += VS) {
    const int64_t c = std::min<int64_t>(VS, n - j);
    const Vec gv = Vec::loadu(g + j, c), uv = Vec::loadu(u + j, c);
    ((gv / (one + gv.neg().exp())) * uv).store(o + j, c);
  }
}

// gate_up [k, 2 I] (gate then up) -> silu(gate) * up, [k, I]
at::Tensor silu_mul(const at::Tensor& gu) {
  check_f32(gu, "silu_mul: gate_up", 2);
  const int64_t k = gu.size(0), inter = gu.size(1) / 2;
  TORCH_CHECK(gu.size(1) % 2 == 0, "silu_mul: gate_up must have an even number of columns");
  auto y = at::empty({k, inter}, gu.options());
  const float* in = gu.data_ptr<float>();
  float* out = y.data_ptr<float>();
  for (int64_t i = 0; i < k; ++i) silu_mul_row(in + i * 2 * inter, in + i * 2 * inter + inter, out + i * inter, inter);
  return y;
}

// Each row's argmax of logits x [r, n], as torch.argmax gives it: the first maximal element, a NaN counting
// as the maximum (the first NaN). Why: torch's argmax read a 49152-wide row in 59 us with warm caches and
// 125 after a forward (EPYC Zen 5), against a 7-15 ms SmolLM2 step; every greedy step takes one per row.
// Lane l keeps the first index of its own maximum (only a strictly greater value replaces it), so the
// smallest index among the lanes that hold the overall maximum is its first occurrence; the tail is scalar.
std::vector<int64_t> argmax_rows(const at::Tensor& x) {
  check_f32(x, "argmax_rows: x", 2);
  const int64_t r = x.size(0), n = x.size(1);
  TORCH_CHECK(n > 0 && n < (1 << 24), "argmax_rows: rows of 1 to 2^24 - 1 elements expected (indices as floats)");
  std::vector<int64_t> out(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) {
    const float* p = x.data_ptr<float>() + i * n;
    float bv = p[0];
    int64_t best = 0, j = 1;
    bool nan = std::isnan(p[0]);
    if (n >= VS) {
      Vec mv = Vec::loadu(p), iv = Vec::arange(0.f, 1.f), nanv = mv.isnan();
      for (j = VS; j + VS <= n; j += VS) {
        const Vec v = Vec::loadu(p + j);
        const Vec gt = v > mv;  // all-ones lanes where v is greater (never for a NaN)
        mv = Vec::blendv(mv, v, gt);
        iv = Vec::blendv(iv, Vec::arange(static_cast<float>(j), 1.f), gt);
        nanv = nanv | v.isnan();
      }
      float m[VS], ix[VS], nn[VS];
      mv.store(m);
      iv.store(ix);
      nanv.store(nn);
      for (int64_t l = 0; l < VS; ++l) {
        nan = nan || nn[l] != 0.f;  // a set lane's bits are a NaN, never equal to 0
        const auto il = static_cast<int64_t>(ix[l]);
        if (m[l] > bv || (m[l] == bv && il < best)) {
          bv = m[l];
          best = il;
        }
      }
    }
    for (; j < n; ++j) {
      nan = nan || std::isnan(p[j]);
      if (p[j] > bv) {
        bv = p[j];
        best = j;
      }
    }
    if (nan) best = std::find_if(p, p + n, [](float v) { return std::isnan(v); }) - p;
    out[static_cast<size_t>(i)] = best;
  }
  return out;
}

void register_layer_ops(pybind11::module_& m) {
  m.def("add_rms_norm", &add_rms_norm, "x += r (in place; r may be None), then RMSNorm(x) * w", pybind11::arg("x"),
        pybind11::arg("r"), pybind11::arg("w"), pybind11::arg("eps"));
  m.def("rope_to_cache", &rope_to_cache, "rotate q and k, write k and v to the layer's cache, return q [1, H, k, d]",
        pybind11::arg("qkv"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("kc"), pybind11::arg("vc"),
        pybind11::arg("L"), pybind11::arg("H"), pybind11::arg("Hkv"), pybind11::arg("keys_blocked") = false);
  m.def("silu_mul", &silu_mul, "silu(gate) * up from the fused gate_up output", pybind11::arg("gate_up"));
  m.def("argmax_rows", &argmax_rows, "each row's argmax as a list (torch.argmax's: first maximum, NaN counts as max)",
        pybind11::arg("x"));
}
