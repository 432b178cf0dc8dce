/*
 * models/gpt_hf_export.c - the GPT to Hugging Face's GPT-2 layout
 * (dp_gpt_export_hf, dp/gpt_hf.h): model.safetensors in F32 with GPT-2's
 * names and Conv1D weights transposed to [in, out], and config.json
 * through jansson, as transformers' save_pretrained writes them.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "dp/atomic_file.h"
#include "dp/gpt_hf.h"
#include "dp/safetensors.h"
#include "io/file.h"
#include "models/gpt_hf_internal.h"

/* config.json of gpt (GPT2Config's keys, no dropout). */
static char *config_json(const dp_gpt_config *c)
{
    json_t *r = json_object();
    json_t *arch = json_array();
    int bad = !r || !arch || json_array_append_new(arch, json_string("GPT2LMHeadModel"));
    bad |= json_object_set_new(r, "architectures", arch);
    bad |= json_object_set_new(r, "model_type", json_string("gpt2"));
    bad |= json_object_set_new(r, "vocab_size", json_integer((json_int_t)c->vocab_size));
    bad |= json_object_set_new(r, "n_positions", json_integer((json_int_t)c->block_size));
    bad |= json_object_set_new(r, "n_ctx", json_integer((json_int_t)c->block_size));
    bad |= json_object_set_new(r, "n_embd", json_integer((json_int_t)c->n_embd));
    bad |= json_object_set_new(r, "n_layer", json_integer((json_int_t)c->n_layer));
    bad |= json_object_set_new(r, "n_head", json_integer((json_int_t)c->n_head));
    bad |= json_object_set_new(r, "n_inner", json_null());
    bad |= json_object_set_new(r, "activation_function", json_string("gelu_new"));
    bad |= json_object_set_new(r, "layer_norm_epsilon", json_real(1e-5));
    bad |= json_object_set_new(r, "initializer_range", json_real(0.02));
    bad |= json_object_set_new(r, "resid_pdrop", json_real(0.0));
    bad |= json_object_set_new(r, "embd_pdrop", json_real(0.0));
    bad |= json_object_set_new(r, "attn_pdrop", json_real(0.0));
    bad |= json_object_set_new(r, "scale_attn_weights", json_true());
    bad |= json_object_set_new(r, "tie_word_embeddings", json_true());
    bad |= json_object_set_new(r, "torch_dtype", json_string("float32"));
    if (c->vocab_size > GPT2_EOT) {
        bad |= json_object_set_new(r, "bos_token_id", json_integer(GPT2_EOT));
        bad |= json_object_set_new(r, "eos_token_id", json_integer(GPT2_EOT));
    }
    char *text = bad ? NULL : json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(r);
    return text;
}

/* config.json written and synced into its temporary file *af, left for
 * the caller to commit (or abort) once model.safetensors is in place. */
static dp_status write_config(const char *path, const dp_gpt_config *c, dp_atomic_file **af)
{
    *af = NULL;
    char *text = config_json(c);
    if (!text) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "building %s failed", path);
    dp_status s = dp_atomic_file_open(path, af);
    if (s == DP_OK) s = dp_atomic_file_write(*af, text, strlen(text));
    if (s == DP_OK) s = dp_atomic_file_write(*af, "\n", 1);
    if (s == DP_OK) s = dp_atomic_file_sync(*af);
    if (s != DP_OK) {
        dp_atomic_file_abort(*af);
        *af = NULL;
    }
    free(text);
    return s;
}

/* model.safetensors: every tensor under its Hugging Face name, the Conv1D
 * weights transposed into conv (one buffer for all of them). */
static dp_status write_model(const char *path, const dp_gpt *gpt, const float *params)
{
    const dp_model *m = dp_gpt_model(gpt, 0);
    size_t conv_floats = 0;
    for (size_t i = 0; i < m->n_tensors; i++)
        if (is_conv1d(m->tensors[i].name)) conv_floats += m->tensors[i].numel;
    float *conv = malloc((conv_floats ? conv_floats : 1) * sizeof *conv);
    dp_st_writer *w = NULL;
    dp_status s = conv ? dp_st_writer_create(&w)
                       : DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    if (s == DP_OK) s = dp_st_writer_set_metadata(w, "format", "pt");
    if (s == DP_OK) s = dp_st_writer_set_metadata(w, "producer", "dp");
    float *at = conv;
    for (size_t i = 0; s == DP_OK && i < m->n_tensors; i++) {
        const dp_param_tensor *t = &m->tensors[i];
        char name[256];
        hf_name(t->name, PREFIX, name, sizeof name);
        const float *src = params + t->offset;
        size_t shape[2] = {t->shape[0], t->ndim == 2 ? t->shape[1] : 0};
        if (is_conv1d(t->name)) { /* dp [out, in] -> Hugging Face [in, out] */
            size_t out = t->shape[0], in = t->shape[1];
            for (size_t o = 0; o < out; o++)
                for (size_t k = 0; k < in; k++) at[k * out + o] = src[o * in + k];
            shape[0] = in, shape[1] = out;
            src = at;
            at += t->numel;
        }
        s = dp_st_writer_add(w, name, DP_DTYPE_F32, shape, t->ndim, src);
    }
    if (s == DP_OK) s = dp_st_writer_write(w, path);
    dp_st_writer_destroy(w);
    free(conv);
    return s;
}

dp_status dp_gpt_export_hf(const char *dir, const dp_gpt *gpt, const float *params)
{
    if (!dir || !*dir || !gpt || !params)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dir, gpt and params must not be NULL or empty");
    struct stat sb;
    int made = 0; /* the directory is this call's: removed again on failure */
    if (stat(dir, &sb) != 0) {
        if (errno != ENOENT || mkdir(dir, 0777) != 0)
            return DP_FAIL(DP_ERR_IO, "cannot create the directory '%s': %s", dir,
                           strerror(errno));
        made = 1;
    } else if (!S_ISDIR(sb.st_mode)) {
        return DP_FAIL(DP_ERR_IO, "'%s' exists and is not a directory; give a directory to "
                       "write model.safetensors and config.json into", dir);
    }
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    if (!path) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "host allocation failed");
    /* Both files or neither: config.json waits synced in its temporary
     * file while model.safetensors is written, and is renamed into place
     * only after it (a full disk or a failed write leaves an earlier
     * export's pair as it was). */
    dp_atomic_file *config = NULL;
    snprintf(path, n, "%s/config.json", dir);
    dp_status s = write_config(path, dp_gpt_config_of(gpt), &config);
    if (s == DP_OK) {
        snprintf(path, n, "%s/model.safetensors", dir);
        s = write_model(path, gpt, params);
    }
    if (s == DP_OK) s = dp_atomic_file_commit(config);
    else dp_atomic_file_abort(config);
    free(path);
    if (s != DP_OK && made) rmdir(dir); /* empty again: the temporary files are gone */
    return s;
}
