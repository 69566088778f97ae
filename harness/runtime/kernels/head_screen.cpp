// The greedy LM head, screened: each row's argmax of its float32 logits h @ W^T, the very index argmax_rows
// gives on them, from the logits on W quantized to 8 bits (a quarter of float32's bytes, half of bfloat16's) and
// a few rows of W.
//
// Why: a greedy step needs each row's argmax, not its logits. The LM head of SmolLM2 is 113 of the 538 MB a
// float32 step streams and 57 of the 269 a bf16w one does; its int8 copy is 28 MB. On 363 steps of three prompts
// (SmolLM2, float32 and bf16w heads, a scratch count on 2026-12-07) the bound below left 1-19 candidates a row,
// 2.7 on average, whose exact logits cost a row of W each (2.3 KB).
//
// The screen. Column j of W (the mode's head: float32, or bf16w's float32 copy of its bfloat16 values) is stored
// as q_j = round(W_j / s_j) in int8, s_j = max_k |W_jk| / 127; W''_j = s_j q_j (exact in float64). Its logit is
// t_j = fl(s'_j fl(sum_k h_k (q_jk 2^24))), s'_j = s_j 2^-24: the int8 values are unpacked from int32 lanes as
// q 2^24 (masks and a shift, exact in float32: see load_q), and the power of two cancels exactly in s'_j.
//
// Proof. Let s_j be the float32 logit of column j as small_gemm.cpp computes it (one accumulator, k = 0..K-1 in
// order, at::vec::fmadd). The error of a K-term float32 dot product against the exact one is at most
// gamma_K sum_k |w_k h_k| for any order of summation, with or without fused multiply-adds (Higham, Accuracy and
// Stability of Numerical Algorithms, 3.1), gamma_K = K u / (1 - K u), u = 2^-24; the final product by s'_j adds
// a relative u. With Cauchy-Schwarz (sum |a_k h_k| <= ||a|| ||h||) and gamma = gamma_2K >= gamma_K + u (1 +
// gamma_K):
//   |s_j - t_j| <= ||h|| (||W_j - W''_j|| + gamma (||W_j|| + ||W''_j||)) = ||h|| c_j,
// c_j computed in float64 and rounded up (bounds(): x (1 + 2^-10)). Let e_j >= ||h|| c_j (computed here with the
// same margin) and M = max_j (t_j - e_j). Every s_j lies in [t_j - e_j, t_j + e_j], so max_j s_j >= M, and a
// column with t_j + e_j < M has s_j < M <= the maximum: it is no argmax, not even a tied one. The float32
// arithmetic of the two passes below errs by at most u * spread * ||h|| (spread >= 2 max_j (max(||W_j||,
// ||W''_j||) (1 + gamma) + c_j), see bounds()), so the test keeps every column with t_j + e_j >= M - slack,
// slack = 2^-16 spread ||h||, a superset of those. The argmax over the kept columns of s_j, each recomputed as the
// kernel computes it (one lane of the same fmadd chain: at::vec operations are lane-wise, so its bits are the
// kernel's), walked in index order with only a strictly greater value replacing, is then the first maximum of all
// s_j: argmax_rows' answer. Non-finite input (||h|| not finite, or so large that a float32 sum of the screen or of
// the head might overflow: ||h|| magnitude >= 1e30) takes every column as a candidate, NaN counting as the
// maximum as argmax_rows counts it. The screen's own rounding never decides a token: a different summation order
// or tiling of t would change only which superset is kept.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
using IVec = at::vec::Vectorized<int32_t>;
constexpr int64_t VS = Vec::size();
constexpr int64_t QW = 4 * VS;  // columns per int8 stripe: four bytes in each int32 lane
constexpr double MARGIN = 1.0 + 1.0 / 1024;  // rounds a float64 quantity up past its float32 rounding
constexpr double SLACK = 1.0 / 65536;  // slack / (spread * ||h||): far above float32's 2^-24
constexpr int CH = 8;  // candidates recomputed side by side (independent fmadd chains hide the FMA latency)
// rows of a screen tile: 4 accumulators a row, the 4 unpacked weights and a broadcast in the register file
#if defined(CPU_CAPABILITY_AVX512) || defined(__aarch64__)
constexpr int RT = 6;  // 32 registers: 24 accumulators
#else
constexpr int RT = 2;  // 16 registers: 8 accumulators
#endif
#if defined(__GNUC__) || defined(__clang__)
#define SCREEN_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define SCREEN_PREFETCH(p) ((void)0)
#endif
// The first row tile of a stripe prefetches AHEAD bytes ahead of its loads (into the next stripe at its end). Why:
// the unpacking costs ~3.5 vector operations per weight vector, so without it the loads and the arithmetic took
// turns: a scratch timing on the Xeon (family 6 model 207, 2026-12-07; 1 row, SmolLM2's 49152 x 576 head, 16
// copies in rotation so that each call read from memory, median of 640 calls) put the screen at 2.21 ms (AVX-512)
// and 2.46 ms (AVX2) without prefetch; 1.52 and 1.64 at 1024 bytes ahead; 1.42 and 1.36 at 4096; the bfloat16
// head by small_gemm's linear took 1.97-2.27 ms in the same rounds (twice the bytes).
constexpr int64_t AHEAD = 4096;
static_assert(IVec::size() == VS, "int8 stripes are unpacked from int32 lanes, one float vector each");

// The four weight vectors of one k row of an int8 stripe, each q 2^24 exactly: lane l of the int32 vector holds
// the stripe's columns l, VS + l, 2 VS + l and 3 VS + l in its bytes 0-3 (pack_screen). A byte moved to the top
// of a lane and the rest masked off is the int32 q 2^24, which converts to float32 exactly (8 significant bits).
inline void load_q(const int32_t* p, Vec (&w)[4]) {
  const IVec v = IVec::loadu(p), top(static_cast<int32_t>(0xFF000000u)), s8(8), s16(16), s24(24);
  w[0] = at::vec::convert<float>(v << s24);
  w[1] = at::vec::convert<float>((v << s16) & top);
  w[2] = at::vec::convert<float>((v << s8) & top);
  w[3] = at::vec::convert<float>(v & top);
}

// rows [0, R) of h [*, K] against stripe wp [K, VS] (int32 lanes): out[i][c] = scale[c] * sum_k h[i][k] q[c][k] 2^24
// for the stripe's `cols` valid columns; ldo the row stride of out
template <int R>
void screen_tile(const float* h, int64_t K, const int32_t* wp, const float* scale, float* out, int64_t ldo,
                 int64_t cols, int64_t ahead) {
  Vec acc[R][4];
  for (int i = 0; i < R; ++i)
    for (int q = 0; q < 4; ++q) acc[i][q] = Vec(0.f);
  Vec w[4];
  for (int64_t k = 0; k < K; ++k) {
    if (ahead > 0) SCREEN_PREFETCH(reinterpret_cast<const char*>(wp + k * VS) + ahead);
    load_q(wp + k * VS, w);
    for (int i = 0; i < R; ++i) {
      const Vec b(h[i * K + k]);
      for (int q = 0; q < 4; ++q) acc[i][q] = at::vec::fmadd(b, w[q], acc[i][q]);
    }
  }
  float lanes[QW];
  for (int i = 0; i < R; ++i) {
    for (int q = 0; q < 4; ++q) (acc[i][q] * Vec::loadu(scale + q * VS)).store(lanes + q * VS);
    std::memcpy(out + i * ldo, lanes, cols * sizeof(float));
  }
}

template <int R>
void screen_rows(const float* h, int64_t r, int64_t K, const int32_t* wp, const float* scale, float* out,
                 int64_t ldo, int64_t cols) {
  int64_t i = 0;
  for (; i + R <= r; i += R) screen_tile<R>(h + i * K, K, wp, scale, out + i * ldo, ldo, cols, i ? 0 : AHEAD);
  if (r - i >= 2) {
    screen_rows<2>(h + i * K, r - i, K, wp, scale, out + i * ldo, ldo, cols);
  } else if (r - i == 1) {
    screen_tile<1>(h + i * K, K, wp, scale, out + i * ldo, ldo, cols, i ? 0 : AHEAD);
  }
}

// the float32 logits s_j of columns js[0..n) of w [N, K] for row h [K], exactly as small_gemm.cpp's kernel
// computes them (one accumulator from 0, k in order, at::vec::fmadd: lane 0 of each chain), CH chains at a time
void kernel_dots(const float* h, const float* w, int64_t K, const int64_t* js, int64_t n, float* out) {
  float lanes[VS];
  for (int64_t i = 0; i < n; i += CH) {
    const int m = static_cast<int>(std::min<int64_t>(CH, n - i));
    Vec acc[CH];
    const float* p[CH];
    for (int c = 0; c < CH; ++c) {
      acc[c] = Vec(0.f);
      p[c] = w + js[i + std::min(c, m - 1)] * K;  // a short group repeats its last column
    }
    for (int64_t k = 0; k < K; ++k) {
      const Vec hk(h[k]);
      for (int c = 0; c < CH; ++c) acc[c] = at::vec::fmadd(hk, Vec(p[c][k]), acc[c]);
    }
    for (int c = 0; c < m; ++c) {
      acc[c].store(lanes);
      out[i + c] = lanes[0];
    }
  }
}

// the columns of row t [N] that may hold its float32 maximum (see the proof), ascending; e_j = bound_j * hn
void candidates(const float* t, const float* bound, int64_t N, float hn, float slack, std::vector<int64_t>& out) {
  const Vec hv(hn);
  Vec mv(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + VS <= N; j += VS) mv = at::vec::maximum(mv, Vec::loadu(t + j) - Vec::loadu(bound + j) * hv);
  float lanes[VS];
  mv.store(lanes);
  float m = lanes[0];
  for (int64_t l = 1; l < VS; ++l) m = std::max(m, lanes[l]);
  for (; j < N; ++j) m = std::max(m, t[j] - bound[j] * hn);
  const float floor = m - slack;
  const Vec fv(floor);
  constexpr int none = (1 << VS) - 1;  // zero_mask with every lane 0: no column kept
  for (j = 0; j + VS <= N; j += VS)
    if ((Vec::loadu(t + j) + Vec::loadu(bound + j) * hv >= fv).zero_mask() != none)
      for (int64_t l = 0; l < VS; ++l)
        if (t[j + l] + bound[j + l] * hn >= floor) out.push_back(j + l);
  for (; j < N; ++j)
    if (t[j] + bound[j] * hn >= floor) out.push_back(j);
}

void check(const at::Tensor& x, const char* what, int64_t dim, at::ScalarType type = at::kFloat) {
  TORCH_CHECK(x.scalar_type() == type && x.device().is_cpu() && x.is_contiguous() && x.dim() == dim, what,
              ": contiguous ", c10::toString(type), " CPU tensor of ", dim, " dims expected");
}

}  // namespace

// q [N, K] int8 -> int32 [ceil(N / QW), K, VS]: stripes of QW columns, each k row one int32 vector whose lane l
// holds columns l, VS + l, 2 VS + l, 3 VS + l of the stripe in bytes 0-3 (zero past N); see load_q
at::Tensor pack_screen(const at::Tensor& q) {
  check(q, "pack_screen: q", 2, at::kChar);
  const int64_t N = q.size(0), K = q.size(1), S = (N + QW - 1) / QW;
  auto out = at::zeros({S, K, VS}, q.options().dtype(at::kInt));
  const int8_t* src = q.data_ptr<int8_t>();
  int32_t* dst = out.data_ptr<int32_t>();
  for (int64_t s = 0; s < S; ++s)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t l = 0; l < VS; ++l) {
        uint32_t v = 0;
        for (int64_t b = 0; b < 4; ++b) {
          const int64_t col = s * QW + b * VS + l;
          if (col < N) v |= static_cast<uint32_t>(static_cast<uint8_t>(src[col * K + k])) << (8 * b);
        }
        std::memcpy(dst + (s * K + k) * VS + l, &v, sizeof v);
      }
  return out;
}

// h [r, K] float32 against pack_screen's stripes of the int8 head and scale [N] (s'_j = s_j 2^-24, see the top):
// the screen's logits t [r, N]. Its summation order is its own (the proof bounds any order).
at::Tensor screen_logits(const at::Tensor& h, const at::Tensor& packed, const at::Tensor& scale) {
  check(h, "screen_logits: h", 2);
  check(packed, "screen_logits: packed", 3, at::kInt);
  check(scale, "screen_logits: scale", 1);
  const int64_t r = h.size(0), K = h.size(1), N = scale.size(0), S = packed.size(0);
  TORCH_CHECK(packed.size(1) == K && packed.size(2) == VS && S == (N + QW - 1) / QW,
              "screen_logits: packed is not pack_screen's layout for ", N, " columns of ", K);
  auto out = at::empty({r, N}, h.options());
  if (r == 0 || N == 0) return out;
  std::vector<float> padded(static_cast<size_t>(S * QW), 0.f);  // the scales, whole stripes
  std::memcpy(padded.data(), scale.data_ptr<float>(), N * sizeof(float));
  const float* hp = h.data_ptr<float>();
  const int32_t* wp = packed.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, S, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s)
      screen_rows<RT>(hp, r, K, wp + s * K * VS, padded.data() + s * QW, op + s * QW, N,
                      std::min<int64_t>(QW, N - s * QW));
  });
  return out;
}

// h [r, K] the rows fed to the head (after the final norm); t [r, N] their screen logits (screen_logits); bound
// [N] the c_j above; spread (see the proof); magnitude: the largest factor of ||h|| a float32 sum of the screen
// or of the head can reach (bounds()); w [N, K] the mode's head in float32. Returns each row's argmax of h @ w^T
// as argmax_rows gives it on the kernel's logits.
std::vector<int64_t> screened_argmax(const at::Tensor& h, const at::Tensor& t, const at::Tensor& bound, double spread,
                                     double magnitude, const at::Tensor& w) {
  check(h, "screened_argmax: h", 2);
  check(t, "screened_argmax: t", 2);
  check(bound, "screened_argmax: bound", 1);
  check(w, "screened_argmax: w", 2);
  const int64_t r = h.size(0), K = h.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K && t.size(0) == r && t.size(1) == N && bound.size(0) == N,
              "screened_argmax: shapes of h, t, bound and w disagree");
  std::vector<int64_t> out(static_cast<size_t>(r)), cand;
  std::vector<float> vals;
  const float* wp = w.data_ptr<float>();
  for (int64_t i = 0; i < r; ++i) {
    const float* hi = h.data_ptr<float>() + i * K;
    double ss = 0;
    for (int64_t c = 0; c < K; ++c) ss += static_cast<double>(hi[c]) * hi[c];
    const double hn = std::sqrt(ss) * MARGIN;
    cand.clear();
    if (std::isfinite(hn) && hn * std::max(spread, magnitude) < 1e30) {
      candidates(t.data_ptr<float>() + i * N, bound.data_ptr<float>(), N, static_cast<float>(hn),
                 static_cast<float>(SLACK * spread * hn), cand);
    } else {
      for (int64_t j = 0; j < N; ++j) cand.push_back(j);
    }
    vals.resize(cand.size());
    kernel_dots(hi, wp, K, cand.data(), static_cast<int64_t>(cand.size()), vals.data());
    int64_t best = -1;
    float bv = 0.f;
    for (size_t c = 0; c < cand.size(); ++c) {
      const float v = vals[c];
      if (std::isnan(v)) {  // the first NaN is the maximum
        best = cand[c];
        break;
      }
      if (best < 0 || v > bv) {
        best = cand[c];
        bv = v;
      }
    }
    TORCH_CHECK(best >= 0, "screened_argmax: no candidate column (a bound is NaN?)");
    out[static_cast<size_t>(i)] = best;
  }
  return out;
}

// h [r, K] @ w [N, K]^T -> [r, N], each logit by kernel_dots: the premise of the proof, that these are the bits
// small_gemm.cpp's linear() gives on w packed (the tests compare them on every variant)
at::Tensor kernel_logits(const at::Tensor& h, const at::Tensor& w) {
  check(h, "kernel_logits: h", 2);
  check(w, "kernel_logits: w", 2);
  const int64_t r = h.size(0), K = h.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "kernel_logits: h has ", K, " columns, w ", w.size(1));
  auto out = at::empty({r, N}, h.options());
  std::vector<int64_t> all(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) all[static_cast<size_t>(j)] = j;
  for (int64_t i = 0; i < r; ++i)
    kernel_dots(h.data_ptr<float>() + i * K, w.data_ptr<float>(), K, all.data(), N, out.data_ptr<float>() + i * N);
  return out;
}

void register_head_screen(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("kernel_logits", &kernel_logits, "h @ w^T as screened_argmax recomputes its candidates (for tests)",
        py::arg("h"), py::arg("w"));
  m.def("pack_screen", &pack_screen, "the int8 head [N, K] in the screen's int32 stripes (see head_screen.cpp)",
        py::arg("q"));
  m.def("screen_logits", &screen_logits, "h [r, K] on the packed int8 head and its scales: [r, N]", py::arg("h"),
        py::arg("packed"), py::arg("scale"));
  m.def("screened_argmax", &screened_argmax, "each row's argmax of h @ w^T from its screen logits (see "
        "head_screen.cpp)", py::arg("h"), py::arg("t"), py::arg("bound"), py::arg("spread"), py::arg("magnitude"),
        py::arg("w"));
}
