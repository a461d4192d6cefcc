// A decode step's decoder layers in one call (folovllm/model/layer_chain.py): the ops that
// folovllm/model/direct.py's DirectDecoderLayer calls from Python, called here through the dispatcher in the
// same order with the same arguments, so the outputs are the same bits. The kernels stay in their own
// libraries; this one only holds, per layer, which op each step runs and its fixed arguments.
//
// Per layer: rms_norm (first layer) or add_rms_norm, the qkv linear, rotary_store_kv, paged_attention,
// the o_proj linear, add_rms_norm, the MLP. A linear or MLP is a chain of "x-first" calls: op(x, *args),
// each taking the previous call's output (a linear of any kind; gate_up, silu_and_mul, down; a fused MLP).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using c10::IValue;
using torch::jit::Stack;

c10::OperatorHandle find_op(const std::string& name, const std::string& overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
}

// op(x, *args): the call a bound linear makes (a boxed call: the op and its arguments vary by linear kind).
struct XFirstCall {
  c10::OperatorHandle op;
  std::vector<IValue> args;

  at::Tensor operator()(const at::Tensor& x) const {
    Stack stack;
    stack.reserve(args.size() + 1);
    stack.emplace_back(x);
    stack.insert(stack.end(), args.begin(), args.end());
    op.callBoxed(stack);
    return stack[0].toTensor();
  }
};

at::Tensor run_calls(const std::vector<XFirstCall>& calls, at::Tensor x) {
  for (const auto& call : calls) x = call(x);
  return x;
}

// The fixed ops' C++ signatures, as their libraries define them (a typed call skips boxing the arguments).
using RmsNorm = at::Tensor(const at::Tensor&, const at::Tensor&, double);
using AddRmsNorm = at::Tensor(at::Tensor&, const at::Tensor&, const at::Tensor&, double);
using RotaryStoreKv = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, int64_t, int64_t, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, double, at::Tensor&, at::Tensor&, const at::Tensor&);
using PagedAttention = void(at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, double, bool, int64_t, bool, int64_t, bool, bool,
                            bool);

struct Layer {
  at::Tensor norm1, norm2;
  double eps1, eps2;
  int64_t num_heads, num_kv_heads;
  std::optional<at::Tensor> q_norm, k_norm;
  double qk_eps, scale;
  int64_t sliding_window;  // 0: none
  std::vector<XFirstCall> qkv, o_proj, mlp;
};

class DecoderChain : public torch::CustomClassHolder {
 public:
  // The attention kernel's switches, as the CPU attention backend passes them.
  DecoderChain(int64_t skip_prefills_from, bool decode_prefetch, bool chunked_claims)
      : skip_prefills_from_(skip_prefills_from),
        decode_prefetch_(decode_prefetch),
        chunked_claims_(chunked_claims),
        rms_norm_(find_op("folovllm_cpu_fused::rms_norm", "").typed<RmsNorm>()),
        add_rms_norm_(find_op("folovllm_cpu_fused::add_rms_norm", "").typed<AddRmsNorm>()),
        rotary_store_kv_(find_op("folovllm_cpu_fused::rotary_store_kv", "").typed<RotaryStoreKv>()),
        attention_(find_op("folovllm_cpu::paged_attention", "").typed<PagedAttention>()) {}

  void add_layer(at::Tensor norm1, double eps1, at::Tensor norm2, double eps2, int64_t num_heads,
                 int64_t num_kv_heads, std::optional<at::Tensor> q_norm, std::optional<at::Tensor> k_norm,
                 double qk_eps, double scale, int64_t sliding_window) {
    Layer layer{std::move(norm1), std::move(norm2), eps1, eps2, num_heads, num_kv_heads,
                std::move(q_norm), std::move(k_norm),
                qk_eps, scale, sliding_window, {}, {}, {}};
    layers_.push_back(std::move(layer));
  }

  // Appends op(x, *args) to the last layer's "qkv", "o_proj" or "mlp" calls.
  void add_call(const std::string& part, const std::string& op, const std::string& overload,
                std::vector<IValue> args) {
    TORCH_CHECK(!layers_.empty(), "add_call before add_layer");
    Layer& layer = layers_.back();
    std::vector<XFirstCall>* calls = part == "qkv" ? &layer.qkv : part == "o_proj" ? &layer.o_proj
                                   : part == "mlp" ? &layer.mlp : nullptr;
    TORCH_CHECK(calls != nullptr, "part must be qkv, o_proj or mlp; got ", part);
    calls->push_back(XFirstCall{find_op(op, overload), std::move(args)});
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // The embeddings x [T, hidden] through every layer; caches holds each layer's k_cache then v_cache.
  // Returns (x, residual) as the last layer leaves them.
  std::tuple<at::Tensor, at::Tensor> run(at::Tensor x, at::Tensor cos,
                                         at::Tensor sin, std::vector<at::Tensor> caches, at::Tensor slot_mapping,
                                         at::Tensor block_tables, at::Tensor seq_lens, at::Tensor query_start_loc) {
    TORCH_CHECK(caches.size() == 2 * layers_.size(), "expected ", 2 * layers_.size(), " cache tensors, got ",
                caches.size());
    at::Tensor residual = x;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      at::Tensor& k_cache = caches[2 * i];
      at::Tensor& v_cache = caches[2 * i + 1];
      if (i == 0) {  // the residual stream starts as the embeddings
        x = rms_norm_.call(x, layer.norm1, layer.eps1);
      } else {
        x = add_rms_norm_.call(residual, x, layer.norm1, layer.eps1);
      }
      auto qkv = rotary_store_kv_.call(run_calls(layer.qkv, x), layer.num_heads, layer.num_kv_heads, cos, sin,
                                       layer.q_norm, layer.k_norm, layer.qk_eps, k_cache, v_cache, slot_mapping);
      at::Tensor query = std::get<0>(qkv).contiguous();  // q is a slice of the fused qkv projection
      at::Tensor out = at::empty_like(query);
      attention_.call(out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, layer.scale, true,
                      layer.sliding_window, true, skip_prefills_from_, true, decode_prefetch_, chunked_claims_);
      at::Tensor attended = out.view({query.size(0), query.size(1) * query.size(2)});
      x = run_calls(layer.mlp, add_rms_norm_.call(residual, run_calls(layer.o_proj, attended), layer.norm2,
                                                  layer.eps2));
    }
    return {x, residual};
  }

 private:
  int64_t skip_prefills_from_;
  bool decode_prefetch_, chunked_claims_;
  c10::TypedOperatorHandle<RmsNorm> rms_norm_;
  c10::TypedOperatorHandle<AddRmsNorm> add_rms_norm_;
  c10::TypedOperatorHandle<RotaryStoreKv> rotary_store_kv_;
  c10::TypedOperatorHandle<PagedAttention> attention_;
  std::vector<Layer> layers_;
};

}  // namespace

TORCH_LIBRARY(folovllm_cpu_chain, m) {
  m.class_<DecoderChain>("DecoderChain")
      .def(torch::init<int64_t, bool, bool>())
      .def("add_layer", &DecoderChain::add_layer)
      .def("add_call", &DecoderChain::add_call)
      .def("num_layers", &DecoderChain::num_layers)
      .def("run", &DecoderChain::run);
}
