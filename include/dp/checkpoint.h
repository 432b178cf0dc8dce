/*
 * dp/checkpoint.h - GPT training checkpoints as safetensors.
 *
 * One file holds everything a run needs to continue exactly:
 *   transformer.*                nanoGPT's GPT state dict (F32, row-major),
 *                                without the tied lm_head.weight
 *   optimizer.exp_avg.<name>     AdamW first moments, same shapes
 *   optimizer.exp_avg_sq.<name>  AdamW second moments
 *   __metadata__                 n_layer, n_head, n_embd, block_size,
 *                                vocab_size (nanoGPT's names), step,
 *                                optimizer_step, tokenizer (JSON),
 *                                sampler (the training batch sampler's
 *                                state), format = "dp-gpt-1", and free-form
 *                                "config" (JSON of the training options)
 * In PyTorch: `sd = safetensors.torch.load_file(path)` then
 * `model.load_state_dict({k: v for k, v in sd.items() if k.startswith("transformer.")},
 * strict=False)` (strict=False only for the tied lm_head.weight).
 * Writes are atomic (dp_st_writer_write): a crash leaves the previous file.
 */
#ifndef DP_CHECKPOINT_H
#define DP_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "dp/data.h"
#include "dp/gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dp_checkpoint {
    dp_gpt_config config;
    long step;           /* training steps completed */
    long optimizer_step; /* AdamW's t (steps actually applied) */
    float *params;       /* n_params floats in dp_gpt_model(gpt)'s flat layout */
    float *m, *v;        /* same layout, or NULL when the file has no optimizer state */
    char *tokenizer;     /* dp_tokenizer_serialize JSON, or NULL */
    int has_sampler;
    uint64_t sampler[DP_SAMPLER_STATE_WORDS];
    char *config_json;   /* free-form training options, or NULL */
} dp_checkpoint;

/*
 * Writes ck for the model gpt to path atomically. tokenizer and
 * config_json may be NULL (not written); m and v are both set or both NULL.
 * ck->config must equal gpt's; step and optimizer_step must be >= 0.
 * Errors: DP_ERR_INVALID_ARGUMENT, DP_ERR_IO (path and reason),
 * DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_checkpoint_save(const char *path, const dp_gpt *gpt, const dp_checkpoint *ck);

/*
 * Reads and validates a checkpoint: the safetensors structure
 * (dp_st_open), the metadata (every number present and in range), every
 * transformer tensor present with the shape the metadata's configuration
 * implies, and the optimizer moments all present or all absent. On success
 * *out is a new checkpoint (free with dp_checkpoint_free) and *gpt_out
 * (may be NULL) a new GPT of the stored configuration.
 * Errors: DP_ERR_IO, DP_ERR_FORMAT naming the file and the problem,
 * DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_checkpoint_load(const char *path, dp_checkpoint **out, dp_gpt **gpt_out);

DP_API void dp_checkpoint_free(dp_checkpoint *ck);

#ifdef __cplusplus
}
#endif

#endif /* DP_CHECKPOINT_H */
