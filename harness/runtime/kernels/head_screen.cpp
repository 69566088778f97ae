// The greedy LM head, screened: each row's argmax of its float32 logits h @ W^T, the very index argmax_rows
// gives on them, from the logits on W rounded to bfloat16 (half the bytes) and a few float32 rows of W.
//
// Why: a greedy step needs each row's argmax, not its logits. The float32 head of SmolLM2 is 113 MB of the 538 a
// step streams; its bfloat16 rounding is 57 MB, and the bound below leaves 1-4 candidates a row (1.1-1.3 on
// average over 330 steps of three prompts), whose exact logits cost a 2.3 KB row each.
//
// Proof. Let s_j be the float32 logit of column j as small_gemm.cpp computes it (one accumulator, k = 0..K-1 in
// order, at::vec::fmadd), t_j = the same computed on W' = bf16(W) (widened exactly), and u = 2^-24. The error of
// such a K-term dot product against the exact one is at most gamma * sum_k |w_k h_k| for any order of summation,
// with or without fused multiply-adds (Higham, Accuracy and Stability of Numerical Algorithms, 3.1), gamma =
// K u / (1 - K u); bounds() uses 2K for margin. With Cauchy-Schwarz (sum |a_k h_k| <= ||a|| ||h||):
//   |s_j - t_j| <= ||h|| (||W_j - W'_j|| + gamma (||W_j|| + ||W'_j||)) = ||h|| c_j,
// c_j computed in float64 and rounded up (bounds(): x (1 + 2^-10)). Let e_j >= ||h|| c_j (computed here with the
// same margin) and M = max_j (t_j - e_j). Every s_j lies in [t_j - e_j, t_j + e_j], so max_j s_j >= M, and a
// column with t_j + e_j < M has s_j < M <= the maximum: it is no argmax, not even a tied one. The float32
// arithmetic of the two passes below errs by at most u * spread * ||h|| (spread >= 2 max_j (||W_j|| (1 + gamma) +
// c_j), see bounds()), so the test keeps every column with t_j + e_j >= M - slack, slack = 2^-16 spread ||h||, a
// superset of those. The argmax over the kept columns of s_j, each recomputed as the kernel computes it (lane 0
// of the same fmadd chain: at::vec operations are lane-wise, so its bits are the kernel's), walked in index order
// with only a strictly greater value replacing, is then the first maximum of all s_j: argmax_rows' answer.
// Non-finite input (||h|| not finite, or so large that a float32 sum might overflow) takes every column as a
// candidate, NaN counting as the maximum as argmax_rows counts it.
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t VS = Vec::size();
constexpr double MARGIN = 1.0 + 1.0 / 1024;  // rounds a float64 quantity up past its float32 rounding
constexpr double SLACK = 1.0 / 65536;  // slack / (spread * ||h||): far above float32's 2^-24

// column j's float32 logit exactly as small_gemm.cpp's kernel computes it: one accumulator from 0, k in order
float kernel_dot(const float* h, const float* w, int64_t K) {
  Vec acc(0.f);
  for (int64_t c = 0; c < K; ++c) acc = at::vec::fmadd(Vec(h[c]), Vec(w[c]), acc);
  float lanes[VS];
  acc.store(lanes);
  return lanes[0];
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

void check(const at::Tensor& x, const char* what, int64_t dim) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.is_contiguous() && x.dim() == dim, what,
              ": contiguous float32 CPU tensor of ", dim, " dims expected");
}

}  // namespace

// h [r, K] the rows fed to the head (after the final norm); t [r, N] their logits on the bfloat16 head; bound [N]
// the c_j above; spread (see the proof); w [N, K] the float32 head. Returns each row's argmax of h @ w^T as
// argmax_rows gives it on those logits.
std::vector<int64_t> screened_argmax(const at::Tensor& h, const at::Tensor& t, const at::Tensor& bound, double spread,
                                     const at::Tensor& w) {
  check(h, "screened_argmax: h", 2);
  check(t, "screened_argmax: t", 2);
  check(bound, "screened_argmax: bound", 1);
  check(w, "screened_argmax: w", 2);
  const int64_t r = h.size(0), K = h.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K && t.size(0) == r && t.size(1) == N && bound.size(0) == N,
              "screened_argmax: shapes of h, t, bound and w disagree");
  std::vector<int64_t> out(static_cast<size_t>(r)), cand;
  const float* wp = w.data_ptr<float>();
  for (int64_t i = 0; i < r; ++i) {
    const float* hi = h.data_ptr<float>() + i * K;
    double ss = 0;
    for (int64_t c = 0; c < K; ++c) ss += static_cast<double>(hi[c]) * hi[c];
    const double hn = std::sqrt(ss) * MARGIN;
    cand.clear();
    if (std::isfinite(hn) && hn * spread < 1e30) {
      candidates(t.data_ptr<float>() + i * N, bound.data_ptr<float>(), N, static_cast<float>(hn),
                 static_cast<float>(SLACK * spread * hn), cand);
    } else {
      for (int64_t j = 0; j < N; ++j) cand.push_back(j);
    }
    int64_t best = -1;
    float bv = 0.f;
    for (const int64_t j : cand) {
      const float v = kernel_dot(hi, wp + j * K, K);
      if (std::isnan(v)) {  // the first NaN is the maximum
        best = j;
        break;
      }
      if (best < 0 || v > bv) {
        best = j;
        bv = v;
      }
    }
    TORCH_CHECK(best >= 0, "screened_argmax: no candidate column (a bound is NaN?)");
    out[static_cast<size_t>(i)] = best;
  }
  return out;
}

// h [r, K] @ w [N, K]^T -> [r, N], each logit by kernel_dot: the premise of the proof, that these are the bits
// small_gemm.cpp's linear() gives on w packed (the tests compare them on every variant)
at::Tensor kernel_logits(const at::Tensor& h, const at::Tensor& w) {
  check(h, "kernel_logits: h", 2);
  check(w, "kernel_logits: w", 2);
  const int64_t r = h.size(0), K = h.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "kernel_logits: h has ", K, " columns, w ", w.size(1));
  auto out = at::empty({r, N}, h.options());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < N; ++j)
      out.data_ptr<float>()[i * N + j] = kernel_dot(h.data_ptr<float>() + i * K, w.data_ptr<float>() + j * K, K);
  return out;
}

void register_head_screen(pybind11::module_& m) {
  m.def("kernel_logits", &kernel_logits, "h @ w^T one column at a time as screened_argmax recomputes its "
        "candidates (for tests)", pybind11::arg("h"), pybind11::arg("w"));
  m.def("screened_argmax", &screened_argmax, "each row's argmax of h @ w^T from its logits on bf16(w) (see "
        "head_screen.cpp)", pybind11::arg("h"), pybind11::arg("t"), pybind11::arg("bound"), pybind11::arg("spread"),
        pybind11::arg("w"));
}
