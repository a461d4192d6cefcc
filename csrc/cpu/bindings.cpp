// The CPU kernel library's one op namespace, torch.ops.folovllm: every op's schema and implementation
// (declared in ops.h, defined beside their kernels), the DecoderChain class, and the tier ops that
// folovllm/platforms/isa.py reads and caps.
#include "amx.h"
#include "isa.h"
#include "ops.h"

#include <torch/library.h>

#include <string>

namespace folovllm::cpu {
namespace {

// The least tier each kernel runs at (an op called below it raises); the names folovllm/platforms asks
// about before it picks a kernel.
Tier kernel_floor(const std::string& name) {
  if (name == "paged_attention" || name == "fused_ops" || name == "linear" || name == "linear_argmax" ||
      name == "int4" || name == "int4_a8" || name == "int8" || name == "gguf" || name == "prefill_attention" ||
      name == "lora")
    return Tier::kAvx2;
  if (name == "top_k") return Tier::kNone;  // portable C++
  if (name == "decode_avx512") return Tier::kAvx512;
  if (name == "team") return Tier::kAvx512Bf16;
  TORCH_CHECK(false, "unknown kernel '", name, "'");
}

bool has_kernel(const std::string& name) {
  // the AMX forms (linear_amx.h, attention_prefill_amx.h): the amx tier, where the OS grants the tile registers
  if (name == "linear_amx" || name == "prefill_attention_amx") return amx_runs();
  return tier_at_least(kernel_floor(name));
}

std::string host_tier_name() { return tier_name(host_tier()); }
std::string tier_now() { return tier_name(tier()); }
std::string cap_tier(const std::string& name) {
  set_tier(tier_from_name(name));
  return tier_name(tier());
}

void paged_attention_op(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                        const at::Tensor& query_start_loc, double scale, int64_t sliding_window,
                        int64_t skip_prefills_from, bool skip_fresh_prefills) {
  paged_attention(out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                  {.scale = scale, .sliding_window = sliding_window, .skip_prefills_from = skip_prefills_from,
                   .skip_fresh_prefills = skip_fresh_prefills});
}

void set_kernel_switches_op(bool fast_decode, bool bf16_dot, bool prefetch, bool chunked_claims, bool linear_claims) {
  set_kernel_switches({.fast_decode = fast_decode, .bf16_dot = bf16_dot, .prefetch = prefetch,
                       .chunked_claims = chunked_claims, .linear_claims = linear_claims});
}

c10::Dict<std::string, bool> kernel_switches_op() {
  const KernelSwitches s = kernel_switches();
  c10::Dict<std::string, bool> named;
  named.insert("fast_decode", s.fast_decode);
  named.insert("bf16_dot", s.bf16_dot);
  named.insert("prefetch", s.prefetch);
  named.insert("chunked_claims", s.chunked_claims);
  named.insert("linear_claims", s.linear_claims);
  return named;
}

}  // namespace
}  // namespace folovllm::cpu

TORCH_LIBRARY(folovllm, m) {
  using namespace folovllm::cpu;
  m.def("host_tier() -> str", &host_tier_name);
  m.def("tier() -> str", &tier_now);
  m.def("set_tier(str tier) -> str", &cap_tier);
  m.def("has_kernel(str name) -> bool", &has_kernel);

  m.def("paged_attention(Tensor(a!) out, Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor query_start_loc, *, float scale, int sliding_window=0, int skip_prefills_from=0, "
        "bool skip_fresh_prefills=True) -> ()");
  m.def("set_kernel_switches(*, bool fast_decode, bool bf16_dot, bool prefetch, bool chunked_claims, "
        "bool linear_claims) -> ()", &set_kernel_switches_op);
  m.def("kernel_switches() -> Dict(str, bool)", &kernel_switches_op);
  m.def("prefill_attention(Tensor(a!) out, Tensor q, Tensor k, Tensor v, int[] starts, int[] lens, float scale) -> ()");
  m.def("prefill_attention_takes(bool bf16, int head_dim) -> bool", &prefill_attention_takes);

  m.def("add_rms_norm(Tensor(a!) residual, Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rotary_store_kv(Tensor(c) qkv, int num_heads, int num_kv_heads, Tensor cos, Tensor sin, Tensor? q_weight, "
        "Tensor? k_weight, float eps, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) "
        "-> (Tensor, Tensor, Tensor(c))");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");

  m.def("linear_pack(Tensor weight) -> Tensor");
  m.def("linear(Tensor x, Tensor packed, Tensor? bias) -> Tensor");
  m.def("linear_argmax(Tensor x, Tensor packed) -> Tensor");

  m.def("int4_gemm(Tensor x, Tensor codes, Tensor scales, Tensor zeros, int group_size) -> Tensor");
  m.def("int4_gemm_perm(Tensor x, Tensor codes, Tensor scales, Tensor zeros, int group_size, Tensor perm) -> Tensor");
  m.def("int4_gemm_a8(Tensor x, Tensor codes, Tensor scales, Tensor zeros, int group_size) -> Tensor");
  m.def("int4_mlp(Tensor x, Tensor gate_up_codes, Tensor gate_up_scales, Tensor gate_up_zeros, int gate_up_group, "
        "Tensor down_codes, Tensor down_scales, Tensor down_zeros, int down_group, int a8_rows) -> Tensor");
  m.def("int8_gemm(Tensor x, Tensor codes, Tensor scales) -> Tensor");
  m.def("int8_rows(Tensor codes, Tensor scales, Tensor ids, ScalarType dtype) -> Tensor");
  m.def("int8_argmax(Tensor x, Tensor codes, Tensor scales, bool fused=True) -> Tensor");

  m.def("gguf_gemm(Tensor x, Tensor weight, Tensor parts) -> Tensor");
  m.def("gguf_gemm_a8(Tensor x, Tensor weight, Tensor parts, int a8_rows) -> Tensor");
  m.def("gguf_argmax(Tensor x, Tensor weight, Tensor parts, int a8_rows=0) -> Tensor");
  m.def("gguf_rows(Tensor weight, Tensor parts, Tensor ids, ScalarType dtype) -> Tensor");
  m.def("gguf_pack(Tensor(a!) out, Tensor blocks, int type, int cols) -> ()");

  m.def("top_k_rows(Tensor logits, int k) -> (Tensor, Tensor)");
  m.def("sample_top_k(Tensor logits, int k, Tensor temperature, Tensor top_k, Tensor? top_p, Tensor? min_p, "
        "Tensor? seed_keys, Tensor? counters, Tensor? seeded, Tensor? noise) -> Tensor");
  m.def("lora_add(Tensor(a!) out, Tensor x, Tensor row_slot, Tensor a, Tensor a_start, Tensor b, Tensor pieces, "
        "Tensor p_start) -> ()");

  register_decoder_chain(m);
}

TORCH_LIBRARY_IMPL(folovllm, CPU, m) {
  using namespace folovllm::cpu;
  m.impl("paged_attention", &paged_attention_op);
  m.impl("prefill_attention", &prefill_attention);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rms_norm", &rms_norm);
  m.impl("rotary_store_kv", &rotary_store_kv);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("linear_pack", &linear_pack);
  m.impl("linear", &linear);
  m.impl("linear_argmax", &linear_argmax);
  m.impl("int4_gemm", &int4_gemm);
  m.impl("int4_gemm_perm", &int4_gemm_perm);
  m.impl("int4_gemm_a8", &int4_gemm_a8);
  m.impl("int4_mlp", &int4_mlp);
  m.impl("int8_gemm", &int8_gemm);
  m.impl("int8_rows", &dequantized_int8_rows);
  m.impl("int8_argmax", &int8_argmax);
  m.impl("gguf_gemm", &gguf_gemm);
  m.impl("gguf_gemm_a8", &gguf_gemm_a8);
  m.impl("gguf_argmax", &gguf_argmax);
  m.impl("gguf_rows", &gguf_rows);
  m.impl("gguf_pack", &gguf_pack);
  m.impl("top_k_rows", &top_k_rows);
  m.impl("sample_top_k", &sample_top_k);
  m.impl("lora_add", &lora_add);
}
