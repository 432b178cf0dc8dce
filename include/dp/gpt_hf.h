/*
 * dp/gpt_hf.h - the GPT's weights in from and out to Hugging Face's GPT-2
 * layout (transformers' GPT2LMHeadModel), so a run can start from GPT-2's
 * weights and its result be served and evaluated with transformers.
 *
 * Hugging Face's layout, as save_pretrained and the Hub write it: a
 * directory holding model.safetensors and config.json. The tensors are
 * named "transformer.wte.weight", "transformer.h.{i}.attn.c_attn.weight",
 * ... (the Hub's original gpt2 files drop the "transformer." prefix), and
 * the four projections (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)
 * are GPT-2's Conv1D, whose weight is [in, out]: the transpose of dp's
 * [out, in] (nn.Linear's, nanoGPT's). The LM head is tied to wte
 * (tie_word_embeddings), as dp's is. The model is the one dp/gpt.h
 * describes: learned positions, pre-LayerNorm (eps 1e-5), the tanh GELU
 * (config "gelu_new"), attention scaled by 1/sqrt(head size).
 */
#ifndef DP_GPT_HF_H
#define DP_GPT_HF_H

#include <stddef.h>

#include "dp/gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Reads the weights a run starts from: path is
 *   - a directory with model.safetensors and config.json (Hugging Face),
 *   - a bare .safetensors file in Hugging Face's layout (config.json beside
 *     it is read when present), or
 *   - a dp GPT checkpoint (dp_gpt_checkpoint_save's; its weights only: no
 *     optimizer state, step or data position, unlike resuming).
 * The GPT's shape comes from the tensors: layers from the h.{i} blocks,
 * embedding dimension and vocabulary from wte [V, C], context from wpe
 * [T, C]; the heads from config.json's n_head, or n_head (0: from
 * config.json) for a bare file. n_head given and config.json saying
 * otherwise is refused naming both; so is a config.json whose n_embd,
 * n_layer, n_positions or vocab_size contradict the tensors, or which
 * describes another model (model_type other than gpt2, an activation
 * other than the tanh GELU, another LayerNorm epsilon, an inner size
 * other than 4 C, an untied head).
 *
 * Every tensor is checked: each expected name (with or without the
 * "transformer." prefix, one form throughout), shape and dtype (F32, or
 * F16 and BF16, widened exactly to float32); a missing or misshaped one
 * is named, and so is any tensor the model does not have, except the
 * attention's mask buffers (h.{i}.attn.bias, h.{i}.attn.masked_bias) that
 * older files carry, and an lm_head.weight equal to wte.
 *
 * On success *gpt_out is a new GPT of that shape (free with
 * dp_gpt_destroy) and *params_out its n_params float32 parameters in dp's
 * layout (free with free()).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL arguments; n_head contradicting
 * the file; a bare file with n_head 0 and no config.json, naming the
 * fix), DP_ERR_IO (a file cannot be read), DP_ERR_FORMAT (the message
 * names the file and the tensor or key at fault), DP_ERR_UNSUPPORTED
 * (another architecture, as above), DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_gpt_init_from(const char *path, size_t n_head, dp_gpt **gpt_out,
                                  float **params_out);

/*
 * Writes gpt's parameters (n_params floats in dp's layout) in Hugging
 * Face's layout: dir/model.safetensors (float32, "transformer."-prefixed
 * names, Conv1D weights [in, out], no lm_head: it is tied; metadata
 * format "pt", as transformers requires, and producer "dp", which tells
 * a program that may replace the file that dp wrote it) and dir/config.json
 * (GPT2LMHeadModel, the GPT's sizes, "gelu_new", eps 1e-5, no dropout,
 * bos and eos the end-of-text id 50256 when V >= 50257). dir is created
 * when missing (its parent must exist). Both files or neither
 * (dp/atomic_file.h): config.json is written and synced first, then
 * model.safetensors is written and renamed into place, then config.json;
 * a failed write (a full disk) leaves an earlier export's two files as
 * they were.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL), DP_ERR_IO (dir cannot be made
 * or written, naming it), DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_gpt_export_hf(const char *dir, const dp_gpt *gpt, const float *params);

#ifdef __cplusplus
}
#endif

#endif /* DP_GPT_HF_H */
