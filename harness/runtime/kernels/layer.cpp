// One decoder layer of a decoding step in one call: what a step does between the residual stream's
// entry and exit, with the operations of the other sources (small_gemm.cpp, layer_ops.cpp,
// attention.cpp) called directly.
//
// Why: at a few rows per step, the Python around nine calls per layer (argument conversion, attribute
// lookups on the modules, the intermediate tensors' wrappers) cost ~1 ms of a 1-token SmolLM2 forward,
// as much as all the fused operations themselves. A Layer holds its packed weights, norms and shapes
// once; its forward runs the same functions in the same order as the Python path, so the results are
// bitwise those of the separate calls (tests compare them), and as row-invariant.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

// the other sources' operations (see each for the shapes)
at::Tensor linear(at::Tensor x, at::Tensor wp, int64_t n_out, const c10::optional<at::Tensor>& next);
at::Tensor swiglu(at::Tensor x, at::Tensor wp, int64_t n_out, const c10::optional<at::Tensor>& next);
at::Tensor add_rms_norm(at::Tensor x, const c10::optional<at::Tensor>& r, const at::Tensor& w, double eps);
at::Tensor rope_to_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kc,
                         at::Tensor vc, int64_t L, int64_t H, int64_t Hkv, bool keys_blocked);
at::Tensor attend(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& vc, int64_t L,
                  const c10::optional<at::Tensor>& mask, double scale, const c10::optional<at::Tensor>& next);
at::Tensor silu_mul(const at::Tensor& gu);
std::vector<int64_t> argmax_rows(const at::Tensor& x);
std::vector<int64_t> screened_argmax(const at::Tensor& h, const at::Tensor& t, const at::Tensor& bound, double spread,
                                     const at::Tensor& w);

namespace {

// Where a step's time goes: seconds summed per operation over the steps run while a Stack's clocks are on
// (Stack.set_clocks), read on the calling thread at each operation's end. Why: t(1) minus the matmuls timed
// alone (perf's memory bound) hides what overlaps inside a step (threads left idle prefetch the next weight)
// and what a mode shares with another (a bf16w step reads the same LM head bytes as a screened float32 one,
// and the same KV cache): only clocks inside the step split it. Off by default; on, a step reads ~300 clocks.
// LOOP: between the layers (the last layer's temporaries freed, the next one's cache views made).
enum Op { EMBED, NORMS, QKV, ROPE, ATTENTION, O, GATE_UP, DOWN, LOOP, HEAD, N_OPS };
constexpr std::array<const char*, N_OPS> OP_NAMES = {"embedding", "norms", "qkv", "rope", "attention", "o",
                                                     "gate_up", "down", "layer_loop", "head"};
struct Clocks {
  std::array<double, N_OPS> seconds{};
  int64_t steps = 0;
};

// Laps of one operation after another: lap(op) adds the time since the previous lap (or the start) to op; a
// no-op when clocks is null (clocks off)
class Laps {
 public:
  explicit Laps(Clocks* clocks) : clocks_(clocks), last_(clocks ? now() : 0.0) {}
  void operator()(Op op) {
    if (clocks_ == nullptr) return;
    const double t = now();
    clocks_->seconds[op] += t - last_;
    last_ = t;
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  Clocks* clocks_;
  double last_;
};

// one packed projection (pack()'s stripes), its output width and optional bias; next: the packed weight
// multiplied after it (its start is prefetched by threads left idle at the end: small_gemm.cpp's prefetch_start)
struct Proj {
  at::Tensor packed;
  int64_t n_out;
  c10::optional<at::Tensor> bias;

  at::Tensor operator()(const at::Tensor& x, const c10::optional<at::Tensor>& next = c10::nullopt) const {
    at::Tensor y = linear(x, packed, n_out, next);
    if (bias.has_value() && bias->defined()) y.add_(*bias);
    return y;
  }
};

// A LLaMA decoder layer: RMSNorm -> fused qkv -> RoPE + cache write -> attention -> o -> residual + RMSNorm
// -> fused gate_up -> SiLU * up -> down. Keys are cached in blocks ([Hkv, blocks, d, B]), as attend reads them.
// glu: gate_up was packed with glu=true, and its matmul applies SiLU * up (swiglu; bitwise silu_mul's result).
class Layer {
 public:
  Layer(at::Tensor in_norm, double in_eps, at::Tensor post_norm, double post_eps, at::Tensor qkv, int64_t n_qkv,
        c10::optional<at::Tensor> b_qkv, at::Tensor o, int64_t n_o, c10::optional<at::Tensor> b_o, at::Tensor gate_up,
        int64_t n_gate_up, c10::optional<at::Tensor> b_gate_up, at::Tensor down, int64_t n_down,
        c10::optional<at::Tensor> b_down, int64_t H, int64_t Hkv, double scale, bool glu)
      : in_norm_(std::move(in_norm)), post_norm_(std::move(post_norm)), in_eps_(in_eps), post_eps_(post_eps),
        qkv_{std::move(qkv), n_qkv, std::move(b_qkv)}, o_{std::move(o), n_o, std::move(b_o)},
        gate_up_{std::move(gate_up), n_gate_up, std::move(b_gate_up)}, down_{std::move(down), n_down, std::move(b_down)},
        H_(H), Hkv_(Hkv), scale_(scale), glu_(glu) {
    TORCH_CHECK(!glu || !(gate_up_.bias.has_value() && gate_up_.bias->defined()), "Layer: glu takes no gate_up bias");
  }

  // x [k, hidden] the residual stream (updated in place: x += add, then x += attention's output);
  // add [k, hidden] what the previous layer adds (None for the first); cos/sin [k, d]; kt/vc the layer's
  // caches; mask [k, k] bool among the new tokens or None (causal); next: the packed weight multiplied after the
  // layer (the next layer's qkv, or the LM head), or None; lap: the step's clocks (see Laps). Returns what this
  // layer adds, [k, hidden].
  // Each call names the weight multiplied after it, so threads left idle prefetch its start (see Proj).
  at::Tensor forward(at::Tensor x, const c10::optional<at::Tensor>& add, const at::Tensor& cos, const at::Tensor& sin,
                     at::Tensor kt, at::Tensor vc, int64_t L, const c10::optional<at::Tensor>& mask,
                     const c10::optional<at::Tensor>& next, Laps& lap) const {
    at::Tensor h = add_rms_norm(x, add, in_norm_, in_eps_);
    lap(NORMS);
    const at::Tensor qkv = qkv_(h, o_.packed);  // [k, (H + 2 Hkv) d]
    lap(QKV);
    const at::Tensor q = rope_to_cache(qkv, cos, sin, kt, vc, L, H_, Hkv_, true);
    lap(ROPE);
    const at::Tensor o = attend(q, kt, vc, L, mask, scale_, o_.packed);  // [k, H d]
    lap(ATTENTION);
    const at::Tensor attended = o_(o, gate_up_.packed);  // [k, hidden]
    lap(O);
    h = add_rms_norm(x, attended, post_norm_, post_eps_);
    lap(NORMS);
    const at::Tensor act = glu_ ? swiglu(h, gate_up_.packed, gate_up_.n_out, down_.packed)
                                : silu_mul(gate_up_(h, down_.packed));  // [k, intermediate]
    lap(GATE_UP);
    at::Tensor added = down_(act, next);
    lap(DOWN);
    return added;
  }

  const at::Tensor& qkv_weight() const { return qkv_.packed; }

 private:
  at::Tensor in_norm_, post_norm_;
  double in_eps_, post_eps_;
  Proj qkv_, o_, gate_up_, down_;
  int64_t H_, Hkv_;
  double scale_;
  bool glu_;
};

// rows idx [k] (int64) of table [n, w] (contiguous float32) -> [k, w]; `what` names an index in the error
at::Tensor gather_rows(const at::Tensor& table, const at::Tensor& idx, const char* what) {
  TORCH_CHECK(table.scalar_type() == at::kFloat && table.is_contiguous() && table.dim() == 2 && table.device().is_cpu(),
              "gather_rows: contiguous float32 CPU [n, w] table expected");
  TORCH_CHECK(idx.scalar_type() == at::kLong && idx.dim() == 1 && idx.device().is_cpu(),
              "gather_rows: int64 CPU [k] indices expected");
  const int64_t k = idx.size(0), n = table.size(0), w = table.size(1);
  auto out = at::empty({k, w}, table.options());
  const at::Tensor ix = idx.contiguous();
  const int64_t* ip = ix.data_ptr<int64_t>();
  const float* src = table.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < k; ++i) {
    TORCH_CHECK_INDEX(ip[i] >= 0 && ip[i] < n, what, " ", ip[i], " is out of range [0, ", n, ")");
    std::memcpy(dst + i * w, src + ip[i] * w, w * sizeof(float));
  }
  return out;
}

// Every decoder layer of a step in one call, and with set_ends the whole forward (token ids to logits).
// Why: thirty Python calls into Layer.forward (the loop, the argument conversion, a tuple back each, the
// caches indexed per layer) ran after each layer's weights had flushed the caches, at tens of microseconds
// a forward; the embedding, the cos/sin rows, the final norm and the LM head call cost another ~0.2 ms of
// a SmolLM2 step from Python, each torch call's state evicted by the weight stream (the first call after
// it took 100-200 us against 8-17 warm). In one call, a SmolLM2 step of 1 / 6 tokens ran 0.98x / 0.99x
// (bf16w) and 0.98x / 0.98x (float32) against the Python ends, AVX-512 and AVX2 forced alike, where a
// second backend with Python ends ran 1.00-1.02x (EPYC Zen 5, 2026-12-03, median of 100 paired steps).
class Stack {
 public:
  explicit Stack(std::vector<Layer> layers) : layers_(std::move(layers)) {}

  // embed [vocab, hidden] the token embeddings; norm/eps the final RMSNorm; head/n_head/head_bias the LM
  // head's packed weight (as Layer's projections)
  void set_ends(at::Tensor embed, at::Tensor norm, double eps, at::Tensor head, int64_t n_head,
                c10::optional<at::Tensor> head_bias) {
    embed_ = std::move(embed);
    norm_ = std::move(norm);
    eps_ = eps;
    head_ = Proj{std::move(head), n_head, std::move(head_bias)};
    ends_ = true;
  }

  // The greedy LM head (head_screen.cpp): screen the bfloat16 rounding of the float32 head packed, bound [vocab]
  // its per-column error constants, spread their scale, exact [vocab, hidden] the float32 head itself.
  void set_screen(at::Tensor screen, at::Tensor bound, double spread, at::Tensor exact) {
    TORCH_CHECK(ends_, "Stack.set_screen: call set_ends first");
    screen_ = Proj{std::move(screen), head_.n_out, c10::nullopt};
    bound_ = std::move(bound);
    spread_ = spread;
    exact_ = std::move(exact);
    screened_ = true;
  }

  // ids [k] int64 token ids; positions [k] int64, their rows in cos_t/sin_t [capacity, d]; the caches, L
  // and mask as forward; rows [r] int64 the rows whose logits are wanted (None: all k). The operations and
  // their order are the Python path's (embedding and cos/sin rows copied, the layers, rows selected, final
  // norm, LM head), so the logits are bitwise its. Returns [r, vocab] float32.
  at::Tensor logits(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& cos_t, const at::Tensor& sin_t,
                    const at::Tensor& kt, const at::Tensor& vc, int64_t L, const c10::optional<at::Tensor>& mask,
                    const c10::optional<at::Tensor>& rows) {
    Laps lap(clocks());
    const at::Tensor h = head_input(ids, positions, cos_t, sin_t, kt, vc, L, mask, rows, head_.packed, lap);
    at::Tensor out = head_(h, first_weight());
    lap(HEAD);
    return out;
  }

  // The same forward, but each wanted row's argmax of its logits (argmax_rows' answer on logits()): through the
  // screen where one is set (set_screen: the step reads the bfloat16 head instead of the float32 one), else on
  // the logits themselves, in this call (a second call from Python cost a bf16w step ~0.07 ms). Returns [r] ids.
  std::vector<int64_t> greedy(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& cos_t,
                              const at::Tensor& sin_t, const at::Tensor& kt, const at::Tensor& vc, int64_t L,
                              const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& rows) {
    Laps lap(clocks());
    const Proj& head = screened_ ? screen_ : head_;
    const at::Tensor h = head_input(ids, positions, cos_t, sin_t, kt, vc, L, mask, rows, head.packed, lap);
    const at::Tensor t = head(h, first_weight());  // [r, vocab] logits on the screen's head or the whole one
    std::vector<int64_t> ids_out = screened_ ? screened_argmax(h, t, bound_, spread_, exact_) : argmax_rows(t);
    lap(HEAD);
    return ids_out;
  }

  // Clocks on (zeroed) or off (see Clocks)
  void set_clocks(bool on) {
    clocks_on_ = on;
    clocks_ = Clocks{};
  }

  // {operation: seconds summed over the clocked steps, ..., "steps": how many}; all zero while off
  pybind11::dict clock_readings() const {
    pybind11::dict d;
    for (int op = 0; op < N_OPS; ++op) d[OP_NAMES[op]] = clocks_.seconds[op];
    d["steps"] = clocks_.steps;
    return d;
  }

  // x [k, hidden] the residual stream (updated in place); kt [n_layers, Hkv, blocks, d, B] and vc
  // [n_layers, Hkv, capacity, d] the caches; last: the packed weight multiplied after the last layer (or None);
  // the rest as Layer::forward. Returns what the last layer adds.
  c10::optional<at::Tensor> forward(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& kt,
                                    const at::Tensor& vc, int64_t L, const c10::optional<at::Tensor>& mask,
                                    const c10::optional<at::Tensor>& last) {
    Laps lap(clocks());
    return run_layers(x, cos, sin, kt, vc, L, mask, last, lap);
  }

 private:
  // forward's layers, timed by lap
  c10::optional<at::Tensor> run_layers(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& kt,
                                       const at::Tensor& vc, int64_t L, const c10::optional<at::Tensor>& mask,
                                       const c10::optional<at::Tensor>& last, Laps& lap) {
    const auto n = static_cast<int64_t>(layers_.size());
    TORCH_CHECK(kt.dim() == 5 && vc.dim() == 4 && kt.size(0) == n && vc.size(0) == n,
                "Stack: caches must be [n_layers, ...] for ", n, " layers");
    const std::vector<at::Tensor>& views = cache_views(kt, vc);
    c10::optional<at::Tensor> add;
    for (int64_t i = 0; i < n; ++i) {
      const c10::optional<at::Tensor> next = i + 1 < n ? c10::optional<at::Tensor>(layers_[i + 1].qkv_weight()) : last;
      lap(LOOP);
      add = layers_[i].forward(x, add, cos, sin, views[2 * i], views[2 * i + 1], L, mask, next, lap);
    }
    lap(LOOP);
    return add;
  }

  // the rows fed to the LM head: embedding, the layers (the last naming `head`, the head it is followed by),
  // the wanted rows, the final norm; [r, hidden]. A clocked step is counted here (every forward runs it once).
  at::Tensor head_input(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& cos_t,
                        const at::Tensor& sin_t, const at::Tensor& kt, const at::Tensor& vc, int64_t L,
                        const c10::optional<at::Tensor>& mask, const c10::optional<at::Tensor>& rows,
                        const at::Tensor& head, Laps& lap) {
    TORCH_CHECK(ends_, "Stack: call set_ends first");
    if (clocks_on_) ++clocks_.steps;
    at::Tensor x = gather_rows(embed_, ids, "token id");  // [k, hidden], the residual stream
    const at::Tensor cos = gather_rows(cos_t, positions, "position"), sin = gather_rows(sin_t, positions, "position");
    lap(EMBED);
    c10::optional<at::Tensor> add = run_layers(x, cos, sin, kt, vc, L, mask, head, lap);
    if (rows.has_value() && rows->defined()) {  // [r, hidden] each
      x = gather_rows(x, *rows, "logit row");
      if (add.has_value()) add = gather_rows(*add, *rows, "logit row");
    }
    at::Tensor h = add_rms_norm(x, add, norm_, eps_);
    lap(NORMS);
    return h;
  }

  Clocks* clocks() { return clocks_on_ ? &clocks_ : nullptr; }

  // Layer i's caches, kt.select(0, i) and vc.select(0, i) at 2 i and 2 i + 1, made once per pair of cache tensors
  // (kept, with the caches they view, until a step brings others: a backend's reset). Why: 60 selects a step
  // through the dispatcher, after each layer's weights had flushed its state, put 0.35-0.44 ms of a SmolLM2
  // 1-token step between the layers (the clocks); without them 0.06-0.09, and the step ran ~0.7% faster (the
  // gap had mostly run under the other thread's prefetch; results/perf/RUNS.md, forty-fourth run).
  // Held views are a cache's when layer 0's starts where the cache does, with its sizes and strides less the
  // first (the views keep their storage alive, so no other cache can start at that address).
  const std::vector<at::Tensor>& cache_views(const at::Tensor& kt, const at::Tensor& vc) {
    auto first_of = [](const at::Tensor& view, const at::Tensor& cache) {
      return view.data_ptr() == cache.data_ptr() && view.sizes() == cache.sizes().slice(1) &&
             view.strides() == cache.strides().slice(1);
    };
    if (!views_.empty() && static_cast<int64_t>(views_.size()) == 2 * kt.size(0) && first_of(views_[0], kt) &&
        first_of(views_[1], vc))
      return views_;
    views_.clear();
    for (int64_t i = 0; i < kt.size(0); ++i) {
      views_.push_back(kt.select(0, i));
      views_.push_back(vc.select(0, i));
    }
    return views_;
  }

  // the next step's first weight (prefetched by threads the LM head leaves idle)
  c10::optional<at::Tensor> first_weight() const {
    return layers_.empty() ? c10::nullopt : c10::optional<at::Tensor>(layers_.front().qkv_weight());
  }

  std::vector<Layer> layers_;
  bool ends_ = false, screened_ = false, clocks_on_ = false;
  Clocks clocks_;
  std::vector<at::Tensor> views_;  // cache_views'
  at::Tensor embed_, norm_, bound_, exact_;
  double eps_ = 0, spread_ = 0;
  Proj head_, screen_;
};

}  // namespace

void register_layer(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<Layer>(m, "Layer", "one decoder layer of a step, weights held once (see layer.cpp)")
      .def(py::init<at::Tensor, double, at::Tensor, double, at::Tensor, int64_t, c10::optional<at::Tensor>, at::Tensor,
                    int64_t, c10::optional<at::Tensor>, at::Tensor, int64_t, c10::optional<at::Tensor>, at::Tensor,
                    int64_t, c10::optional<at::Tensor>, int64_t, int64_t, double, bool>(),
           py::arg("in_norm"), py::arg("in_eps"), py::arg("post_norm"), py::arg("post_eps"), py::arg("qkv"),
           py::arg("n_qkv"), py::arg("b_qkv"), py::arg("o"), py::arg("n_o"), py::arg("b_o"), py::arg("gate_up"),
           py::arg("n_gate_up"), py::arg("b_gate_up"), py::arg("down"), py::arg("n_down"), py::arg("b_down"),
           py::arg("H"), py::arg("Hkv"), py::arg("scale"), py::arg("glu"));  // run from Python through Stack
  py::class_<Stack>(m, "Stack", "every decoder layer of a step in one call (see layer.cpp)")
      .def(py::init<std::vector<Layer>>(), py::arg("layers"))
      .def("forward", &Stack::forward, "the layers in turn on x [k, hidden] (updated in place); returns what the "
           "last adds", py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("kt"), py::arg("vc"), py::arg("L"),
           py::arg("mask"), py::arg("last") = py::none())
      .def("set_ends", &Stack::set_ends, "the embedding table, final norm and LM head, for logits",
           py::arg("embed"), py::arg("norm"), py::arg("eps"), py::arg("head"), py::arg("n_head"), py::arg("head_bias"))
      .def("logits", &Stack::logits, "the whole forward: token ids [k] -> logits [r, vocab] (see layer.cpp)",
           py::arg("ids"), py::arg("positions"), py::arg("cos_table"), py::arg("sin_table"), py::arg("kt"),
           py::arg("vc"), py::arg("L"), py::arg("mask"), py::arg("rows"))
      .def("set_screen", &Stack::set_screen, "the greedy LM head's screen (see head_screen.cpp)", py::arg("screen"),
           py::arg("bound"), py::arg("spread"), py::arg("exact"))
      .def("greedy", &Stack::greedy, "the whole forward to each wanted row's argmax (screened if set): [r] ids",
           py::arg("ids"), py::arg("positions"), py::arg("cos_table"), py::arg("sin_table"), py::arg("kt"),
           py::arg("vc"), py::arg("L"), py::arg("mask"), py::arg("rows"))
      .def("set_clocks", &Stack::set_clocks, "clocks around each operation of a step on (zeroed) or off",
           py::arg("on"))
      .def("clock_readings", &Stack::clock_readings, "{operation: seconds summed, ..., 'steps': n} (see layer.cpp)");
}
