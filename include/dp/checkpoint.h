/*
 * dp/checkpoint.h - training checkpoints of any dp_model as safetensors.
 *
 * One file holds everything a run needs to continue exactly:
 *   <name>                       each tensor of the model's parameter table
 *                                (dp_model.tensors: name, shape; F32,
 *                                row-major), in table order
 *   optimizer.exp_avg.<name>     AdamW first moments, same shapes
 *   optimizer.exp_avg_sq.<name>  AdamW second moments
 *   __metadata__                 step, optimizer_step, tokenizer (JSON),
 *                                sampler (the training batch sampler's
 *                                state), config (free-form JSON of the
 *                                training options), and the caller's own
 *                                string entries (dp_checkpoint.meta), e.g.
 *                                the model's configuration
 *
 * The checkpoint knows nothing about a particular model: the model that
 * reads it back is built by the caller from the metadata (for a GPT,
 * dp/gpt.h's dp_gpt_checkpoint_save / dp_gpt_checkpoint_load write and
 * read nanoGPT's names and the keys n_layer, n_head, n_embd, block_size,
 * vocab_size and format = "dp-gpt-1").
 *
 * Loading is two calls, so the model can be built from the metadata in
 * between: dp_checkpoint_open reads and checks the metadata,
 * dp_checkpoint_read_tensors checks every tensor against a model's table
 * and copies parameters and moments out.
 *
 * Writes are atomic (dp_st_writer_write): a crash leaves the previous file,
 * and at worst a temporary file "<path>.tmp.<pid>.<n>.<host>" of a killed
 * process, which the next dp_checkpoint_save of the same path on the same
 * host removes (dp_atomic_file_remove_stale).
 */
#ifndef DP_CHECKPOINT_H
#define DP_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "dp/data.h"
#include "dp/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One metadata entry: a UTF-8 key and value, both NUL-terminated. */
typedef struct dp_checkpoint_kv {
    const char *key;
    const char *value;
} dp_checkpoint_kv;

typedef struct dp_checkpoint {
    long step;           /* training steps completed */
    long optimizer_step; /* AdamW's t (steps actually applied) */
    float *params;       /* n_params floats in the model's flat layout */
    float *m, *v;        /* same layout, or NULL when the file has no optimizer state */
    char *tokenizer;     /* dp_tokenizer_serialize JSON, or NULL */
    int has_sampler;
    uint64_t sampler[DP_SAMPLER_STATE_WORDS];
    char *config_json;   /* free-form training options, or NULL */
    /* The caller's metadata entries (n_meta of them; keys unique, none of
     * the reserved keys above). On save, borrowed from the caller; in a
     * checkpoint from dp_checkpoint_open, every entry of the file that is
     * not reserved, owned by the checkpoint. */
    const dp_checkpoint_kv *meta;
    size_t n_meta;
    void *priv;          /* the open file and owned strings; NULL on save */
} dp_checkpoint;

/*
 * Writes ck's parameters (and moments, when ck->m is set) laid out by
 * model's tensor table, and its metadata, to path atomically. tokenizer
 * and config_json may be NULL (not written); m and v are both set or both
 * NULL. Before writing, temporary files of path left by a process of this
 * host that no longer runs (killed mid-write) are removed
 * (dp_atomic_file_remove_stale; another host's are left alone).
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL path/model/ck/params, one moment
 * alone, a step or optimizer_step outside [0, DP_MAX_STEP], a meta entry
 * that is NULL, empty, reserved or
 * repeated), DP_ERR_IO (path and reason), DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_checkpoint_save(const char *path, const dp_model *model,
                                    const dp_checkpoint *ck);

/*
 * Opens path and reads its metadata: step and optimizer_step (integers in
 * [0, DP_MAX_STEP = 2^62]), tokenizer, config, sampler (parsed), and every other entry
 * into ck->meta. params, m and v stay NULL until dp_checkpoint_read_tensors.
 * On success *out is a new checkpoint (free with dp_checkpoint_close).
 * Errors: DP_ERR_INVALID_ARGUMENT, DP_ERR_IO, DP_ERR_FORMAT naming the
 * file and the problem, DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_checkpoint_open(const char *path, dp_checkpoint **out);

/* The metadata value for key among ck->meta, or NULL. */
DP_API const char *dp_checkpoint_meta(const dp_checkpoint *ck, const char *key);

/* Number of tensors in the file ck was opened from (0 for NULL). A
 * model description read from the metadata can be checked against it
 * before anything of its size is built. */
DP_API size_t dp_checkpoint_tensor_count(const dp_checkpoint *ck);

/* The path ck was opened from, or NULL. */
DP_API const char *dp_checkpoint_path(const dp_checkpoint *ck);

/*
 * Checks every tensor of model's table in the file opened by
 * dp_checkpoint_open (present, F32, the table's shape), the optimizer
 * moments all present or all absent, and no other tensor; then allocates
 * ck->params (and ck->m, ck->v when present; model->n_params floats each)
 * and copies them, and closes the file. Call at most once.
 * Errors: DP_ERR_INVALID_ARGUMENT (NULL, already read), DP_ERR_FORMAT
 * naming the file and the tensor, DP_ERR_OUT_OF_MEMORY.
 */
DP_API dp_status dp_checkpoint_read_tensors(dp_checkpoint *ck, const dp_model *model);

/* Frees a checkpoint from dp_checkpoint_open and everything it owns. NULL
 * is a no-op. */
DP_API void dp_checkpoint_close(dp_checkpoint *ck);

#ifdef __cplusplus
}
#endif

#endif /* DP_CHECKPOINT_H */
