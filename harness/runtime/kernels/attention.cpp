// Attention of a decoding step's few query rows against the layer's KV cache.
//
// Why: at 1-10 query rows torch's fused CPU attention spends most of a call on setup (EPYC, SmolLM2 shapes,
// 300 cached entries: 25 us at 1 row, 85 at 6, where this runs 9 and 31), plus the cache views around it
// and a copy of its output into the o-projection's layout. Here one call reads the rotated queries, the
// layer's cache in place and the step's mask among its new tokens, and writes [k, H * d] rows for the
// o-projection. The keys are cached in blocks of B keys, transposed within a block ([Hkv, blocks, d, B]),
// so the scores of VS consecutive keys are one vector and a block is read front to back; the query rows
// sharing a kv head are handled together (a tile), so each key and value is read once for all of them.
//
// Exactness: each (query row, head) is computed by the same operations whatever the row count or tile:
// - a key's score is one accumulator lane summed over the head dimension in order (one fmadd each), so it
//   does not depend on the lane, block or tile the key or row falls in;
// - the softmax max is over the visible keys (order-free), exp is elementwise;
// - the denominator and the output are summed over the visible keys in cache order, one key at a time;
//   masked keys are skipped, not added as zeros.
// So a row sees the same sums whether it runs alone in an `ar` step or among the branches of a lookahead
// step whose mask shows it the same keys: a 1-token and a many-token step agree bitwise.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t VS = Vec::size();

// key blocks (of VS keys) scored together: RT x KB independent accumulators hide the FMA latency, and with
// KB key vectors they fit the register file (32 vector registers on AVX-512 and aarch64, 16 on AVX2)
#if defined(CPU_CAPABILITY_AVX512) || defined(__aarch64__)
constexpr int64_t KB = 4, REGS = 32;
#else
constexpr int64_t KB = 2, REGS = 16;
#endif
// Why blocks: with the keys transposed whole ([Hkv, d, capacity]) a score run read d rows `capacity` floats
// apart, which the hardware prefetcher does not follow (a 256-byte software prefetch ahead of each row hid
// part of it). A block's d rows are one contiguous run (4 KB at B = 16, d = 64), read front to back. Against
// that layout, same results bit for bit (EPYC Zen 4, 2026-12-06, SmolLM2 shapes, cache 300): 30 layers'
// calls 0.77-0.96x with AVX2 and 0.87-0.98x with AVX-512 at 1, 6 and 11 tokens; a whole step 0.95-0.97x at
// 1 token with AVX2 forced, 0.98-0.99x with AVX-512, 0.98-1.00x at 6 and 11 (float32 and bf16w, paired
// interleaved rounds; an identical build ran within 0.01 of it). Software prefetches 256 bytes to 2 KB ahead
// in a block, or of the values while scoring, gained nothing more.

// query rows of one kv head handled together (score_all's switch covers 1..RT). AVX-512 holds 6 rows x
// KB key vectors of scores (24 accumulators): fewer tiles re-read the keys and values. SmolLM2 shapes,
// cache 300 (EPYC Zen 5, 2026-12-03, against 4 rows, interleaved, median of 150): a call of 6 / 10 rows
// 0.75x / 0.74x with warm caches, 0.88x / 0.87x after a 64 MB flush; a bf16w forward of 1-10 tokens
// 0.967-0.983x where an identical build ran 0.990-1.007x; a float32 one within the noise (the 4-row
// build 1.00-1.02x against it, an identical build 0.99-1.02x). With AVX2 (16 registers: 12
// accumulators) the calls at 3-10 rows ran 0.84-0.96x but a forward 0.99-1.01x, so it keeps 4.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t RT = 6;
#else
constexpr int64_t RT = 4;
#endif

// One tile: rows r = 0..R-1 (R <= RT) of one kv head, row r's query q[r] (d floats), its new-key
// visibility vis[r] (k bools) and output out[r]; kt [blocks, d, B] the kv head's key blocks, values
// [cap, d]; s [RT, S] scratch for the scores.
struct Tile {
  const float* q[RT];
  const bool* vis[RT];
  float* out[RT];
  int64_t R;
};

// Scores of rows 0..R-1 of a tile against keys j0..j0+NB*VS-1 (or fewer: n < VS keys when PART), into
// s[r * S + j]: lane l of a block holds key j's score, summed over c = 0..d-1 in order by one fmadd each,
// then scaled. A key's score therefore does not depend on its lane or block, nor on the other keys or rows.
// R, NB: compile-time, so the accumulators stay in registers.
// kt: the kv head's key blocks [blocks, d, B]; VS divides B and j0, so a vector's keys share a block row.
template <int64_t R, int64_t NB, bool PART = false>
inline void score_keys(const Tile& t, const float* kt, int64_t B, int64_t d, int64_t j0, int64_t n,
                       const Vec& scale, float* s, int64_t S) {
  Vec acc[R][NB];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t b = 0; b < NB; ++b) acc[r][b] = Vec(0.f);
  const float* run[NB];  // key vector b's entries in row c = 0 of its block
  for (int64_t b = 0; b < NB; ++b) {
    const int64_t j = j0 + b * VS;
    run[b] = kt + (j / B) * d * B + j % B;
  }
  for (int64_t c = 0; c < d; ++c) {
    Vec key[NB];
    for (int64_t b = 0; b < NB; ++b) key[b] = PART ? Vec::loadu(run[b] + c * B, n) : Vec::loadu(run[b] + c * B);
    for (int64_t r = 0; r < R; ++r) {
      const Vec qc(t.q[r][c]);
      for (int64_t b = 0; b < NB; ++b) acc[r][b] = at::vec::fmadd(qc, key[b], acc[r][b]);
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t b = 0; b < NB; ++b) {
      if (PART) (acc[r][b] * scale).store(s + r * S + j0, n);
      else (acc[r][b] * scale).store(s + r * S + j0 + b * VS);
    }
}

template <int64_t R>
void score_all(const Tile& t, const float* kt, int64_t B, int64_t d, int64_t S, const Vec& scale, float* s) {
  int64_t j0 = 0;
  for (; j0 + KB * VS <= S; j0 += KB * VS) score_keys<R, KB>(t, kt, B, d, j0, KB * VS, scale, s, S);
  for (; j0 + VS <= S; j0 += VS) score_keys<R, 1>(t, kt, B, d, j0, VS, scale, s, S);
  if (j0 < S) score_keys<R, 1, true>(t, kt, B, d, j0, S - j0, scale, s, S);
}

// out[r] = sum over row r's visible keys j (cache order) of p[r][j] * values[j], den[r] = sum of p[r][j]:
// one accumulator per output element, one fmadd per visible key, in order. The head size is NV vectors
// (accumulators in registers); R rows, compile-time.
template <int64_t NV, int64_t R>
void weigh_rows(const Tile& t, int64_t r0, const float* p, int64_t S, const float* values, int64_t L, int64_t d,
                float* den) {
  Vec acc[R][NV];
  float sum[R] = {};
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < NV; ++c) acc[r][c] = Vec(0.f);
  for (int64_t j = 0; j < S; ++j) {
    Vec v[NV];
    for (int64_t c = 0; c < NV; ++c) v[c] = Vec::loadu(values + j * d + c * VS);
    for (int64_t r = 0; r < R; ++r) {
      if (j >= L && !t.vis[r0 + r][j - L]) continue;
      const float pj = p[(r0 + r) * S + j];
      sum[r] += pj;
      const Vec pv(pj);
      for (int64_t c = 0; c < NV; ++c) acc[r][c] = at::vec::fmadd(pv, v[c], acc[r][c]);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    den[r0 + r] = sum[r];
    for (int64_t c = 0; c < NV; ++c) acc[r][c].store(t.out[r0 + r] + c * VS);
  }
}

// weigh_rows over the whole tile in row groups that fit the registers; any head size (scalar) when NV = 0
template <int64_t NV>
void weigh_values(const Tile& t, const float* p, int64_t S, const float* values, int64_t L, int64_t d, float* den) {
  if constexpr (NV > 0) {
    // rows per group: RM x NV accumulators, NV value vectors and a broadcast fit the registers
    constexpr int64_t RM = std::max<int64_t>(1, std::min<int64_t>(RT, (REGS - NV - 1) / NV));
    int64_t r0 = 0;
    for (; r0 + RM <= t.R; r0 += RM) weigh_rows<NV, RM>(t, r0, p, S, values, L, d, den);
    // the rest one row at a time: a group per remainder size (one instantiation each) made the calls
    // above 1.05-1.27x slower at every row count with AVX-512
    for (; r0 < t.R; ++r0) weigh_rows<NV, 1>(t, r0, p, S, values, L, d, den);
  } else {
    for (int64_t r = 0; r < t.R; ++r) {
      float* out = t.out[r];
      std::fill(out, out + d, 0.f);
      float sum = 0.f;
      for (int64_t j = 0; j < S; ++j) {
        if (j >= L && !t.vis[r][j - L]) continue;
        const float pj = p[r * S + j];
        sum += pj;
        for (int64_t c = 0; c < d; ++c) out[c] += pj * values[j * d + c];
      }
      den[r] = sum;
    }
  }
}

// Kept out of line: inlined into attend's loop (GCC 12, AVX2: 16 vector registers) its weighted values ran
// 1.5x slower, a 6-row call at cache 300 1.35x (EPYC Zen 4, 2026-12-06).
#if defined(__GNUC__) || defined(__clang__)
#define ATT_NOINLINE __attribute__((noinline))
#elif defined(_MSC_VER)
#define ATT_NOINLINE __declspec(noinline)
#else
#define ATT_NOINLINE
#endif

// The whole tile: scores, softmax over each row's visible keys, weighted values, normalised.
ATT_NOINLINE void attend_tile(const Tile& t, const float* kt, const float* values, int64_t B, int64_t S, int64_t L,
                              float scale, int64_t d, float* s) {
  const Vec sv(scale);
  switch (t.R) {  // RT == 4 or 6
    case 1: score_all<1>(t, kt, B, d, S, sv, s); break;
    case 2: score_all<2>(t, kt, B, d, S, sv, s); break;
    case 3: score_all<3>(t, kt, B, d, S, sv, s); break;
    case 4: score_all<4>(t, kt, B, d, S, sv, s); break;
    case 5: score_all<std::min<int64_t>(5, RT)>(t, kt, B, d, S, sv, s); break;
    default: score_all<RT>(t, kt, B, d, S, sv, s); break;
  }
  for (int64_t r = 0; r < t.R; ++r) {
    float* sr = s + r * S;
    // the max over the visible keys (order-free): the committed ones by vectors, the new ones by the mask
    Vec mv(-std::numeric_limits<float>::infinity());
    int64_t j = 0;
    for (; j + VS <= L; j += VS) mv = at::vec::maximum(mv, Vec::loadu(sr + j));
    float lanes[VS];
    mv.store(lanes);
    float m = lanes[0];
    for (int64_t l = 1; l < VS; ++l) m = std::max(m, lanes[l]);
    for (; j < S; ++j)
      if (j < L || t.vis[r][j - L]) m = std::max(m, sr[j]);
    // exp(s - m) elementwise (masked keys' values are computed and never read)
    mv = Vec(m);
    for (j = 0; j + VS <= S; j += VS) (Vec::loadu(sr + j) - mv).exp_u20().store(sr + j);
    if (j < S) (Vec::loadu(sr + j, S - j) - mv).exp_u20().store(sr + j, S - j);
  }
  float den[RT];
  if (d == VS) weigh_values<1>(t, s, S, values, L, d, den);
  else if (d == 2 * VS) weigh_values<2>(t, s, S, values, L, d, den);
  else if (d == 4 * VS) weigh_values<4>(t, s, S, values, L, d, den);
  else if (d == 8 * VS) weigh_values<8>(t, s, S, values, L, d, den);
  else if (d == 16 * VS) weigh_values<16>(t, s, S, values, L, d, den);
  else weigh_values<0>(t, s, S, values, L, d, den);
  for (int64_t r = 0; r < t.R; ++r) {
    const float inv = 1.f / den[r];
    for (int64_t c = 0; c < d; ++c) t.out[r][c] *= inv;
  }
}

}  // namespace

// q [1, H, k, d] rotated queries; kt [Hkv, blocks, d, B] the layer's keys (in blocks: see score_keys;
// blocks * B >= capacity, B a multiple of the vector size), vc [Hkv, capacity, d] its values, the
// committed entries 0..L-1 and this step's k new ones at L..L+k-1; mask [k, k] bool (True: new token i
// sees new token j), None = causal; next: the o-projection's packed weight, whose start a thread done with
// its items prefetches while the others finish (small_gemm.cpp's prefetch_start), or None. Returns [k, H * d]:
// row i holds head h's output at columns h*d..h*d+d.
void prefetch_run_start(const c10::optional<at::Tensor>& wp, int64_t M, int64_t t,
                        const std::function<bool()>& waiting);

at::Tensor attend(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& vc, int64_t L,
                  const c10::optional<at::Tensor>& mask, double scale, const c10::optional<at::Tensor>& next) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.is_contiguous() && q.dim() == 4 && q.size(0) == 1 && q.device().is_cpu(),
              "attend: q must be a contiguous float32 CPU tensor [1, H, k, d]");
  TORCH_CHECK(kt.scalar_type() == at::kFloat && kt.is_contiguous() && kt.dim() == 4 && vc.scalar_type() == at::kFloat &&
                  vc.is_contiguous() && vc.dim() == 3,
              "attend: the caches must be contiguous float32, keys [Hkv, blocks, d, B], values [Hkv, capacity, d]");
  const int64_t H = q.size(1), k = q.size(2), d = q.size(3), Hkv = vc.size(0), cap = vc.size(1), B = kt.size(3);
  TORCH_CHECK(vc.size(2) == d && kt.size(0) == Hkv && kt.size(2) == d && kt.size(1) * B >= cap && H % Hkv == 0,
              "attend: heads or head size of q and the caches disagree");
  TORCH_CHECK(B % VS == 0, "attend: keys per block (", B, ") must be a multiple of the vector size ", VS);
  TORCH_CHECK(L >= 0 && L + k <= cap, "attend: cache overflow");
  std::vector<char> causal;
  const bool* vis = nullptr;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->is_contiguous() && mask->dim() == 2 && mask->size(0) == k &&
                    mask->size(1) == k,
                "attend: mask must be a contiguous bool [k, k]");
    vis = mask->data_ptr<bool>();
  } else {
    causal.assign(static_cast<size_t>(k * k), 0);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j <= i; ++j) causal[i * k + j] = 1;
    vis = reinterpret_cast<const bool*>(causal.data());
  }
  // reach[i]: 1 + the last new key token i sees (0: none). A tile scores keys up to L + its rows' largest reach,
  // not all L + k: the keys past it are masked for every row of the tile, and a masked key is never read (see
  // Exactness), so each row's bits are unchanged. Why: a causal prefill of n tokens scored, exponentiated and
  // walked n keys for every row, twice the keys its rows see.
  std::vector<int64_t> reach(static_cast<size_t>(k), 0);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = k - 1; j >= 0; --j)
      if (vis[i * k + j]) {
        reach[i] = j + 1;
        break;
      }
  auto out = at::empty({k, H * d}, q.options());
  const int64_t S = L + k, groups = H / Hkv, rows = groups * k, tiles = (rows + RT - 1) / RT;
  const float* qp = q.data_ptr<float>();
  const float* kp = kt.data_ptr<float>();
  const float* vp = vc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  // a work item: one kv head's tile of up to RT (query head, new token) rows, which share its keys and values
  const int64_t items = Hkv * tiles;
  std::atomic<int64_t> done{0};  // items finished, by every thread
  at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores(static_cast<size_t>(RT * S));
    for (int64_t item = b; item < e; ++item) {
      const int64_t g = item / tiles, r0 = (item % tiles) * RT;
      Tile t{};
      t.R = std::min<int64_t>(RT, rows - r0);
      int64_t St = L;  // keys the tile's rows see lie in 0..St-1
      for (int64_t r = 0; r < t.R; ++r) {
        const int64_t h = g * groups + (r0 + r) / k, i = (r0 + r) % k;  // query head h, new token i
        t.q[r] = qp + (h * k + i) * d;
        t.vis[r] = vis + i * k;
        t.out[r] = op + i * H * d + h * d;
        St = std::max(St, L + reach[i]);
      }
      attend_tile(t, kp + g * kt.size(1) * d * B, vp + g * cap * d, B, St, L, fscale, d, scores.data());
    }
    done.fetch_add(e - b, std::memory_order_relaxed);
    // while others still work (never where this thread ran them all): the start of its run of the o-projection
    prefetch_run_start(next, k, at::get_thread_num(), [&] { return done.load(std::memory_order_relaxed) < items; });
  });
  return out;
}

void register_attention(pybind11::module_& m) {
  m.def("attend", &attend, "a step's query rows against the layer's KV cache and mask -> [k, H * d]",
        pybind11::arg("q"), pybind11::arg("kt"), pybind11::arg("vc"), pybind11::arg("L"), pybind11::arg("mask"),
        pybind11::arg("scale"), pybind11::arg("next") = pybind11::none());
}
