// A decode step's decoder layers in one call (folovllm/compilation/layer_chain.py): the ops that
// the direct layers (folovllm/compilation/direct.py) call from Python, called here in the same order
// with the same arguments, so the outputs are the same bits. This class only holds, per layer, which op
// each step runs and its fixed arguments: the norms, rotary and attention are this library's own functions,
// a linear is whatever op its linear method binds (called through the dispatcher).
//
// Per layer: rms_norm (first layer) or add_rms_norm, the qkv linear, rotary_store_kv, paged_attention,
// the o_proj linear, add_rms_norm, the MLP. A linear or MLP is a chain of "x-first" calls: op(x, *args),
// each taking the previous call's output (a linear of any kind; gate_up, silu_and_mul, down; a fused MLP).
//
// Where every linear is an int4 matmul with bf16 activations, a gguf_gemm or our bf16 linear and the step is
// small (a few rows, short attention: team_takes), run_team runs the step on one team of threads instead
// (decoder_team.h): the same ops for everything but the matmuls, the matmuls' own kernel code split
// by columns, the same bits.
#include "decoder_team.h"
#include "decoder_team_gguf.h"
#include "ops.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <omp.h>

#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace folovllm::cpu {
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

  bool is(const char* name) const { return op.operator_name().name == name; }

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

struct Layer {
  at::Tensor norm1, norm2;
  double eps1, eps2;
  int64_t num_heads, num_kv_heads;
  std::optional<at::Tensor> q_norm, k_norm;
  double qk_eps, scale;
  int64_t sliding_window;  // 0: none
  std::vector<XFirstCall> qkv, o_proj, mlp;
};

// A layer's linears as the team runs them; rows_below: the most rows + 1 its MLP runs with bf16 activations.
struct TeamLayer {
  std::shared_ptr<const TeamLinear> qkv, o_proj, gate_up, down;
  int64_t rows_below = std::numeric_limits<int64_t>::max();
};

std::shared_ptr<const TeamLinear> int4_linear(const std::vector<IValue>& args, size_t first, at::Tensor perm = {}) {
  return std::make_shared<Int4Linear>(args[first].toTensor(), args[first + 1].toTensor(), args[first + 2].toTensor(),
                                      args[first + 3].toInt(), std::move(perm));
}

// The linear a call makes where the team can split it: int4_gemm, int4_gemm_perm, gguf_gemm(_a8), or the bf16
// linear without a bias; else none.
std::shared_ptr<const TeamLinear> team_linear(const XFirstCall& call) {
  if (call.is("folovllm::int4_gemm")) return int4_linear(call.args, 0);
  if (call.is("folovllm::int4_gemm_perm")) return int4_linear(call.args, 0, call.args[4].toTensor());
  if (call.is("folovllm::gguf_gemm") || call.is("folovllm::gguf_gemm_a8"))
    return std::make_shared<GgufLinear>(call.args[0].toTensor(), call.args[1].toTensor(),
                                        call.is("folovllm::gguf_gemm_a8") ? call.args[2].toInt() : 0);
  if (call.is("folovllm::linear") && call.args[1].isNone())
    return std::make_shared<Bf16Linear>(call.args[0].toTensor());
  return nullptr;
}

// The layer's linears where each is one call the team splits (team_linear) and its MLP is int4_mlp or
// gate_up, silu_and_mul, down; else none.
std::optional<TeamLayer> team_layer(const Layer& layer) {
  auto single = [](const std::vector<XFirstCall>& calls) {
    return calls.size() == 1 ? team_linear(calls[0]) : nullptr;
  };
  TeamLayer team{single(layer.qkv), single(layer.o_proj), nullptr, nullptr};
  const auto& mlp = layer.mlp;
  if (mlp.size() == 1 && mlp[0].is("folovllm::int4_mlp")) {
    team.gate_up = int4_linear(mlp[0].args, 0);
    team.down = int4_linear(mlp[0].args, 4);
    team.rows_below = mlp[0].args[8].toInt();
  } else if (mlp.size() == 3 && mlp[1].is("folovllm::silu_and_mul")) {
    team.gate_up = team_linear(mlp[0]);
    team.down = team_linear(mlp[2]);
  }
  if (!team.qkv || !team.o_proj || !team.gate_up || !team.down) return std::nullopt;
  return team;
}

class DecoderChain : public torch::CustomClassHolder {
 public:
  // skip_prefills_from: the CPU attention backend's (chunks it leaves to SDPA); team_attention_cost: the
  // team takes a step whose attention costs less than this (query rows x keys, summed over sequences and
  // kv heads; 0: never).
  DecoderChain(int64_t skip_prefills_from, int64_t team_attention_cost)
      : skip_prefills_from_(skip_prefills_from), team_attention_cost_(team_attention_cost) {}

  void add_layer(at::Tensor norm1, double eps1, at::Tensor norm2, double eps2, int64_t num_heads,
                 int64_t num_kv_heads, std::optional<at::Tensor> q_norm, std::optional<at::Tensor> k_norm,
                 double qk_eps, double scale, int64_t sliding_window) {
    Layer layer{std::move(norm1), std::move(norm2), eps1, eps2, num_heads, num_kv_heads,
                std::move(q_norm), std::move(k_norm),
                qk_eps, scale, sliding_window, {}, {}, {}};
    layers_.push_back(std::move(layer));
    team_.reset();
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
    team_.reset();
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // Whether a step of `rows` rows with these sequence lengths would run on the team.
  bool team_takes(int64_t rows, const at::Tensor& seq_lens, const at::Tensor& query_start_loc) {
    if (team_attention_cost_ <= 0 || rows > kTeamMaxRows || !cpu_supported()) return false;
    const std::vector<TeamLayer>& team = team_layers();
    if (team.empty()) return false;
    for (const TeamLayer& layer : team)
      if (rows >= layer.rows_below) return false;
    const auto* lens = seq_lens.const_data_ptr<int64_t>();
    const auto* starts = query_start_loc.const_data_ptr<int64_t>();
    int64_t cost = 0;
    for (int64_t s = 0; s < seq_lens.numel(); ++s) cost += (starts[s + 1] - starts[s]) * lens[s];
    return cost * layers_[0].num_kv_heads < team_attention_cost_;
  }

  // The embeddings x [T, hidden] through every layer; caches holds each layer's k_cache then v_cache.
  // Returns (x, residual) as the last layer leaves them.
  std::tuple<at::Tensor, at::Tensor> run(at::Tensor x, at::Tensor cos,
                                         at::Tensor sin, std::vector<at::Tensor> caches, at::Tensor slot_mapping,
                                         at::Tensor block_tables, at::Tensor seq_lens, at::Tensor query_start_loc) {
    TORCH_CHECK(caches.size() == 2 * layers_.size(), "expected ", 2 * layers_.size(), " cache tensors, got ",
                caches.size());
    if (x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous() &&
        seq_lens.scalar_type() == at::kLong && query_start_loc.scalar_type() == at::kLong &&
        team_takes(x.size(0), seq_lens, query_start_loc))
      return run_team(x, cos, sin, caches, slot_mapping, block_tables, seq_lens, query_start_loc);
    at::Tensor residual = x;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      at::Tensor& k_cache = caches[2 * i];
      at::Tensor& v_cache = caches[2 * i + 1];
      if (i == 0) {  // the residual stream starts as the embeddings
        x = rms_norm(x, layer.norm1, layer.eps1);
      } else {
        x = add_rms_norm(residual, x, layer.norm1, layer.eps1);
      }
      const at::Tensor attended = attend(layer, run_calls(layer.qkv, x), k_cache, v_cache, cos, sin, slot_mapping,
                                         block_tables, seq_lens, query_start_loc);
      x = run_calls(layer.mlp, add_rms_norm(residual, run_calls(layer.o_proj, attended), layer.norm2,
                                                  layer.eps2));
    }
    return {x, residual};
  }

 private:
  static constexpr int64_t kTeamMaxRows = 8;

  // Rotary embedding and K/V store, then attention: [T, q heads x head_dim] from the layer's qkv projection.
  at::Tensor attend(const Layer& layer, const at::Tensor& qkv_out, at::Tensor& k_cache, at::Tensor& v_cache,
                    const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slot_mapping,
                    const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& query_start_loc) {
    auto qkv = rotary_store_kv(qkv_out, layer.num_heads, layer.num_kv_heads, cos, sin, layer.q_norm,
                                     layer.k_norm, layer.qk_eps, k_cache, v_cache, slot_mapping);
    at::Tensor query = std::get<0>(qkv).contiguous();  // q is a slice of the fused qkv projection
    at::Tensor out = at::empty_like(query);
    paged_attention(out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                    {.scale = layer.scale, .sliding_window = layer.sliding_window,
                     .skip_prefills_from = skip_prefills_from_, .skip_fresh_prefills = true});
    return out.view({query.size(0), query.size(1) * query.size(2)});
  }

  // Each layer's linears for the team; empty where a layer's are not all plain int4 matmuls or the layers'
  // shapes differ (the team's outputs are allocated once per step).
  const std::vector<TeamLayer>& team_layers() {
    if (!team_) {
      team_.emplace();
      for (const Layer& layer : layers_) {
        std::optional<TeamLayer> team = team_layer(layer);
        if (!team) {
          team_->clear();
          break;
        }
        team_->push_back(std::move(*team));
      }
      for (const TeamLayer& layer : *team_) {
        const TeamLayer& first = team_->front();
        if (layer.qkv->N() != first.qkv->N() || layer.o_proj->N() != first.o_proj->N() ||
            layer.gate_up->N() != first.gate_up->N() || layer.down->N() != first.down->N()) {
          team_->clear();
          break;
        }
      }
    }
    return *team_;
  }

  // run() on the team (see the file's head): the first thread runs the ops between the matmuls, every
  // thread its columns of each matmul, a barrier after each part; a waiting thread prefetches its columns
  // of the next matmul. An op's error stops every thread at the next barrier and is raised after.
  std::tuple<at::Tensor, at::Tensor> run_team(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                              std::vector<at::Tensor>& caches, const at::Tensor& slot_mapping,
                                              const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                              const at::Tensor& query_start_loc) {
    const std::vector<TeamLayer>& team = *team_;
    const int64_t M = x.size(0), L = static_cast<int64_t>(layers_.size());
    const TeamLayer& shapes = team.front();
    at::Tensor qkv_out = at::empty({M, shapes.qkv->N()}, x.options());
    at::Tensor o_out = at::empty({M, shapes.o_proj->N()}, x.options());
    at::Tensor gate_up_out = at::empty({M, shapes.gate_up->N()}, x.options());
    at::Tensor down_out = at::empty({M, shapes.down->N()}, x.options());
    at::Tensor residual = x, hidden, attended, act;  // what the first thread's ops hand the matmuls
    std::exception_ptr error;
    std::optional<SpinBarrier> barrier;
#pragma omp parallel num_threads(std::max(1, at::get_num_threads()))
    {
      const int t = omp_get_thread_num(), n = omp_get_num_threads();  // n: fewer than asked where nested
#pragma omp single
      barrier.emplace(n);
      TeamScratch scratch;
      SlicePrefetch prefetch;
      auto meet = [&] { return !barrier->wait(prefetch); };  // false: stop, an op failed
      auto on_first = [&](auto&& op) {
        if (t == 0) {
          try {
            op();
          } catch (...) {
            error = std::current_exception();
            barrier->stop();
          }
        }
        return meet();
      };
      // This thread's columns of out = in W^T; then it prefetches its columns of `next` while it waits.
      auto matmul = [&](const TeamLinear& w, const at::Tensor& in, at::Tensor& out, const TeamLinear* next) {
        w.run(in.const_data_ptr<c10::BFloat16>(), M, out.mutable_data_ptr<c10::BFloat16>(), t, n, scratch);
        prefetch = next != nullptr ? next->slice_of(t, n) : SlicePrefetch{};
        return meet();
      };
      for (int64_t i = 0; i < L; ++i) {
        const Layer& layer = layers_[i];
        const TeamLayer& linears = team[i];
        if (!on_first([&] {
              hidden = i == 0 ? rms_norm(x, layer.norm1, layer.eps1)
                              : add_rms_norm(residual, down_out, layer.norm1, layer.eps1);
            }))
          break;
        if (!matmul(*linears.qkv, hidden, qkv_out, linears.o_proj.get())) break;
        if (!on_first([&] {
              attended = attend(layer, qkv_out, caches[2 * i], caches[2 * i + 1], cos, sin, slot_mapping,
                                block_tables, seq_lens, query_start_loc);
            }))
          break;
        if (!matmul(*linears.o_proj, attended, o_out, linears.gate_up.get())) break;
        if (!on_first([&] { hidden = add_rms_norm(residual, o_out, layer.norm2, layer.eps2); })) break;
        if (!matmul(*linears.gate_up, hidden, gate_up_out, linears.down.get())) break;
        if (!on_first([&] { act = silu_and_mul(gate_up_out); })) break;
        if (!matmul(*linears.down, act, down_out, i + 1 < L ? team[i + 1].qkv.get() : nullptr)) break;
      }
    }
    if (error) std::rethrow_exception(error);
    return {down_out, residual};
  }

  int64_t skip_prefills_from_;
  int64_t team_attention_cost_;
  std::vector<Layer> layers_;
  std::optional<std::vector<TeamLayer>> team_;  // team_layers(), built on first use
};

}  // namespace

void register_decoder_chain(torch::Library& m) {
  m.class_<DecoderChain>("DecoderChain")
      .def(torch::init<int64_t, int64_t>())
      .def("team_takes", &DecoderChain::team_takes)
      .def("add_layer", &DecoderChain::add_layer)
      .def("add_call", &DecoderChain::add_call)
      .def("num_layers", &DecoderChain::num_layers)
      .def("run", &DecoderChain::run);
}

}  // namespace folovllm::cpu
