/*
 * nn/model.c - checks of a model description (dp/model.h): the model
 * interface the engine consumes lives below the engine.
 */
#include "dp/checked.h"
#include "core/error.h"
#include "dp/model.h"

dp_status dp_model_validate(const dp_model *m)
{
    if (!m) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "model must not be NULL");
    if (!m->init || !m->workspace_bytes || !m->forward || !m->backward)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "model callbacks init, workspace_bytes, forward "
                       "and backward must all be set");
    if (!m->input_row_bytes || !m->outputs_per_row || !m->n_classes || !m->n_params)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "model sizes must be > 0 (input_row_bytes %zu, "
                       "outputs_per_row %zu, n_classes %zu, n_params %zu)", m->input_row_bytes,
                       m->outputs_per_row, m->n_classes, m->n_params);
    /* A parameter's bytes on its owner: replica, gradient, two AdamW moments. */
    if (m->n_params > SIZE_MAX / 16)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "n_params %zu is absurd: 16 bytes a parameter "
                       "(replica, gradient, AdamW moments) overflow size_t", m->n_params);
    if (m->n_classes > (size_t)INT32_MAX)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "n_classes %zu does not fit int32 targets",
                       m->n_classes);
    if (m->param_dtype != DP_DTYPE_F32 && m->param_dtype != DP_DTYPE_BF16)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "param_dtype %s; a model's replicas hold "
                       "DP_DTYPE_F32 or DP_DTYPE_BF16 parameters", dp_dtype_name(m->param_dtype));
    if (m->target_classes > m->n_classes)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "target_classes %zu exceeds n_classes %zu; the "
                       "classes a target may take are among the logits (0: all n_classes)",
                       m->target_classes, m->n_classes);
    if ((unsigned)m->target_type >= DP_TARGET_TYPE_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "unknown target_type %d; use DP_TARGET_CLASS "
                       "(int32 class ids) or DP_TARGET_F32 (float values)", (int)m->target_type);
    if (m->target_type == DP_TARGET_CLASS && m->target_size > 1)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "class targets have one id per output row, but "
                       "target_size is %zu; use 0 or 1 (or DP_TARGET_F32 for several values)",
                       m->target_size);
    if (!dp_model_target_row_bytes(m))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "a target row of %zu outputs x %zu elements "
                       "overflows size_t", m->outputs_per_row, dp_model_target_size(m));
    int head = (m->head_features != 0) + (m->head_forward != NULL) + (m->head_backward != NULL);
    if (head != 0 && head != 3)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the model's head is incomplete (head_features "
                       "%zu, head_forward %s, head_backward %s); set all three, or none for a "
                       "forward that writes logits", m->head_features,
                       m->head_forward ? "set" : "NULL", m->head_backward ? "set" : "NULL");
    int head16 = (m->head_forward_bf16 != NULL) + (m->head_backward_bf16 != NULL);
    if (head16 == 1 || (head16 == 2 && head != 3))
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the model's bfloat16 head is incomplete "
                       "(head_forward_bf16 %s, head_backward_bf16 %s, head %s); set both "
                       "beside a float32 head, or neither",
                       m->head_forward_bf16 ? "set" : "NULL",
                       m->head_backward_bf16 ? "set" : "NULL", head == 3 ? "set" : "unset");
    if (m->n_tensors && !m->tensors)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "model has %zu tensors but no table", m->n_tensors);
    size_t prev_end = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const dp_param_tensor *t = &m->tensors[i];
        if (!t->name || !t->name[0])
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor %zu has no name; checkpoints and "
                           "exports key tensors by name", i);
        const char *name = t->name;
        if (t->offset % DP_PARAM_ALIGN)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor %s: offset %zu is not a multiple of "
                           "%d floats", name, t->offset, DP_PARAM_ALIGN);
        if (t->numel == 0 || t->offset > m->n_params || t->numel > m->n_params - t->offset)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor %s: [%zu, +%zu) is empty or outside "
                           "the %zu-float buffer", name, t->offset, t->numel, m->n_params);
        if (t->offset < prev_end)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor %s overlaps the previous tensor or "
                           "is out of order (offset %zu < %zu)", name, t->offset, prev_end);
        prev_end = t->offset + t->numel;
        if (t->ndim < 1 || t->ndim > 4)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor %s: ndim %d is not in 1..4", name,
                           t->ndim);
        size_t prod = 1;
        int fits = 1;
        for (int d = 0; d < t->ndim; d++) fits = fits && dp_size_mul(prod, t->shape[d], &prod);
        if (!fits || prod != t->numel)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "tensor %s: shape has %zu elements but numel "
                           "is %zu", name, prod, t->numel);
    }
    return DP_OK;
}

size_t dp_model_target_size(const dp_model *m)
{
    if (!m) return 0;
    if (m->target_size) return m->target_size;
    return m->target_type == DP_TARGET_F32 ? m->n_classes : 1;
}

size_t dp_model_target_row_bytes(const dp_model *m)
{
    size_t n;
    if (!m || !dp_size_mul(m->outputs_per_row, dp_model_target_size(m), &n) ||
        !dp_size_mul(n, 4, &n))
        return 0;
    return n;
}

const char *dp_target_type_name(dp_target_type t)
{
    switch (t) {
    case DP_TARGET_CLASS: return "DP_TARGET_CLASS";
    case DP_TARGET_F32: return "DP_TARGET_F32";
    case DP_TARGET_TYPE_COUNT: break;
    }
    return "invalid target type";
}

/* The type with what its elements are. */
static const char *target_type_desc(dp_target_type t)
{
    switch (t) {
    case DP_TARGET_CLASS: return "int32 class ids (DP_TARGET_CLASS)";
    case DP_TARGET_F32: return "float values (DP_TARGET_F32)";
    case DP_TARGET_TYPE_COUNT: break;
    }
    return "an unknown target type";
}

dp_status dp_criterion_validate(const dp_criterion *c, const dp_model *m)
{
    if (!c || !m) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "criterion and model must not be NULL");
    if (!c->forward_backward)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "criterion forward_backward must not be NULL");
    if ((unsigned)c->target_type >= DP_TARGET_TYPE_COUNT)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "criterion has unknown target_type %d",
                       (int)c->target_type);
    if (c->target_type != m->target_type)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "the criterion takes %s but the model's targets "
                       "are %s; set the model's target_type to match (e.g. DP_TARGET_F32 for "
                       "dp_criterion_mse)", target_type_desc(c->target_type),
                       target_type_desc(m->target_type));
    return DP_OK;
}
