/*
 * models/gpt_hf_internal.h - what reading (gpt_hf.c) and writing
 * (gpt_hf_export.c) Hugging Face's GPT-2 layout share (not installed).
 */
#ifndef DP_MODELS_GPT_HF_INTERNAL_H
#define DP_MODELS_GPT_HF_INTERNAL_H

#include <stdio.h>
#include <string.h>

/* dp's names all start with this; Hugging Face's may not. */
#define PREFIX "transformer."
/* GPT-2's end-of-text id (bos and eos of its config). */
#define GPT2_EOT 50256

/* Whether dp's tensor `name` is one of GPT-2's Conv1D weights (stored
 * [in, out] by Hugging Face). */
static inline int is_conv1d(const char *name)
{
    static const char *const suffix[] = {"attn.c_attn.weight", "attn.c_proj.weight",
                                         "mlp.c_fc.weight", "mlp.c_proj.weight"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        size_t k = strlen(suffix[i]);
        if (n >= k && strcmp(name + n - k, suffix[i]) == 0) return 1;
    }
    return 0;
}

/* Hugging Face's name for dp's tensor name, with prefix ("" or PREFIX). */
static inline void hf_name(const char *name, const char *prefix, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", prefix, name + strlen(PREFIX));
}


#endif /* DP_MODELS_GPT_HF_INTERNAL_H */
