// Few-row matmul for decoding, one portable source: y[M, N] = x[M, K] @ W[N, K]^T, x and y float32,
// W float32 or bfloat16 (converted to float32 in registers, exactly).
//
// Why: a decoding step multiplies 1-32 rows by every weight matrix, so its cost is streaming the
// weights from memory once. Library GEMMs either re-lay the weights out per call or take slower paths
// at a few rows (see the backend's Projection). Here the weights are packed once into 16-column
// stripes [N/16][K][16] (a stripe row is one 64-byte cache line in float32); four consecutive stripes
// form a 64-column block, the unit of work of a thread. Each thread streams a contiguous run of blocks,
// and every row of x is multiplied against a block while it is in registers/L1-L2.
//
// Exactness: each output element is ONE float32 accumulator summed over k = 0..K-1 in order with the
// same operation (at::vec::fmadd), whatever M is and whichever row tile or column subtile the element
// falls in. So a row's result is bitwise independent of the other rows of the call: a 1-token step, a
// 6-token lookahead step and a 300-row prefill give identical results for a shared row. Only the column
// subtiling changes with M (it decides which accumulators live in registers together, never an
// element's summation order): 1 row keeps a whole block's columns in independent accumulators to hide
// the FMA latency, more rows take narrower subtiles times up to 6 rows to fit the register file.
// bfloat16 weights are widened exactly (bits << 16), so they give bitwise the float32 result on the
// same weights rounded to bfloat16.
//
// Portability: written once against at::vec::Vectorized<float> (torch's headers), which compiles to
// AVX-512, AVX2, NEON, SVE or a generic array fallback depending on the CPU_CAPABILITY_* macro and the
// compiler's target flags; the Python loader builds one extension per variant from this same text.
// Build with -ffp-contract=off: the explicit fmadd stays fused where the ISA has FMA (it is an
// intrinsic), and the generic fallback's a * b + c is never contracted differently per tile.
//
// Headers: the few ATen ones needed plus torch's pybind11 tensor casters, not <torch/extension.h>
// (all of libtorch's C++ API: about twice the compile time).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>

void silu_mul_row(const float* g, const float* u, float* o, int64_t n);  // layer_ops.cpp: silu(g) * u

namespace {

using Vec = at::vec::Vectorized<float>;
using IVec = at::vec::Vectorized<int32_t>;
using bf16 = c10::BFloat16;

constexpr int64_t VS = Vec::size();        // floats per vector: 16 AVX-512, 8 AVX2/generic, 4 NEON
constexpr int64_t SW = 16;                 // columns per stripe (one 64-byte line of float32)
constexpr int64_t NSB = 4;                 // stripes per block
constexpr int64_t BN = SW * NSB;           // columns per block, the unit of work of a thread
constexpr int64_t SV = SW / VS > 0 ? SW / VS : 1;  // vectors per stripe
static_assert(SW % VS == 0, "a stripe must be a whole number of vectors");
// PAIRED (x86 AVX2/AVX-512): bfloat16 weights are stored in stripes of UWB columns, each k row of each
// 2*VS columns interleaved so that one VS-lane int32 load holds two vectors: lane j = column j (low
// half) and column VS + j (high half), unpacked exactly by a shift and a mask. Against at::vec's
// widening load (a cross-lane shuffle per vector), interleaved A/B runs on the EPYC put a forward's
// 1-row bf16 matmuls at 0.88-0.95x with AVX-512 (neutral with AVX2). Elsewhere (generic arrays, NEON: not
// measured or slower) the stripes are float32's, widened by at::vec::load_fp32_from_bf16.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
constexpr bool PAIRED = true;
#else
constexpr bool PAIRED = false;
#endif
constexpr int64_t UWB = PAIRED && 2 * VS > SW ? 2 * VS : SW;  // 32 columns on AVX-512, else 16 (a stripe)
static_assert(!PAIRED || (IVec::size() == VS && BN % UWB == 0 && UWB % (2 * VS) == 0),
              "bfloat16 pairs are unpacked from int32 lanes and their stripes tile a block");
template <typename T>
constexpr bool PAIRS = PAIRED && sizeof(T) == 2;  // T's weights stored and loaded in pairs
template <typename T>
constexpr int64_t UW = PAIRS<T> ? UWB : SW;  // columns per stored stripe of T
// Column subtiles (stripes handled together) by row count; all divide NSB. Chosen so that the
// accumulators (rows x stripes x SV), the weights of one k (stripes x SV) and a broadcast fit the
// register file: 16 registers on AVX2 / x86 generic, 32 on AVX-512 and aarch64.
// From 3 rows on, row tiles of up to MT_MAX rows against NSM stripes. AVX-512 takes 12 rows x 2 stripes
// (float32 3-6 rows on Zen 4: 6 x 4, see MT_F32), so a lookahead step (3-12 rows) is one row tile: each weight line
// is loaded once, with all rows' FMAs hidden under the stream. Against 6 rows x 4 stripes (two tiles from 7
// rows on, the second re-reading the block from L2), interleaved `kernels.bench`-style A/B runs on the EPYC
// (2026-12-02) put a forward's matmuls at 0.88-0.95x for 3-6 rows and 0.76-0.95x for 7-32 rows, in float32
// and bfloat16; 24 rows x 1 stripe was 2x slower (register spills), 1-2 rows stay at 4 stripes. AVX2's
// register file holds no wider tile (12 rows x half a stripe ran 1.1-1.6x slower), but exactly 3 rows (a
// short lookahead step) take 3 x 2 stripes there (NS3; 12 accumulators and the weights of one k in 16
// registers, the broadcast from memory): on the Xeon with AVX2 forced (2026-12-02, `kernels.bench
// --against`) a forward's 3-row matmuls ran 0.91x against 6 x 1; 3 x 2 tiles for 4-6 rows were slower.
// Not taken: 3-4 float32 rows walking the block's four stripes round robin in 512-byte chunks
// (accumulators parked in L1, k order kept) ran 0.74-0.92x on Zen 3 (six A/B runs) but 1.14-1.65x
// slower on Zen 5 with AVX2 forced, with or without prefetch, 512 or 2048-byte chunks (2026-12-03).
// SG_ZEN4: the loader's Zen 4 build of avx512 (kernels.prefers_zen4_build). It changes three choices: this tile,
// the 2-row prefetch (PREFETCH_2ROW, see PREFETCH_BYTES) and the 1-row bf16 one (see PREFETCH_ROW_BYTES).
// AVX-512, float32 weights, 3-6 rows, where the loader defines SG_ZEN4 (MT_F32 > 0): 6 rows x 4 stripes
// (NS_F32; 24 accumulators, the 4 weights of one k and a broadcast in 32 registers), without software prefetch:
// the block streams 4 lines a k step where 12 x 2 tiles stream 2 twice (with the prefetch). Which is faster
// depends on the core, so the loader picks it per CPU (kernels.prefers_zen4_build): on Zen 4 (EPYC family 25 model
// 17, 2026-12-04, `kernels.bench --against`, min of 21 interleaved reps, three runs at 34-56 GB/s) a forward's
// 3-6 row float32 matmuls ran 0.82-0.95x of 12 x 2 (an unedited copy: 0.94-1.09x); with the prefetch 1.03-1.08x;
// 7-12 rows as two 6 x 4 tiles 1.02-1.13x (so those keep 12 x 2); bfloat16 3-6 rows 1.08-1.11x (so those keep it
// too). On a Xeon with AMX (family 6 model 167, 2026-12-05, the same command, three runs at 25-30 GB/s) the
// reverse: 6 x 4 ran 1.04-1.10x of 12 x 2 at 3-6 rows; on Zen 5 (twelfth run in RUNS.md, older code) 6 x 4 for
// 4-6 rows had put a 6-token forward at 1.025x.
#if defined(CPU_CAPABILITY_AVX512)
constexpr const char* ISA = "AVX512";
constexpr int NS1 = 4, NS2 = 4, NS3 = 2, NSM = 2, MT_MAX = 12;  // 1 row: 4 acc; 2 rows: 8; 12 rows: 24 (+2 weights)
#if defined(SG_ZEN4)
constexpr int NS_F32 = 4, MT_F32 = 6;  // float32, 3-6 rows: 24 acc (+4 weights)
#else
constexpr int NS_F32 = NSM, MT_F32 = 0;  // float32 3-6 rows as bfloat16's: 12 x 2 tiles
#endif
#elif defined(CPU_CAPABILITY_AVX2)
constexpr const char* ISA = "AVX2";
constexpr int NS1 = 4, NS2 = 2, NS3 = 2, NSM = 1, MT_MAX = 6;  // 1 row: 8 acc; 2: 8 (+4 weights); 3: 12 (+4); 6: 12 (+2)
constexpr int NS_F32 = NSM, MT_F32 = 0;  // no float32-only tile
#elif defined(CPU_CAPABILITY_SVE256) || defined(CPU_CAPABILITY_SVE)
constexpr const char* ISA = "SVE";
constexpr int NS1 = 4, NS2 = 4, NS3 = 2, NSM = 2, MT_MAX = 6;
constexpr int NS_F32 = NSM, MT_F32 = 0;  // no float32-only tile
#elif defined(__aarch64__)
constexpr const char* ISA = "NEON";
constexpr int NS1 = 4, NS2 = 2, NS3 = 1, NSM = 1, MT_MAX = 6;  // 1 row: 16 acc; 2 rows: 16 (+8); 6 rows: 24 (+4)
constexpr int NS_F32 = NSM, MT_F32 = 0;  // no float32-only tile
#else
// at::vec's generic arrays, which the compiler vectorizes itself (SSE2 on plain x86-64): it keeps 1-2
// row tiles in registers (10-15 GFLOP/s per core here) but not more (2-4 GFLOP/s), so 2-row tiles
constexpr const char* ISA = "DEFAULT";
constexpr int NS1 = 4, NS2 = 2, NS3 = 2, NSM = 2, MT_MAX = 2;
constexpr int NS_F32 = NSM, MT_F32 = 0;  // no float32-only tile
#endif

#if (defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)) && !defined(SG_ZEN4)
constexpr bool PREFETCH_BF16_ROW = true;  // see PREFETCH_ROW_BYTES (the Zen 4 build goes without)
#else
constexpr bool PREFETCH_BF16_ROW = false;
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SG_PREFETCH(p, l2) __builtin_prefetch((p), 0, (l2) ? 2 : 3)
#else
#define SG_PREFETCH(p, l2) ((void)0)
#endif

// One weight vector of VS floats from float32, or from bfloat16 in float32's stripes (exact widening)
inline Vec load_w(const float* p) { return Vec::loadu(p); }
inline Vec load_w(const bf16* p) {
  Vec out;
  at::vec::load_fp32_from_bf16(p, out);
  return out;
}

// Offset of a tile's stored stripe s: stripes `stripe` elements apart within a block, and a tile wider than
// a block (TWO_BLOCKS) continues into the next block, `bstride` elements on
template <typename T>
inline int64_t soff(int64_t s, int64_t stripe, int64_t bstride) {
  constexpr int64_t per_block = NSB * SW / UW<T>;  // stored stripes per block
  return (s / per_block) * bstride + (s % per_block) * stripe;
}

// Weight row k of a tile's NS stripes (wk: its first stripe's row k; stored stripes at soff) as float32
// vectors: wv[s][v] holds columns s * SW + v * VS ... + VS - 1 of the tile
template <typename T, int NS>
inline void load_row(Vec (&wv)[NS][SV], const T* wk, int64_t stripe, int64_t bstride) {
  if constexpr (PAIRS<T>) {
    static_assert((NS * SV) % 2 == 0 && (NS * SW) % UWB == 0, "bfloat16 tiles take whole pairs and stripes");
    const IVec shift(16), high(int32_t(0xFFFF0000u));
    for (int q = 0; q < NS * SV / 2; ++q) {  // vectors 2q and 2q + 1 from one load: exact float32 values
      const int64_t c = q * 2 * VS;  // the pair's first column in the tile
      const IVec raw = IVec::loadu(wk + soff<T>(c / UWB, stripe, bstride) + c % UWB);
      wv[2 * q / SV][2 * q % SV] = at::vec::cast<float>(raw << shift);
      wv[(2 * q + 1) / SV][(2 * q + 1) % SV] = at::vec::cast<float>(raw & high);
    }
  } else {
    for (int s = 0; s < NS; ++s)
      for (int v = 0; v < SV; ++v) wv[s][v] = load_w(wk + soff<T>(s, stripe, bstride) + v * VS);
  }
}

// Software prefetch, this many bytes ahead in each stripe, in the first row tile of a block (the one
// that streams it from memory), where the tile does enough arithmetic per weight line: from 3 rows on
// with float32 weights, from 2 with bfloat16 (twice the weights per line). Measured on Zen 3 (AVX2, 2
// threads, paired runs): 12-25% faster there; slower (up to 30%) at 1-2 float32 rows, where the loads
// of 2-4 stripes at once already keep enough lines in flight. Not with 4 stripes at once (AVX-512's
// subtiles; there GCC also runs out of registers for the addresses). 0 turns it off. The AVX2 build also
// prefetches in 1-row bfloat16 tiles (PREFETCH_BF16_ROW): on the EPYC with AVX2 forced, eight paired
// `kernels.bench` runs put a forward's 1-row bf16 matmuls at 0.44-0.58x the float32 ones with it (median
// 0.57x) and 0.61-0.74x without (median 0.66x). So does the AVX-512 build: on the EPYC it showed no
// consistent effect there (0.53-0.90x against 0.57-0.64x in six pairs), on a Xeon with AMX (2026-12-02,
// `kernels.bench --against`, 4 interleaved runs) it put the 1-row bf16 matmuls at 0.88-0.93x.
// 2-row tiles of 4 stripes (AVX-512's NS2) prefetch too, float32 and bfloat16: without, a 2-token step's
// matmuls cost 1.04-1.07x (float32) and 1.10-1.19x (bf16) a 1-token one's, and every no-draft step of
// lookahead's (1,2,1) shapes has 2 tokens. On the Xeon with AMX (2026-12-05, `kernels.bench --rows 1 2 3
// --against`, min of 15-21 interleaved reps, 25 GB/s) a forward's 2-row bf16 matmuls ran 0.83-0.93x of an
// unedited copy's (seven runs) and float32 0.91-0.97x (four); 1 and 3 rows unchanged. Spanning two blocks,
// as 1-row bf16 tiles do, gained nothing alone and nothing over the prefetch. AVX2's 2-row tiles (2
// stripes) already prefetched in bf16 and stay without in float32 (with it: 1.17x at 2 rows, Zen 4 at 54 GB/s).
// On Zen 4 (SG_ZEN4) the 2-row prefetch costs instead: 2026-12-06, `kernels.bench --rows 1 2 3 --dtypes fp32
// bf16 --against`, min of 21 interleaved reps, against a copy without it, a forward's 2-row matmuls ran 13.8
// against 10.5 ms (float32) and 7.9 against 6.2 (bf16) at 55 GB/s, 17.4 against 16.2 and 8.7 against 8.5 at 34
// GB/s (an unedited copy: 13.7 and 7.6, 17.4 and 8.8); 1 and 3 rows alike. It had made a 2-token step cost
// 1.32-1.38 1-token steps at fast memory there (1.00-1.05 before it), and lookahead's (1,2,1) shapes feed 2
// tokens on every step without a draft. So the Zen 4 build leaves it out.
constexpr int64_t PREFETCH_BYTES = 2048;
#if defined(SG_ZEN4)
constexpr bool ZEN4 = true;
#else
constexpr bool ZEN4 = false;
#endif
constexpr bool PREFETCH_2ROW = !ZEN4;
// ... but 1-row bfloat16 tiles prefetch only PREFETCH_ROW_BYTES ahead: on Zen 4 (EPYC family 25 model
// 17, 2026-12-04, `kernels.bench --rows 1 --dtypes bf16 --against`, min of 21-31 interleaved reps, eight
// runs at 30-52 GB/s) a forward's 1-row bf16 matmuls ran 0.86-0.98x (AVX-512) and 0.86-0.97x (AVX2 forced)
// of 2048 bytes ahead; no prefetch at all ran 0.93-0.98x of 512 with AVX-512 but 1.00-1.09x with AVX2.
// The Xeon's and Zen 5's figures above were taken at 2048; 512 keeps a prefetch where they wanted one.
// The Zen 4 build (SG_ZEN4, AVX-512 only) goes without: on Zen 4 (2026-12-06, both builds in one process,
// ~5,000 interleaved rounds binned by the bandwidth probed in each, as `kernels.bench --bins` does) a forward's
// 1-row bf16 matmuls ran 0.94x of 512 ahead at 46-53 GB/s (6.39 against 6.78 ms) and 0.97-0.98x at 29-33 GB/s,
// and a whole 1-token bf16w step 0.96x at 49 GB/s (7.62 against 7.97 ms) and 0.97x at 46 (RUNS.md, thirtieth run).
// The avx512 build that prefetches here (not Zen 4's) runs 2048 ahead again: on the Xeon (family 6 model 207,
// 2026-12-07, `kernels.bench_step --dtype bf16w --tokens 1 --reps 301 --against`, three runs at 23-26 GB/s) a
// whole 1-token bf16w step ran 0.975x, 0.988x of 512 ahead (quartiles 0.95-1.01), 1024 0.972x, 1536 0.993x,
// 3072 0.996x, 256 1.035x; a float32 step (its head's bfloat16 screen) 0.994x. AVX2 keeps Zen 4's 512; forced
// on the Xeon, 2048 ran 0.974x there too (1024 0.985x, 4096 1.005x), but Zen 4's AVX2 lost 3-16% at 2048.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t PREFETCH_ROW_BYTES = 2048;
#else
constexpr int64_t PREFETCH_ROW_BYTES = 512;
#endif
// ... and AVX2's float32 tiles of 3-6 rows (one row tile, 6 x 1 stripe or 3 x 2) prefetch PREFETCH_F32_TILE_BYTES
// ahead: on Zen 4 with AVX2 forced (2026-12-06, `kernels.bench --variants avx2 --rows 1 3 4 5 6 8 --against`, each
// column's weights in a huge-page arena, min of 200 interleaved reps, three bandwidth bins, 35-51 GB/s) a forward's
// float32 matmuls ran 0.89-0.91x of 2048 ahead at 4 rows, 0.93-0.95x at 5, 0.95-0.96x at 6, 0.97-1.01x at 3; 8192
// ahead 0.93-0.98x at 4-6 rows. Two-tile blocks (7+ rows) keep 2048 (4096 there: 1.01-1.04x at 8 rows), as does
// bfloat16 (4096: 1.04x at 3 rows). The thirty-fifth run's 4096 (1.06x) was taken in 4 KB pages (RUNS.md).
#if defined(CPU_CAPABILITY_AVX2)
constexpr int64_t PREFETCH_F32_TILE_BYTES = 4096;
#else
constexpr int64_t PREFETCH_F32_TILE_BYTES = PREFETCH_BYTES;
#endif

// Which cache a prefetch fills. The next block's lines (see block) go to L2: a block (147-393 KB) does not
// fit L1 (32-48 KB), so lines prefetched there a block ahead would be evicted before use. The stream prefetch
// of a float32 tile of 7+ rows (AVX-512's 12 x 2) also goes to L2; every other stream prefetch to L1 (likely
// why: a wide tile's FMAs fill the core's window, and prefetches into L1 queue for its few miss buffers).
// Measured on Zen 4 (EPYC family 25 model 17, 2026-12-04, `kernels.bench --against`, min of 21 interleaved
// reps at 35-57 GB/s): a forward's 7 and 11-row float32 matmuls ran 0.90x and 0.94x with AVX-512, 0.89x and
// 0.75x with AVX2 forced; AVX2 bfloat16 0.81x and 0.88x; 1-6 rows and AVX-512 bfloat16 unchanged. All
// prefetches to L2 had put AVX2's 6-row float32 matmuls at 1.4x and AVX-512's 3-7-row bfloat16 ones at
// 1.15-1.3x. A whole SmolLM2 step (median of 5 interleaved curves at a fast-memory moment, t(1) 11.5 ms): 7
// and 11 tokens 0.92x and 0.95x with AVX-512, 0.94x and 0.82x with AVX2 forced (with the vectorized RMSNorm
// of layer_ops.cpp, which alone gave 0.98x at 6 and 11 tokens).
template <typename T, int MT>
constexpr bool STREAM_L2 = sizeof(T) == sizeof(float) && MT >= 7;

// A second stream prefetch, into L2, PREFETCH_L2_BYTES ahead of the line read: beside every L1 one on the
// avx512 build (ROW_L2_BESIDE), and alone in 1-row float32 tiles, which prefetch nothing into L1
// (ROW_L2_ALONE). Why: on the Xeon (family 6 model 207, 2026-12-07, `kernels.bench_step --against`, whole
// SmolLM2 steps at cache 300, 81-201 interleaved rounds, ratios within a round) a bf16w step ran 0.94x at 1
// token (0.935-0.942x at 3-6 KB ahead), 0.96x at 2, 0.93x at 3-4, 0.95x at 6, 0.98x at 8, 1.00x at 16; float32
// 0.95-0.96x at 1-2 (2 KB ahead 0.949x, 8 KB 0.970x), 0.92-0.93x at 3-4, 0.95x at 6, 0.98x at 8, 1.00x at 16.
// A scratch walk of the bf16 stripes with a 1-row tile's arithmetic read 26 GB/s with the L1 prefetch alone and
// 29 with both, as fast as the walk without arithmetic. With AVX2 forced only the 1-row float32 tiles gained
// (0.954-0.961x); bf16w steps ran 0.99-1.04x, float32 6-token ones 1.02x, so the avx2 build keeps ROW_L2_ALONE
// only. Not measured on Zen: the Zen 4 build (SG_ZEN4) takes neither.
constexpr int64_t PREFETCH_L2_BYTES = 4096;
#if defined(CPU_CAPABILITY_AVX512) && !defined(SG_ZEN4)
constexpr bool ROW_L2_BESIDE = true;
#else
constexpr bool ROW_L2_BESIDE = false;
#endif
#if defined(CPU_CAPABILITY_AVX2) || (defined(CPU_CAPABILITY_AVX512) && !defined(SG_ZEN4))
constexpr bool ROW_L2_ALONE = true;
#else
constexpr bool ROW_L2_ALONE = false;
#endif
// But the avx512 build's one-tile blocks of 7-12 float32 rows stream into L1, with the L2 prefetch beside: on
// the Xeon (2026-12-07, `kernels.bench_step --dtype float32 --tokens 7 9 11 --reps 81 --against`) a 7 / 9 /
// 11-token step ran 0.946x / 0.927x / 0.935x of the L2 stream alone (9 and 11 tokens with the second L2 prefetch
// added to the L2 stream: 0.969x / 0.964x). Chunked blocks (13+ rows) keep STREAM_L2: a 16-token step ran
// 1.03x with them streaming into L1 as well.
template <typename T, int MT>
constexpr bool TILE_L2 = !ROW_L2_BESIDE && STREAM_L2<T, MT>;

// One k step of a tile: weight row k of each stripe (wk), every row of the tile against it
template <typename T, int MT, int NS>
inline void step(Vec (&acc)[MT][NS][SV], const float* xk, int64_t K, const T* wk, int64_t stripe, int64_t bstride) {
  if constexpr (MT == 1 && !PAIRS<T>) {  // each weight vector used once: load it next to its FMA
    const Vec xb(xk[0]);
    for (int s = 0; s < NS; ++s)
      for (int v = 0; v < SV; ++v)
        acc[0][s][v] = at::vec::fmadd(xb, load_w(wk + soff<T>(s, stripe, bstride) + v * VS), acc[0][s][v]);
  } else {
    Vec wv[NS][SV];
    load_row<T, NS>(wv, wk, stripe, bstride);
    for (int m = 0; m < MT; ++m) {
      const Vec xb(xk[m * K]);
      for (int s = 0; s < NS; ++s)
        for (int v = 0; v < SV; ++v) acc[m][s][v] = at::vec::fmadd(xb, wv[s][v], acc[m][s][v]);
    }
  }
}

// One tile: MT rows (x: row stride K) x NS stripes (w: the first, stored stripes K*UW elements apart), k in
// [k0, k1) (k1 < 0: all k), written to y (row stride ldy; `cols` valid columns from the tile's first); where
// the shape prefetches, each weight line read is prefetched again `pf` bytes further on (0: the line itself,
// a no-op), into L2 where L2 is set (see STREAM_L2), else into L1
template <typename T, int MT, int NS, bool L2 = false>
inline void tile(const float* x, int64_t K, const T* w, float* y, int64_t ldy, int64_t cols, uintptr_t pf,
                 int64_t bstride = 0, int64_t k0 = 0, int64_t k1 = -1) {
  if (k1 < 0) k1 = K;
  Vec acc[MT][NS][SV];  // from k0 > 0 on: the sums so far, parked in y (see block_chunked)
  for (int m = 0; m < MT; ++m)
    for (int s = 0; s < NS; ++s)
      for (int v = 0; v < SV; ++v) acc[m][s][v] = k0 == 0 ? Vec(0.f) : Vec::loadu(y + m * ldy + s * SW + v * VS);
  constexpr int64_t U = UW<T>, NST = NS * SW / U;  // stored stripes of the tile
  const int64_t stripe = K * U;
  constexpr bool PREFETCH = (MT * int64_t(sizeof(float) / sizeof(T)) >= 3 && NS <= 2) ||
                            (PREFETCH_BF16_ROW && MT == 1 && sizeof(T) == 2) || (PREFETCH_2ROW && MT == 2 && NS > 2);
  // bytes ahead of stored stripe s's row k, added as an integer: past the packed weights' end a prefetch is a
  // no-op, never a fault
  auto ahead = [&](int s, int64_t k, uintptr_t bytes) {
    return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(w + soff<T>(s, stripe, bstride) + k * U) + bytes);
  };
  // the second stream, into L2 (see PREFETCH_L2_BYTES): beside an L1 stream, or alone in 1-row float32 tiles
  constexpr bool L2_AHEAD = PREFETCH ? ROW_L2_BESIDE && !L2 : ROW_L2_ALONE && MT == 1 && sizeof(T) == sizeof(float);
  if constexpr (PREFETCH || L2_AHEAD) {  // one loop either way (two made GCC keep accumulators in memory)
    for (int64_t k = k0; k < k1; ++k) {
      if constexpr (PREFETCH)
        for (int s = 0; s < NST; ++s) SG_PREFETCH(ahead(s, k, pf), L2);
      if constexpr (L2_AHEAD)
        for (int s = 0; s < NST; ++s) SG_PREFETCH(ahead(s, k, PREFETCH_L2_BYTES), true);
      step<T, MT, NS>(acc, x + k, K, w + k * U, stripe, bstride);
    }
  } else {
    for (int64_t k = k0; k < k1; ++k) step<T, MT, NS>(acc, x + k, K, w + k * U, stripe, bstride);
  }
  if (cols >= NS * SW) {
    for (int m = 0; m < MT; ++m)
      for (int s = 0; s < NS; ++s)
        for (int v = 0; v < SV; ++v) acc[m][s][v].store(y + m * ldy + s * SW + v * VS);
  } else if (cols > 0) {  // the last block's padding columns are not stored
    float buf[NS * SW];
    for (int m = 0; m < MT; ++m) {
      for (int s = 0; s < NS; ++s)
        for (int v = 0; v < SV; ++v) acc[m][s][v].store(buf + s * SW + v * VS);
      std::memcpy(y + m * ldy, buf, cols * sizeof(float));
    }
  }
}

// MT rows against a block's stripes, NS at a time (cols valid columns from the block's first)
template <typename T, int MT, int NS, bool L2>
inline void tile_block(const float* x, int64_t K, const T* wb, float* y, int64_t ldy, int64_t cols, uintptr_t pf) {
  for (int64_t s0 = 0; s0 < NSB && cols > s0 * SW; s0 += NS)
    tile<T, MT, NS, L2>(x, K, wb + s0 * K * SW, y + s0 * SW, ldy, cols - s0 * SW, pf);
}

// A row tile of mt <= MT rows (one instantiation per row count)
// (NEXT: pf reaches into the next block, prefetched to L2)
template <typename T, int NS, int MT, bool NEXT>
inline void rows_tile(int64_t mt, const float* x, int64_t K, const T* wb, float* y, int64_t ldy, int64_t cols,
                      uintptr_t pf) {
  if constexpr (MT > 1) {
    if (mt < MT) return rows_tile<T, NS, MT - 1, NEXT>(mt, x, K, wb, y, ldy, cols, pf);
  }
  tile_block<T, MT, NS, NEXT || TILE_L2<T, MT>>(x, K, wb, y, ldy, cols, pf);
}

// A row tile of mt <= MT rows over k in [k0, k1) of NS stripes (w), its sums carried in buf (row stride
// NS * SW, every column stored)
template <typename T, int NS, int MT>
inline void rows_chunk(int64_t mt, const float* x, int64_t K, const T* w, float* buf, uintptr_t pf, int64_t k0,
                       int64_t k1) {
  if constexpr (MT > 1) {
    if (mt < MT) return rows_chunk<T, NS, MT - 1>(mt, x, K, w, buf, pf, k0, k1);
  }
  tile<T, MT, NS, STREAM_L2<T, MT>>(x, K, w, buf, NS * SW, NS * SW, pf, 0, k0, k1);
}

// 2 to CHUNK_TILES<T> row tiles (float32: AVX2 7-24 rows, AVX-512 13-48; bfloat16: 7-12 and 13-24) take
// turns on each KC k rows of a stripe group: the first streams those rows' weights from memory (prefetching
// PREFETCH_BYTES ahead) and the others find them in L1, so the weight stream runs under every tile's
// arithmetic, not under the first tile's alone. Each output is still one accumulator summed in k order,
// parked in buf between chunks (a float32 store and load: exact). Against whole-K tiles one after the
// other, the later ones re-reading the block from L2 and the last prefetching the next block (on a Xeon with
// AMX, 2026-12-05, `kernels.bench --against`, min of 15 interleaved reps, two runs at 27 GB/s, each against
// our build and an unedited copy): a forward's float32 matmuls with AVX2 forced ran 0.84-0.91x at 7 rows,
// 0.86-0.94x at 8-12, 0.90-0.96x at 13-16, 0.95-0.99x at 24; bfloat16 0.87-0.91x at 7 rows, 0.93-1.01x at
// 8-12, but 1.02-1.05x at 16 (three tiles; so bfloat16 stops at two); AVX-512 (one tile up to 12 rows)
// float32 0.88-0.90x at 13 rows, 0.90-0.95x at 16, 0.97-1.02x at 24, bfloat16 0.98-1.0x at 13. 64 k rows
// (4 KB of a float32 stripe) beat 32, 128 and 256; also prefetching the next block from the last tile, as
// whole-K tiles do, was slower (7 rows: 24.5 against 22.3 ms).
constexpr int64_t KC = 64;
template <typename T>
constexpr int64_t CHUNK_TILES = sizeof(T) == sizeof(float) ? 4 : 2;
template <typename T, int NS, int MT>
void block_chunked(const float* x, int64_t M, int64_t K, const T* wb, float* y, int64_t ldy, int64_t cols,
                   int64_t tiles) {
  alignas(64) float buf[CHUNK_TILES<T> * MT * NS * SW];
  // float32: the later tiles prefetch the next chunk's lines (KC rows on), so the stream runs under their turns
  // too, not only under the first tile's. Zen 4 (2026-12-06, `kernels.bench --against`, huge pages, min of 80-150
  // interleaved reps, 39-54 GB/s): a forward's matmuls with AVX2 forced ran 0.87-0.90x at 7 rows, 0.92-0.96x at 8,
  // 0.85-0.88x at 11 (bfloat16 0.96-1.0x, so it keeps none); AVX-512 0.80x at 13, 0.875x at 16, 0.95x at 24.
  const uintptr_t later = sizeof(T) == sizeof(float) ? uintptr_t(KC * UW<T> * sizeof(T)) : 0;  // one chunk's bytes
  for (int64_t s0 = 0; s0 < NSB && cols > s0 * SW; s0 += NS) {
    const T* w = wb + s0 * K * SW;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t k1 = std::min(K, k0 + KC);
      for (int64_t t = 0, m0 = 0; t < tiles; ++t) {  // as block's tiles: near-equal sizes
        const int64_t mt = (M - m0) / (tiles - t);
        rows_chunk<T, NS, MT>(mt, x + m0 * K, K, w, buf + m0 * NS * SW, t == 0 ? PREFETCH_BYTES : later, k0, k1);
        m0 += mt;
      }
    }
    const int64_t c = std::min<int64_t>(NS * SW, cols - s0 * SW);  // the last block's padding is not stored
    for (int64_t m = 0; m < M; ++m) std::memcpy(y + m * ldy + s0 * SW, buf + m * NS * SW, c * sizeof(float));
  }
}

// One block against all M rows: ceil(M / MT) row tiles of near-equal size (8 rows: 4 + 4, not 6 + 2); 2 to
// CHUNK_TILES<T> of them take turns per KC k rows (block_chunked). One, or more (a prefill): the first
// streams the block from memory (prefetching PREFETCH_BYTES ahead, 1-row tiles PREFETCH_ROW_BYTES, where the
// tile shape wants it), the later ones find it in L2, and the last of those prefetches the next block of
// the thread's run (`next`) line for line into L2 as it reads this one, so memory is busy while they
// compute: measured 0.89-0.95x for 7-32 rows on AVX2 (A/B, EPYC), 0.88-0.98x for 13-32 rows on AVX-512.
template <typename T, int NS, int MT>
void block(const float* x, int64_t M, int64_t K, const T* wb, float* y, int64_t ldy, int64_t cols, bool next) {
  const int64_t tiles = (M + MT - 1) / MT;
  if (tiles >= 2 && tiles <= CHUNK_TILES<T>) return block_chunked<T, NS, MT>(x, M, K, wb, y, ldy, cols, tiles);
  const uintptr_t block_bytes = uintptr_t(NSB * K * SW * sizeof(T));
  const uintptr_t first = MT == 1                                         ? PREFETCH_ROW_BYTES
                          : sizeof(T) == sizeof(float) && tiles == 1 ? PREFETCH_F32_TILE_BYTES
                                                                     : PREFETCH_BYTES;  // the first tile's
  for (int64_t t = 0, m0 = 0; t < tiles; ++t) {
    const int64_t mt = (M - m0) / (tiles - t);
    if (t > 0 && t == tiles - 1 && next)  // the next block, into L2
      rows_tile<T, NS, MT, true>(mt, x + m0 * K, K, wb, y + m0 * ldy, ldy, cols, block_bytes);
    else
      rows_tile<T, NS, MT, false>(mt, x + m0 * K, K, wb, y + m0 * ldy, ldy, cols, t == 0 ? first : 0);
    m0 += mt;
  }
}

// 1-row bfloat16 tiles on AVX-512 span two blocks (8 accumulators, 4 stored stripes of 32 columns): a
// block alone is only 2 of them, 2 lines a k step, and that stream stalled at ~40-43 GB/s while float32's 4
// lines a k step read 60-66 (EPYC Zen 5, 2026-12-03, `kernels.bench --against`, min of 15-21 interleaved
// reps): a forward's 1-row bf16 matmuls ran 4.9-5.1 ms against 6.2-6.6 when the probe read 65-75 GB/s, and
// 0.94-1.06x at 43-49 GB/s (mostly under 1). Each output is still one accumulator summed in k order, so the
// result is bitwise the one-block tile's. Not for float32 (8 lines a k step: 8.8 against 8.2 ms at 69
// GB/s), nor three blocks (no better than two), nor AVX2 (16 accumulators fill its register file).
#if defined(CPU_CAPABILITY_AVX512)
template <typename T>
constexpr bool TWO_BLOCKS = sizeof(T) == 2;
#else
template <typename T>
constexpr bool TWO_BLOCKS = false;
#endif
template <typename T>
constexpr bool F32_TILE = MT_F32 > 0 && sizeof(T) == sizeof(float);  // T's 3-MT_F32 rows take NS_F32 x MT_F32 tiles
// Block nb of a run and, for one row of bfloat16 weights on AVX-512, the next too (b1: the claim's end);
// returns how many blocks it computed
template <typename T>
int64_t blocks_at(const float* x, int64_t M, int64_t K, const T* w, int64_t nb, int64_t b1, float* y, int64_t n_out,
                  int64_t run_end) {
  const T* wb = w + nb * NSB * K * SW;
  float* yb = y + nb * BN;
  const int64_t cols = std::min<int64_t>(BN, n_out - nb * BN);
  const bool next = nb + 1 < run_end;  // the thread's next block: its lines may be prefetched
  if (M == 1) {
    if constexpr (TWO_BLOCKS<T>) {  // this block and the next of the run, when both are whole
      if (nb + 1 < b1 && n_out - (nb + 1) * BN >= BN) {
        tile<T, 1, 2 * NSB>(x, K, wb, yb, n_out, 2 * BN, uintptr_t(PREFETCH_ROW_BYTES), NSB * K * SW);
        return 2;
      }
    }
    block<T, NS1, 1>(x, M, K, wb, yb, n_out, cols, next);
  }
  else if (M == 2)
    block<T, NS2, 2>(x, M, K, wb, yb, n_out, cols, next);
  else if (F32_TILE<T> && M <= MT_F32) {
    if constexpr (F32_TILE<T>) block<T, NS_F32, MT_F32>(x, M, K, wb, yb, n_out, cols, next);
  }
  else if (M == 3 && NS3 != NSM)
    block<T, NS3, 3>(x, M, K, wb, yb, n_out, cols, next);
  else
    block<T, NSM, MT_MAX>(x, M, K, wb, yb, n_out, cols, next);
  return 1;
}

// SwiGLU of block nb, whose first BN / 2 columns are gates and last BN / 2 the matching ups (pack's glu
// layout): silu(gate) * up into columns nb * BN / 2 ... of act [M, n_out / 2], by the thread that just
// computed the block. Why: as a separate pass (silu_mul) on the calling thread, it read the half of gate_up
// the other thread wrote, and the other thread then read its whole output back for the down projection.
// On Zen 4 when the probe read 45-50 GB/s, 30 such passes took 1.0-1.5 ms of a 6-token float32 step
// (0.2-0.3 ms with one thread), where the arithmetic alone takes ~0.15 ms. Here, a whole 6-token step ran
// 0.92-0.94x in float32 and 0.91-0.93x in bf16w at 44-48 GB/s, AVX-512 and AVX2 forced alike, a 1-token step
// 0.97-0.99x, and 0.97-1.02x at 29-33 GB/s (RUNS.md, thirty-third run). The same formula as silu_mul (one
// function, silu_mul_row), so the same bits.
inline void swiglu_block(const float* y, int64_t M, int64_t n_out, float* act, int64_t nb) {
  for (int64_t m = 0; m < M; ++m) {
    const float* g = y + m * n_out + nb * BN;
    silu_mul_row(g, g + BN / 2, act + m * (n_out / 2) + nb * (BN / 2), BN / 2);
  }
}

// Blocks [b0, b1) of a claim; act: where to write their SwiGLU (nullptr: none)
template <typename T>
void run_blocks(const float* x, int64_t M, int64_t K, const T* w, int64_t b0, int64_t b1, float* y, int64_t n_out,
                int64_t run_end, float* act) {
  for (int64_t nb = b0; nb < b1;) {
    const int64_t n = blocks_at(x, M, K, w, nb, b1, y, n_out, run_end);
    if (act != nullptr)
      for (int64_t b = nb; b < nb + n; ++b) swiglu_block(y, M, n_out, act, b);
    nb += n;
  }
}

// The blocks a claim of an M-row call takes at least: a 1-row bfloat16 tile's two on AVX-512, else one
template <typename T>
constexpr int64_t claim_unit(int64_t M) {
  return M == 1 && TWO_BLOCKS<T> ? 2 : 1;
}

// run()'s split of nb blocks: the threads that share them, and the blocks of each one's run (thread t's starts at
// block t * per), cut at whole claims of `unit` blocks
struct Split {
  int64_t threads, per;
};
inline Split split_of(int64_t nb, int64_t unit) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), nb), units = (nb + unit - 1) / unit;
  return {threads, threads > 0 ? (units + threads - 1) / threads * unit : 0};
}

// The projection a caller runs next (see prefetch_start): its packed weights as run() will split them among
// the threads. unit: claim_unit's for the call's rows.
struct NextProj {
  const char* w = nullptr;
  int64_t nb = 0, block_bytes = 0, stripes = NSB, unit = 1;  // blocks; bytes a block; stored stripes a block
};

// Blocks of its next run that a thread left without work prefetches (see prefetch_start).
constexpr int64_t IDLE_PREFETCH_BLOCKS = 2;

// Into L2, while waiting() holds, the first IDLE_PREFETCH_BLOCKS blocks of thread t's run of `next` (run's split:
// the thread starts there), each k row by k row across its stored stripes, as a 1-row tile reads them.
// Why: a call ends when its last thread does. A thread that has claimed all it can (run's stealing leaves it
// idle for at most the block another thread is finishing), or that finished its share of an attention call
// (3 kv heads on 2 threads leave one idle half the call), used to wait while the memory bus ran at one core's
// pace; now it fetches the lines it will stream first in the next call. Prefetches change no result.
// On the Xeon (family 6 model 207, 2026-12-07, `kernels.bench_step --tokens 1 6 --against <the sources before>
// <an identical copy>`, whole SmolLM2 steps at cache 300, 201-301 interleaved rounds), the build before ran, over
// this one within a round: float32 AVX-512 1.013x at 1 token and 1.014x at 6 (the copy 1.001x, 1.003x; 21 GB/s);
// AVX2 forced 1.024x, 1.017x (0.996x, 0.997x; 24 GB/s); bf16w AVX-512 1.026x, 1.008x (1.006x, 1.005x; 28 GB/s),
// AVX2 forced 1.012x, 1.004x (0.996x, 1.000x; 23 GB/s).
// One block, and no prefetch after the LM head, had gained less in scratch A/Bs (0.981-0.989x at 1 token). A debug
// build counted ~16.5 MB prefetched a float32 1-token step, from 300 waits (two a call), 61 of them a whole block.
template <typename Waiting>
void prefetch_start(const NextProj& next, int64_t t, const Waiting& waiting) {
  if (next.w == nullptr) return;
  const Split split = split_of(next.nb, next.unit);
  if (split.threads <= 1 || t >= split.threads) return;
  const int64_t b0 = t * split.per, b1 = std::min({next.nb, b0 + split.per, b0 + IDLE_PREFETCH_BLOCKS});
  const int64_t stripe = next.block_bytes / next.stripes;  // bytes of a stored stripe
  for (int64_t b = b0; b < b1; ++b) {
    const char* base = next.w + b * next.block_bytes;
    for (int64_t off = 0; off < stripe; off += 64) {
      if (off % 512 == 0 && !waiting()) return;  // every 8 lines of each stripe: is anyone still working?
      for (int64_t s = 0; s < next.stripes; ++s) SG_PREFETCH(base + s * stripe + off, true);
    }
  }
}

// Work split. Each thread owns one contiguous run of blocks (1/threads of them, cut at whole claim units),
// works through it from the front, and when done takes units from the back of the run with the most left,
// so a thread the OS descheduled (a busy machine) does not leave the others waiting for its share.
// Against runs of NB / (4 * threads) blocks handed out from one counter in turn (the split before,
// 2026-12-03, EPYC Zen 5, `kernels.bench --against`, min of 21 interleaved reps at 69-73 GB/s, where two
// identical builds differ by up to 5%): a forward's 3-6 row bf16 matmuls 0.86-0.93x, float32 0.92-0.99x,
// 1-row bf16 0.97-1.01x (AVX2 forced: 0.94-1.0x); a SmolLM2 forward 0.95-0.98x (median of 100 paired
// reps). A static split (one run each, no stealing) was as fast within that noise. Which blocks a thread
// takes never changes a result: each output is one accumulator summed in k order, whichever tile computes it.
// A run [lo, hi) is one word, so the owner (from the front) and a thief (from the back) claim blocks with
// one compare-and-swap each; one cache line per run.
struct alignas(64) Run {
  std::atomic<uint64_t> span{0};
  static uint64_t pack(int64_t lo, int64_t hi) { return uint64_t(lo) | uint64_t(hi) << 32; }
  // n blocks [b0, b1) from the front (back: from the back), fewer where fewer are left; false when none
  // are; end: where the claimer's run of consecutive blocks ends (a thief's: at its claim)
  bool claim(int64_t n, bool back, int64_t& b0, int64_t& b1, int64_t& end) {
    uint64_t cur = span.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t lo = int64_t(cur & 0xFFFFFFFFu), hi = int64_t(cur >> 32);
      if (lo >= hi) return false;
      const int64_t take = std::min(n, hi - lo);
      if (span.compare_exchange_weak(cur, back ? pack(lo, hi - take) : pack(lo + take, hi),
                                     std::memory_order_relaxed)) {
        b0 = back ? hi - take : lo;
        b1 = b0 + take;
        end = back ? b1 : hi;
        return true;
      }
    }
  }
  int64_t left() const {
    const uint64_t cur = span.load(std::memory_order_relaxed);
    return int64_t(cur >> 32) - int64_t(cur & 0xFFFFFFFFu);
  }
};

template <typename T>
void run(const float* x, int64_t M, int64_t K, const T* w, int64_t NB, float* y, int64_t n_out, float* act,
         const NextProj& next) {
  const int64_t unit = claim_unit<T>(M);
  const Split split = split_of(NB, unit);
  const int64_t threads = split.threads, per = split.per;  // per: blocks a run
  if (threads <= 1 || NB > 0xFFFFFFFFLL) {
    at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) { run_blocks(x, M, K, w, b0, b1, y, n_out, b1, act); });
    return;
  }
  std::unique_ptr<Run[]> runs(new Run[threads]);
  std::atomic<int64_t> idle{0};  // threads that found no block left to claim
  for (int64_t t = 0; t < threads; ++t)
    runs[t].span.store(Run::pack(std::min(NB, t * per), std::min(NB, (t + 1) * per)), std::memory_order_relaxed);
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {  // one t per thread (all of them where the team is smaller)
      int64_t b0, b1, end;
      // own run: half of what is left at a time, so a thief finds whole units at the back
      while (runs[t].claim(std::max(unit, runs[t].left() / 2 / unit * unit), false, b0, b1, end))
        run_blocks(x, M, K, w, b0, b1, y, n_out, end, act);
      for (;;) {  // then the others', one unit at a time from the back of the longest
        int64_t victim = -1, most = 0;
        for (int64_t v = 0; v < threads; ++v)
          if (const int64_t n = runs[v].left(); n > most) most = n, victim = v;
        if (victim < 0) break;
        if (runs[victim].claim(unit, true, b0, b1, end)) run_blocks(x, M, K, w, b0, b1, y, n_out, end, act);
      }
      idle.fetch_add(1, std::memory_order_relaxed);
    }
    // while another thread finishes its last block: the start of this thread's run of the next projection
    prefetch_start(next, at::get_thread_num(), [&] { return idle.load(std::memory_order_relaxed) < threads; });
  });
}

}  // namespace

// W [N, K] float32 (or bfloat16) -> stripes zero-padded to whole blocks: float32 [ceil(N/64)*4, K, 16];
// bfloat16 (round to nearest even) when bf16: [ceil(N/64)*64/UWB, K, UWB], each k row's 2*VS columns
// interleaved as load_row reads them (so the layout is this build's: pack and linear with one module).
// glu: W is a gate_up weight (gates [N/2, K], then ups), whose output swiglu() reads: its rows are laid out
// in groups of BN / 2 gates followed by the matching BN / 2 ups, so every block holds both halves of its
// outputs; N must be a multiple of BN.
at::Tensor pack(at::Tensor w, bool bf16_weights, bool glu) {
  TORCH_CHECK(w.dim() == 2 && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "pack: float32 or bfloat16 [out, in] weight expected");
  const auto dtype = bf16_weights ? at::kBFloat16 : at::kFloat;
  w = w.detach().to(at::kCPU).to(dtype);
  const int64_t N = w.size(0), K = w.size(1), NB = (N + BN - 1) / BN;
  if (glu) {
    TORCH_CHECK(N % BN == 0, "pack: a glu weight needs a multiple of ", BN, " rows (gates and ups), got ", N);
    w = w.view({2, NB, BN / 2, K}).transpose(0, 1).reshape({N, K});  // [block, gate/up, BN / 2, K]
  }
  auto wp = at::zeros({NB * BN, K}, w.options());
  wp.narrow(0, 0, N).copy_(w);
  if (!(bf16_weights && PAIRS<bf16>)) return wp.view({NB * NSB, SW, K}).transpose(1, 2).contiguous();
  const int64_t S = NB * BN / UWB;  // [S, K, pairs, 2, VS] -> [S, K, pairs, VS, 2]: column h * VS + j at 2j + h
  return wp.view({S, UWB, K}).transpose(1, 2).reshape({S, K, UWB / (2 * VS), 2, VS}).transpose(3, 4).contiguous()
      .view({S, K, UWB});
}

namespace {

// Columns per stored stripe of a packed weight of wp's type, and whether wp has pack()'s layout ([S, K, U],
// contiguous, whole blocks)
inline int64_t stripe_width(const at::Tensor& wp) { return wp.scalar_type() == at::kBFloat16 ? UW<bf16> : UW<float>; }
inline bool packed_layout(const at::Tensor& wp) {
  const int64_t U = stripe_width(wp);
  return wp.dim() == 3 && wp.is_contiguous() && wp.size(2) == U && (wp.size(0) * U) % BN == 0;
}

// A packed weight (pack()'s, float32 or bfloat16 on CPU) as the next projection of an M-row call; none: no prefetch
NextProj next_of(const c10::optional<at::Tensor>& wp, int64_t M, const char* name) {
  NextProj n;
  if (!wp.has_value() || !wp->defined()) return n;
  const bool half = wp->scalar_type() == at::kBFloat16;
  TORCH_CHECK((half || wp->scalar_type() == at::kFloat) && packed_layout(*wp) && wp->device().is_cpu(),
              name, ": next must be a weight from this build's pack()");
  const int64_t U = stripe_width(*wp);
  n.w = static_cast<const char*>(wp->data_ptr());
  n.nb = wp->size(0) * U / BN;
  n.block_bytes = BN * wp->size(1) * static_cast<int64_t>(wp->element_size());
  n.stripes = BN / U;
  n.unit = half ? claim_unit<bf16>(M) : claim_unit<float>(M);
  return n;
}

// x @ W^T [M, n_out] from pack()'s wp; given glu (swiglu), also each block's SwiGLU, into *glu [M, n_out / 2];
// next: the weight the caller multiplies next (see prefetch_start), or none
at::Tensor project(const at::Tensor& x, const at::Tensor& wp, int64_t n_out, at::Tensor* glu, const char* name,
                   const c10::optional<at::Tensor>& next) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              name, ": contiguous float32 CPU [rows, in] input expected");
  const int64_t U = stripe_width(wp);
  TORCH_CHECK(packed_layout(wp), name, ": weight not from this build's pack()");
  const int64_t M = x.size(0), K = x.size(1), NB = wp.size(0) * U / BN;
  TORCH_CHECK(wp.size(1) == K, name, ": packed weight has ", wp.size(1), " inputs, x has ", K);
  TORCH_CHECK(n_out >= 0 && n_out <= NB * BN, name, ": n_out ", n_out, " exceeds the packed weight's ", NB * BN,
              " columns");
  auto y = at::empty({M, n_out}, x.options());
  float* act = nullptr;
  if (glu != nullptr) {
    TORCH_CHECK(n_out == NB * BN, name, ": n_out must be the packed weight's ", NB * BN,
                " columns (whole blocks of gates and ups), got ", n_out);
    *glu = K == 0 ? at::zeros({M, n_out / 2}, x.options()) : at::empty({M, n_out / 2}, x.options());  // silu(0) * 0
    act = glu->data_ptr<float>();
  }
  const NextProj following = next_of(next, M, name);
  if (M == 0 || n_out == 0) return y;
  if (K == 0) return y.zero_();
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (wp.scalar_type() == at::kBFloat16)
    run<bf16>(xp, M, K, reinterpret_cast<const bf16*>(wp.data_ptr<at::BFloat16>()), NB, yp, n_out, act, following);
  else if (wp.scalar_type() == at::kFloat)
    run<float>(xp, M, K, wp.data_ptr<float>(), NB, yp, n_out, act, following);
  else
    TORCH_CHECK(false, name, ": packed weight must be float32 or bfloat16");
  return y;
}

}  // namespace

// x [M, K] contiguous float32, wp from pack(): -> [M, n_out] float32. next: the packed weight the caller
// multiplies next (an idle thread prefetches its start: see prefetch_start), or none; never changes a result.
at::Tensor linear(at::Tensor x, at::Tensor wp, int64_t n_out, const c10::optional<at::Tensor>& next) {
  return project(x, wp, n_out, nullptr, "linear", next);
}

// For attention.cpp: while waiting() holds, thread t prefetches the start of its run of wp in an M-row call
void prefetch_run_start(const c10::optional<at::Tensor>& wp, int64_t M, int64_t t,
                        const std::function<bool()>& waiting) {
  prefetch_start(next_of(wp, M, "attend"), t, waiting);
}

// x [M, K], wp from pack(gate_up, bf16, glu=true), n_out = 2 * intermediate, next as linear's:
// -> silu(gate) * up [M, n_out / 2],
// bitwise silu_mul(linear(x, pack(gate_up), n_out)) (each output the same accumulators, then the same formula)
at::Tensor swiglu(at::Tensor x, at::Tensor wp, int64_t n_out, const c10::optional<at::Tensor>& next) {
  at::Tensor act;
  project(x, wp, n_out, &act, "swiglu", next);  // its [M, n_out] output: the block sums, in the glu layout
  return act;
}

// What this build is: for the loader's description and the manifests
pybind11::dict info() {
  pybind11::dict d;
  d["isa"] = ISA;
  d["vector_floats"] = VS;
  d["stripe"] = SW;
  d["bf16_stripe"] = UWB;
  d["block"] = BN;
  d["row_tile"] = MT_MAX;
  d["prefetch_bytes"] = PREFETCH_BYTES;
  d["prefetch_bf16_row_bytes"] = PREFETCH_BF16_ROW ? PREFETCH_ROW_BYTES : 0;
  d["prefetch_f32_tile_bytes"] = PREFETCH_F32_TILE_BYTES;  // float32 3-6-row tiles (see PREFETCH_F32_TILE_BYTES)
  // the second, L2 stream prefetch (see PREFETCH_L2_BYTES): beside the L1 ones; in 1-row float32 tiles
  d["prefetch_l2_bytes"] = pybind11::make_tuple(ROW_L2_BESIDE ? PREFETCH_L2_BYTES : 0,
                                                ROW_L2_ALONE ? PREFETCH_L2_BYTES : 0);
  d["work_split"] = "a run of blocks per thread, the rest taken from the back";
  d["idle_prefetch_blocks"] = IDLE_PREFETCH_BLOCKS;  // of the next projection, by a thread left without work
#ifdef _OPENMP
  d["openmp"] = true;  // at::parallel_for runs on torch's threads
#else
  d["openmp"] = false;  // at::parallel_for runs the whole range on the calling thread (see flags.py)
#endif
  d["bf16_row_blocks"] = TWO_BLOCKS<bf16> ? 2 : 1;  // blocks a 1-row bfloat16 tile spans
  d["k_chunk"] = KC;  // k rows per turn of block_chunked's row tiles
  d["chunked_row_tiles"] = pybind11::make_tuple(CHUNK_TILES<float>, CHUNK_TILES<bf16>);  // at most: float32, bf16
  d["subtiles"] = pybind11::make_tuple(NS1 * SW, NS2 * SW, NS3 * SW, NSM * SW);  // columns per subtile: 1, 2, 3, >3 rows
  d["zen4"] = ZEN4;  // built for Zen 4 (SG_ZEN4): the tile below, no 2-row or 1-row bf16 prefetch
  d["prefetch_2row"] = PREFETCH_2ROW;  // 2-row tiles of more than 2 stripes prefetch the stream
  if (MT_F32 > 0) d["float32_tile"] = pybind11::make_tuple(MT_F32, NS_F32 * SW);  // float32 3-MT_F32 rows: rows, columns
  return d;
}

void register_layer_ops(pybind11::module_& m);  // layer_ops.cpp: the forward's small fused operations
void register_attention(pybind11::module_& m);  // attention.cpp: a step's rows against the KV cache
void register_layer(pybind11::module_& m);  // layer.cpp: one decoder layer in one call
void register_head_screen(pybind11::module_& m);  // head_screen.cpp: the greedy LM head's argmax, screened

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "pack W [out, in] into 16-column stripes (64-column blocks)", pybind11::arg("w"),
        pybind11::arg("bf16") = false, pybind11::arg("glu") = false);
  m.def("linear", &linear, "x [rows, in] @ W^T from the packed stripes -> [rows, n_out]", pybind11::arg("x"),
        pybind11::arg("packed"), pybind11::arg("n_out"), pybind11::arg("next") = pybind11::none());
  m.def("swiglu", &swiglu, "silu(gate) * up of x [rows, in] from pack(gate_up, glu=True) -> [rows, n_out / 2]",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("n_out"), pybind11::arg("next") = pybind11::none());
  m.def("info", &info, "the build's ISA and tiling");
  register_layer_ops(m);
  register_attention(m);
  register_layer(m);
  register_head_screen(m);
}
