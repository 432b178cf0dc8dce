/*
 * dp/gpt.h - a GPT-2 language model (nanoGPT's architecture) as a dp_model.
 *
 * Token + learned position embeddings; n_layer pre-LayerNorm blocks of
 * causal multi-head self-attention (fused qkv projection c_attn, output
 * projection c_proj) and an MLP (C -> 4C -> C, GELU tanh); a final
 * LayerNorm; the LM head tied to the token embedding; biases on; no
 * dropout. Parameters live in one flat buffer; each tensor carries
 * nanoGPT's state-dict name and layout (transformer.wte.weight [V,C],
 * transformer.h.{i}.attn.c_attn.weight [3C,C], ...), so a checkpoint is
 * the tensor table written as safetensors.
 *
 * Initialisation as nanoGPT: normal(0, 0.02) for weights and embeddings,
 * zeros for biases, ones for LayerNorm weights, and std 0.02/sqrt(2L) for
 * the residual output projections (attn.c_proj, mlp.c_proj). Weight decay
 * applies to the 2-D tensors only (nanoGPT's configure_optimizers).
 */
#ifndef DP_GPT_H
#define DP_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "dp/checkpoint.h"
#include "dp/device.h"
#include "dp/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dp_gpt_config {
    size_t vocab_size; /* V */
    size_t block_size; /* maximum context T (rows of wpe) */
    size_t n_layer;    /* L */
    size_t n_head;     /* NH, must divide n_embd */
    size_t n_embd;     /* C */
    /* Queries per chunk of DP_GPT_CHUNKED_ATTENTION (any value >= T: one
     * chunk, the whole matrix's calls); 0: DP_GPT_ATTENTION_CHUNK. How the
     * model computes, not what it is: checkpoints do not store it, and
     * every value gives the same tensors and parameters. */
    size_t attention_chunk;
    /* Pad the vocabulary inside the model to Vp, the next multiple of
     * vocab_pad (0 or 1: none, Vp = V), as llm.c pads GPT-2's 50257 to
     * 50304: the LM head's GEMM then has an output dimension, and the
     * logits a row length, that suit the tensor cores (cuBLAS takes slower
     * unaligned kernels otherwise: an H100's bf16 GPT-2 small step 88.5 ms
     * at V = 50257, 78.3 ms at 50304). wte keeps its V rows as a tensor
     * (name, shape and checkpoints unchanged); its slot in the flat
     * buffer holds Vp rows, the Vp - V padded ones zero (a gap: never
     * updated, zero gradients). The logits are Vp wide (the model's
     * n_classes), the padded columns -inf: probability 0, zero gradient,
     * never sampled. Like attention_chunk, how the model computes, not
     * what it is: checkpoints do not store it, and every value trains the
     * same model, to float32 rounding (the padding adds exact zeros, but
     * OpenBLAS and cuBLAS pick their GEMM kernels by the shapes). */
    size_t vocab_pad;
} dp_gpt_config;

typedef struct dp_gpt dp_gpt;

/* Validates the configuration and builds the parameter table.
 * Errors: DP_ERR_INVALID_ARGUMENT naming the bad field (zero sizes,
 * n_head not dividing n_embd, sizes that overflow, a vocab_pad that
 * takes the padded vocabulary past int32 or its embedding past size_t). */
DP_API dp_status dp_gpt_create(const dp_gpt_config *cfg, dp_gpt **out);
DP_API void dp_gpt_destroy(dp_gpt *gpt);


/* Flags of dp_gpt_model. 0: float32 replicas and activations. */
/* bf16 replicas (dp_model.param_dtype = DP_DTYPE_BF16: the engine keeps
 * float32 master weights on the optimizer's slice owners); same tensors,
 * parameters and workspace. Pair it with dp_engine_config.matmul_precision
 * DP_MATMUL_BF16 for bf16 GEMMs throughout. */
#define DP_GPT_BF16 0x1u
/* DP_GPT_BF16 (implied) and each block's activations off the residual
 * stream kept as bfloat16 between forward and backward: the GEMM inputs
 * (ln_1 and ln_2 outputs, q, k and v, the attention output, the GELU
 * output) and the MLP's pre-GELU values, 28 bytes per token, embedding
 * dimension and layer less workspace. Each is computed in float32 and
 * rounded once; the GELU and its backward read the rounded
 * pre-activations, as in llm.c's bf16 training (and in FP32 or TF32
 * precision the GEMMs read rounded inputs), so training tracks DP_GPT_BF16
 * closely rather than bit for bit. The backward keeps the activation
 * gradients off the residual stream as bfloat16 too, each rounded once,
 * as llm.c's bf16 training does: the MLP's (of the GELU's output and
 * input, and of ln_2's output) and, with DP_GPT_FUSED_ATTENTION, the
 * attention's (of its output, of q, k and v, and of ln_1's output); the
 * bias and LayerNorm gradients sum those bfloat16 values in float32. The
 * residual stream and its gradient, the LayerNorm statistics, the
 * attention probabilities and every parameter gradient stay float32, as
 * under PyTorch's autocast. */
#define DP_GPT_BF16_ACT 0x2u
/* Keep no attention probabilities between forward and backward: the
 * backward recomputes each layer's from its q and k (dp_attention_probs:
 * one more batched (T,hs)x(hs,T) GEMM and causal softmax per layer, as
 * FlashAttention's backward does). The recomputation
 * is the forward's own calls on the same values, so training is bit for
 * bit the same as without the flag; the workspace is 4 bytes per head,
 * key position and token per layer smaller, for one (B,NH,T,T) float
 * scratch shared by the layers. */
#define DP_GPT_RECOMPUTE_ATTENTION 0x4u
/* Keep no GELU output between forward and backward: the backward
 * recomputes it from the kept pre-GELU values (one GELU pass per layer,
 * as llm.c's recompute does). The same call on the same values, so
 * training is bit for bit the same; the workspace is 16 bytes (8 with
 * bf16 activations) per token and embedding dimension per layer smaller,
 * for one such (B,T,4C) scratch shared by the layers. */
#define DP_GPT_RECOMPUTE_GELU 0x8u
/* Form the attention for dp_gpt_config.attention_chunk queries at a time
 * (DP_GPT_ATTENTION_CHUNK by default; dp_attention_forward_chunked): no
 * (T,T) probabilities exist at all,
 * the backward recomputes each chunk's (so the flag implies
 * DP_GPT_RECOMPUTE_ATTENTION), and the masked key blocks after each chunk
 * are skipped, about half the score FLOPs. The attention scratch is two
 * (B,NH,min(chunk,T),T) float buffers shared by the layers instead of
 * two (B,NH,T,T). The products over keys are split at chunk boundaries,
 * so training tracks the whole-matrix variant to float32 rounding rather
 * than bit for bit. */
#define DP_GPT_CHUNKED_ATTENTION 0x10u
/* Form the attention fused (dp_attention_forward_fused: FlashAttention-2's
 * online softmax, a CUDA kernel of dp's own on GPUs): no probabilities
 * exist in memory at all, not even a chunk's; each layer keeps only the
 * log of its softmax normalisers (4 bytes per head and token), and the
 * backward recomputes the probabilities inside its kernels (the flag
 * implies DP_GPT_RECOMPUTE_ATTENTION; with DP_GPT_CHUNKED_ATTENTION it
 * is refused). Sums over keys run in another order than the GEMMs', so
 * training tracks the whole-matrix variant to float32 rounding rather
 * than bit for bit; two runs on one device give the same bits. Meant for
 * GPUs: on CPU devices the fused path is the kernels' plain reference
 * (no BLAS), several times slower than the chunked one. */
#define DP_GPT_FUSED_ATTENTION 0x20u
/* Queries per chunk of DP_GPT_CHUNKED_ATTENTION when
 * dp_gpt_config.attention_chunk is 0: the fastest of 32, 64 and 128 on a
 * CPU. Larger chunks mean larger GEMMs (for GPUs) and a larger scratch. */
#define DP_GPT_ATTENTION_CHUNK 64

/* The padded vocabulary Vp of a configuration: vocab_size rounded up to
 * a multiple of vocab_pad (vocab_size itself for a pad of 0 or 1); 0 when
 * cfg is NULL or the rounding overflows. */
DP_API size_t dp_gpt_padded_vocab(const dp_gpt_config *cfg);

/* The model description for dp_engine_create, for the given flags (the
 * DP_GPT_* bits above; 0: float32 throughout). Inputs are block_size int32
 * token ids per row, outputs_per_row = block_size, n_classes = Vp
 * (dp_gpt_padded_vocab: vocab_size without a pad) and target_classes =
 * vocab_size. The tied LM head is split off (dp/model.h): forward writes
 * ln_f's output (rows * block_size, n_embd), head_features = n_embd, and
 * the engine runs the head in chunks of rows
 * (dp_engine_config.logits_chunk_rows), so its workspace is
 * dp_gpt_workspace_bytes less that (B,T,C) buffer. Every variant has the
 * same tensors, parameters and checkpoints; they differ in the replicas'
 * type and in what the workspace keeps. NULL when gpt is NULL, flags
 * holds another bit or both DP_GPT_CHUNKED_ATTENTION and
 * DP_GPT_FUSED_ATTENTION. Owned by gpt. */
DP_API const dp_model *dp_gpt_model(const dp_gpt *gpt, unsigned flags);
DP_API const dp_gpt_config *dp_gpt_config_of(const dp_gpt *gpt);

/* Index of the tensor called name in dp_gpt_model(gpt, 0)->tensors, or -1. */
DP_API long dp_gpt_find_tensor(const dp_gpt *gpt, const char *name);

/* Bytes of activation workspace for B sequences of length T <= block_size. */
DP_API size_t dp_gpt_workspace_bytes(const dp_gpt *gpt, size_t B, size_t T);

/* logits(B,T,Vp) for tokens(B,T) (device pointers; ids in [0,V)), any
 * 1 <= T <= block_size (sampling uses short prefixes), over float32
 * params (n_params floats in the model's layout; the master weights of a
 * bf16 run, from dp_engine_get_params). workspace holds
 * dp_gpt_workspace_bytes(gpt, B, T) bytes and keeps the activations.
 * Vp = dp_gpt_padded_vocab(config): the columns from V on are -inf.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, B or T out of range, an id
 * outside [0, V), named with its position: the ids are read back from a
 * GPU to be checked), DP_ERR_DEVICE. */
DP_API dp_status dp_gpt_forward(const dp_gpt *gpt, dp_device *dev, const float *params,
                                const int32_t *tokens, size_t B, size_t T, void *workspace,
                                float *logits);

/* grads += d loss / d params, from dlogits(B,T,Vp) (clobbered; 0 in the
 * padded columns, which the cross-entropy gives them), after
 * dp_gpt_forward with the same tokens, B, T and workspace. Errors as
 * dp_gpt_forward's. */
DP_API dp_status dp_gpt_backward(const dp_gpt *gpt, dp_device *dev, const float *params,
                                 float *grads, const int32_t *tokens, size_t B, size_t T,
                                 void *workspace, float *dlogits);

/* Copies a flat buffer (parameters, or an optimizer moment) from one
 * GPT's layout to another's of the same tensors: the configurations must
 * agree but for vocab_pad and attention_chunk (a checkpoint's unpadded
 * layout into a padded run's, and back). Tensor by tensor; every float
 * of dst outside the tensors (alignment gaps, wte's padded rows) is 0.
 * dst holds dp_gpt_model(to, 0)->n_params floats, src from's; host
 * memory, not overlapping. Errors: DP_ERR_INVALID_ARGUMENT (NULL, or
 * configurations whose tensors differ, naming the field). */
DP_API dp_status dp_gpt_copy_layout(const dp_gpt *to, float *dst, const dp_gpt *from,
                                    const float *src);

/* --- checkpoints (dp/checkpoint.h) --------------------------------------- */

/* The value of the metadata key "format" in a GPT checkpoint. */
#define DP_GPT_FORMAT "dp-gpt-1"

/* Number of metadata entries a GPT configuration takes: format, n_layer,
 * n_head, n_embd, block_size, vocab_size (nanoGPT's names). */
#define DP_GPT_META_COUNT 6

/* A GPT configuration as checkpoint metadata; kv points into buf. */
typedef struct dp_gpt_metadata {
    dp_checkpoint_kv kv[DP_GPT_META_COUNT];
    char buf[DP_GPT_META_COUNT][24];
} dp_gpt_metadata;

/* Fills out with cfg's entries (out->kv, DP_GPT_META_COUNT of them).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL). */
DP_API dp_status dp_gpt_config_to_metadata(const dp_gpt_config *cfg, dp_gpt_metadata *out);

/* Reads the configuration from an opened checkpoint's metadata: format
 * must be DP_GPT_FORMAT, every size an integer in [1, 2^31], n_layer no
 * larger than the file's tensor count, and the whole a valid configuration
 * (dp_gpt_create's rules). Errors: DP_ERR_INVALID_ARGUMENT (NULL),
 * DP_ERR_FORMAT naming the file and the key. */
DP_API dp_status dp_gpt_config_from_metadata(const dp_checkpoint *ck, dp_gpt_config *out);

/* dp_checkpoint_save of gpt's table with gpt's configuration in the
 * metadata, after ck->meta's other entries (an entry of ck->meta with a
 * configuration key must hold gpt's value: a checkpoint from
 * dp_gpt_checkpoint_load can be saved again as is).
 * Errors: as dp_checkpoint_save; DP_ERR_INVALID_ARGUMENT when ck->meta
 * states a different configuration. */
DP_API dp_status dp_gpt_checkpoint_save(const char *path, const dp_gpt *gpt,
                                        const dp_checkpoint *ck);

/* Opens a GPT checkpoint, builds the GPT its metadata describes and reads
 * its tensors: on success *out is the checkpoint (params, and m and v when
 * stored, in the GPT's layout; free with dp_checkpoint_close) and *gpt_out
 * (may be NULL) the GPT (free with dp_gpt_destroy).
 * Errors: DP_ERR_IO, DP_ERR_FORMAT naming the file and the problem,
 * DP_ERR_OUT_OF_MEMORY, DP_ERR_INVALID_ARGUMENT (NULL path or out). */
DP_API dp_status dp_gpt_checkpoint_load(const char *path, dp_checkpoint **out, dp_gpt **gpt_out);

#ifdef __cplusplus
}
#endif

#endif /* DP_GPT_H */
