/*
 * examples/regression/linreg.c - the linear regression's dp_model
 * callbacks: one dp_linear layer, float targets, no activations to keep.
 */
#include <string.h>

#include "linreg.h"

/* Small random weights; the bias stays at the zero dp gives init. */
static dp_status lr_init(void *ctx, float *params, uint64_t seed)
{
    linreg *net = ctx;
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    dp_rng_fill_normal(&rng, params, net->tensors[0].numel, 0.0f, 0.1f);
    return DP_OK;
}

static size_t lr_workspace(void *ctx, size_t rows) { return 0; }

static dp_status lr_forward(void *ctx, dp_device *dev, dp_params params, const dp_chunk *c,
                            void *ws, float *logits)
{
    const float *p = params.f32;
    linreg *net = ctx;
    return dp_linear_forward(dev, logits, c->inputs, p + net->tensors[0].offset,
                             p + net->tensors[1].offset, c->rows, net->in_dim, net->out_dim);
}

static dp_status lr_backward(void *ctx, dp_device *dev, dp_params params, float *g,
                             const dp_chunk *c, void *ws, float *dlogits)
{
    const float *p = params.f32;
    linreg *net = ctx;
    return dp_linear_backward(dev, NULL, g + net->tensors[0].offset, g + net->tensors[1].offset,
                              dlogits, c->inputs, p + net->tensors[0].offset, c->rows,
                              net->in_dim, net->out_dim);
}

void linreg_init_model(linreg *net, size_t D, size_t O, dp_model *m)
{
    size_t w_floats = (O * D + DP_PARAM_ALIGN - 1) / DP_PARAM_ALIGN * DP_PARAM_ALIGN;
    net->in_dim = D;
    net->out_dim = O;
    net->tensors[0] = (dp_param_tensor){"weight", 0, O * D, 2, {O, D}, 0};
    net->tensors[1] = (dp_param_tensor){"bias", w_floats, O, 1, {O}, 0};
    memset(m, 0, sizeof *m);
    m->ctx = net;
    m->input_row_bytes = D * sizeof(float);
    m->outputs_per_row = 1;
    m->n_classes = O;
    m->n_params = w_floats + O;
    m->n_tensors = 2;
    m->tensors = net->tensors;
    m->init = lr_init;
    m->workspace_bytes = lr_workspace;
    m->forward = lr_forward;
    m->backward = lr_backward;
    m->target_type = DP_TARGET_F32; /* y(rows, O) floats; target_size 0 = O per row */
}
