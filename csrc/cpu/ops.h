// Every op of the CPU kernel library, as bindings.cpp registers them (torch.ops.folovllm.*). Each file
// that defines some says what they compute; the tier each needs is isa.h's business (has_kernel).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/library.h>

#include <tuple>

namespace folovllm::cpu {

// attention.cpp, attention_prefill.h
// What one paged_attention call computes besides its tensors (the op's keyword arguments).
struct AttentionCall {
  double scale;
  int64_t sliding_window = 0;  // keys a query sees, itself included; 0: the whole context
  int64_t skip_prefills_from = 0;  // chunks of this many rows or more over cached context are the caller's; 0: none
  bool skip_fresh_prefills = true;  // chunks without cached context are the caller's (their rows left unwritten)
};
void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                     const AttentionCall& call);
void prefill_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       at::IntArrayRef starts, at::IntArrayRef lens, double scale);
// Whether prefill_attention takes q/k/v of this dtype (bf16, else fp32) and head_dim at the current tier.
bool prefill_attention_takes(bool bf16, int64_t head_dim);

// attention_quant.cpp: paged_attention over an int8/fp8 cache (kv_quant.h); kv_format_of: its KvFormat, 0 for
// a cache in the query's dtype.
int kv_format_of(at::ScalarType dtype);
void paged_attention_quantized(at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                               const at::Tensor& query_start_loc, const AttentionCall& call);

// fused_ops.cpp
at::Tensor add_rms_norm(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> rotary_store_kv(
    const at::Tensor& qkv, int64_t num_heads, int64_t num_kv_heads, const at::Tensor& cos, const at::Tensor& sin,
    const c10::optional<at::Tensor>& q_weight, const c10::optional<at::Tensor>& k_weight, double eps,
    at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping);
at::Tensor silu_and_mul(const at::Tensor& gate_up);

// linear.cpp, greedy_head.cpp
at::Tensor linear_pack(const at::Tensor& weight);
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias);
at::Tensor linear_argmax(const at::Tensor& x, const at::Tensor& packed);

// quant_gemm.cpp
at::Tensor int4_gemm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& zeros,
                     int64_t group_size);
at::Tensor int4_gemm_perm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                          const at::Tensor& zeros, int64_t group_size, const at::Tensor& perm);
at::Tensor int4_gemm_a8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                        const at::Tensor& zeros, int64_t group_size);
at::Tensor int4_mlp(const at::Tensor& x, const at::Tensor& gate_up_codes, const at::Tensor& gate_up_scales,
                    const at::Tensor& gate_up_zeros, int64_t gate_up_group, const at::Tensor& down_codes,
                    const at::Tensor& down_scales, const at::Tensor& down_zeros, int64_t down_group, int64_t a8_rows);
at::Tensor int8_gemm(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales);
at::Tensor int8_argmax(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, bool fused);
at::Tensor dequantized_int8_rows(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& ids,
                                 at::ScalarType dtype);

// gguf_gemm.cpp
at::Tensor gguf_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& parts);
at::Tensor gguf_gemm_a8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& parts, int64_t a8_rows);
at::Tensor gguf_argmax(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& parts, int64_t a8_rows);
at::Tensor gguf_rows(const at::Tensor& weight, const at::Tensor& parts, const at::Tensor& ids, at::ScalarType dtype);
// gguf_pack.cpp: a GGUF tensor's file blocks into gguf_gemm's packed layout (the load's repacking)
void gguf_pack(at::Tensor& out, const at::Tensor& blocks, int64_t type, int64_t cols);

// sampling.cpp: each row's k largest values (highest first, lower id first among equals) and their ids; each
// row's token sampled among them (the sampler's candidate path)
std::tuple<at::Tensor, at::Tensor> top_k_rows(const at::Tensor& logits, int64_t k);
at::Tensor sample_top_k(const at::Tensor& logits, int64_t k, const at::Tensor& temperature, const at::Tensor& top_k,
                        const c10::optional<at::Tensor>& top_p, const c10::optional<at::Tensor>& min_p,
                        const c10::optional<at::Tensor>& seed_keys, const c10::optional<at::Tensor>& counters,
                        const c10::optional<at::Tensor>& seeded, const c10::optional<at::Tensor>& noise);

// lora.cpp: out += each row's LoRA adapter delta (the tables as lora.cpp describes them)
void lora_add(at::Tensor& out, const at::Tensor& x, const at::Tensor& row_slot, const at::Tensor& a,
              const at::Tensor& a_start, const at::Tensor& b, const at::Tensor& pieces, const at::Tensor& p_start);

// decoder_chain.cpp: the DecoderChain class
void register_decoder_chain(torch::Library& m);

}  // namespace folovllm::cpu
