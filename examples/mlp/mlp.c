/*
 * examples/mlp/mlp.c - the MLP's dp_model callbacks, built from dp's layers.
 */
#include <math.h>
#include <string.h>

#include "mlp.h"

static size_t align_up(size_t n) { return (n + DP_PARAM_ALIGN - 1) / DP_PARAM_ALIGN * DP_PARAM_ALIGN; }

static dp_status mlp_init(void *ctx, float *params, uint64_t seed)
{
    mlp *net = ctx;
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    for (int i = 0; i < 4; i++) {
        const dp_param_tensor *t = &net->tensors[i];
        if (t->ndim == 2) /* weights: normal(0, 1/sqrt(fan_in)) keeps activations O(1) */
            dp_rng_fill_normal(&rng, params + t->offset, t->numel, 0.0f,
                               1.0f / sqrtf((float)t->shape[1]));
    }
    return DP_OK;
}

/* Workspace: the hidden layer's pre-activation, activation and the
 * gradient of the activation, each (rows, H). */
static size_t mlp_workspace(void *ctx, size_t rows)
{
    const mlp *net = ctx;
    return 3 * rows * net->cfg.hidden * sizeof(float);
}

static dp_status mlp_forward(void *ctx, dp_device *dev, dp_params params, const dp_chunk *c,
                             void *ws, float *logits)
{
    const float *p = params.f32;
    const mlp *net = ctx;
    size_t D = net->cfg.in_dim, H = net->cfg.hidden, K = net->cfg.classes, N = c->rows;
    float *pre = ws, *act = pre + N * H;
    const dp_param_tensor *t = net->tensors;
    dp_status s = dp_linear_forward(dev, pre, c->inputs, p + t[0].offset, p + t[1].offset, N, D, H);
    if (s == DP_OK) s = dp_gelu_forward(dev, act, pre, N * H);
    if (s == DP_OK) s = dp_linear_forward(dev, logits, act, p + t[2].offset, p + t[3].offset, N, H, K);
    return s;
}

static dp_status mlp_backward(void *ctx, dp_device *dev, dp_params params, float *g,
                              const dp_chunk *c, void *ws, float *dlogits)
{
    const float *p = params.f32;
    const mlp *net = ctx;
    size_t D = net->cfg.in_dim, H = net->cfg.hidden, K = net->cfg.classes, N = c->rows;
    float *pre = ws, *act = pre + N * H, *dact = act + N * H;
    const dp_param_tensor *t = net->tensors;
    dp_status s = dp_linear_backward(dev, dact, g + t[2].offset, g + t[3].offset, dlogits, act,
                                     p + t[2].offset, N, H, K);
    /* d(pre) overwrites d(act) in place. */
    if (s == DP_OK) s = dp_gelu_backward(dev, dact, pre, dact, N * H);
    if (s == DP_OK)
        s = dp_linear_backward(dev, NULL, g + t[0].offset, g + t[1].offset, dact, c->inputs,
                               p + t[0].offset, N, D, H);
    return s;
}

void mlp_init_model(mlp *net, const mlp_config *cfg, dp_model *model)
{
    static const char *names[4] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    size_t D = cfg->in_dim, H = cfg->hidden, K = cfg->classes;
    size_t shapes[4][2] = {{H, D}, {H, 0}, {K, H}, {K, 0}};
    net->cfg = *cfg;
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        dp_param_tensor *t = &net->tensors[i];
        memset(t, 0, sizeof *t);
        t->name = names[i];
        t->offset = off;
        t->ndim = shapes[i][1] ? 2 : 1;
        t->shape[0] = shapes[i][0];
        t->shape[1] = shapes[i][1];
        t->numel = shapes[i][0] * (shapes[i][1] ? shapes[i][1] : 1);
        t->weight_decay = t->ndim == 2;
        off = align_up(off + t->numel);
    }
    memset(model, 0, sizeof *model);
    model->ctx = net;
    model->input_row_bytes = D * sizeof(float);
    model->outputs_per_row = 1;
    model->n_classes = K;
    model->n_params = off;
    model->n_tensors = 4;
    model->tensors = net->tensors;
    model->init = mlp_init;
    model->workspace_bytes = mlp_workspace;
    model->forward = mlp_forward;
    model->backward = mlp_backward;
}
