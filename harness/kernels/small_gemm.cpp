// Float32 matmul for decoding on AVX-512 CPUs: y[M, N] = x[M, K] @ W[N, K]^T, built for small M.
//
// Why: a decoding step multiplies 1-32 rows by every weight matrix, so its cost is streaming the
// weights from memory once. Library GEMMs either re-lay the weights out per call or take slower paths
// at a few rows (see harness/backend.py, Projection). Here the weights are packed once into column
// blocks [N/64][K][64], each block streamed contiguously by one thread, and every row of x is
// multiplied against the block while it is in registers/L2.
//
// Each output element is ONE fp32 accumulator summed over k = 0..K-1 in order, whatever M is and
// whichever tile a row falls in, so a row's result is bitwise independent of the other rows: a
// 1-token autoregressive step and a 6-token lookahead step compute identical logits for a shared row.
// Large M (prefill) tiles the rows by 6 against each block while it sits in L2: about as fast as oneDNN
// up to a few hundred rows (measured in harness/backend.py, Projection).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

constexpr int64_t BN = 64;     // output columns per block: 4 AVX-512 registers
constexpr int64_t MT_MAX = 6;  // rows per tile: 6 x 4 accumulators + 4 weight registers of 32

// W [N, K] float32 -> [ceil(N/64), K, 64], zero-padded columns
torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat32, "pack: float32 [out, in] expected");
  const int64_t N = w.size(0), K = w.size(1), NB = (N + BN - 1) / BN;
  auto wp = torch::zeros({NB * BN, K}, w.options());
  wp.narrow(0, 0, N).copy_(w);
  return wp.view({NB, BN, K}).transpose(1, 2).contiguous();
}

template <int MT>
static inline void tile(const float* x, int64_t K, const float* wb, float* y, int64_t ldy) {
  __m512 acc[MT][4];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = wb + k * BN;
    const __m512 w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16);
    const __m512 w2 = _mm512_loadu_ps(wk + 32), w3 = _mm512_loadu_ps(wk + 48);
    for (int m = 0; m < MT; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * K + k]);
      acc[m][0] = _mm512_fmadd_ps(xb, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(xb, w1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(xb, w2, acc[m][2]);
      acc[m][3] = _mm512_fmadd_ps(xb, w3, acc[m][3]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + m * ldy + j * 16, acc[m][j]);
}

// x [M, K] contiguous float32, wp from pack(): -> [M, n_out]
torch::Tensor linear(torch::Tensor x, torch::Tensor wp, int64_t n_out) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "linear: contiguous float32 [rows, in] expected");
  const int64_t M = x.size(0), K = x.size(1), NB = wp.size(0), ldy = NB * BN;
  TORCH_CHECK(wp.dim() == 3 && wp.size(1) == K && wp.size(2) == BN, "linear: packed weight does not match the input");
  TORCH_CHECK(n_out <= ldy, "linear: n_out exceeds the packed columns");
  auto y = torch::empty({M, ldy}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wptr = wp.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      const float* wb = wptr + nb * K * BN;
      for (int64_t m0 = 0; m0 < M; m0 += MT_MAX) {  // later tiles find the block in L2
        const float* xt = xp + m0 * K;
        float* yt = yp + m0 * ldy + nb * BN;
        switch (std::min(MT_MAX, M - m0)) {
          case 1: tile<1>(xt, K, wb, yt, ldy); break;
          case 2: tile<2>(xt, K, wb, yt, ldy); break;
          case 3: tile<3>(xt, K, wb, yt, ldy); break;
          case 4: tile<4>(xt, K, wb, yt, ldy); break;
          case 5: tile<5>(xt, K, wb, yt, ldy); break;
          default: tile<6>(xt, K, wb, yt, ldy); break;
        }
      }
    }
  });
  return n_out == ldy ? y : y.narrow(1, 0, n_out).contiguous();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "pack W [out, in] into 64-column blocks");
  m.def("linear", &linear, "x [rows, in] @ W^T from packed blocks");
}
