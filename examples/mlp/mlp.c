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

/* Layer l (0: fc1, 1: fc2) over the replica's weight and bias in either
 * type: the _bf16 layers read a bf16 replica. */
static dp_status fc_forward(const mlp *net, dp_device *dev, dp_params p, int l, float *out,
                            const float *in, size_t N, size_t IN, size_t OUT)
{
    size_t w = net->tensors[2 * l].offset, b = net->tensors[2 * l + 1].offset;
    if (net->cfg.param_dtype == DP_DTYPE_BF16)
        return dp_linear_forward_bf16(dev, out, in, p.bf16 + w, p.bf16 + b, N, IN, OUT);
    return dp_linear_forward(dev, out, in, p.f32 + w, p.f32 + b, N, IN, OUT);
}

static dp_status fc_backward(const mlp *net, dp_device *dev, dp_params p, float *g, int l,
                             float *din, const float *dout, const float *in, size_t N, size_t IN,
                             size_t OUT)
{
    size_t w = net->tensors[2 * l].offset, b = net->tensors[2 * l + 1].offset;
    if (net->cfg.param_dtype == DP_DTYPE_BF16)
        return dp_linear_backward_bf16(dev, din, g + w, g + b, dout, in, p.bf16 + w, N, IN, OUT);
    return dp_linear_backward(dev, din, g + w, g + b, dout, in, p.f32 + w, N, IN, OUT);
}

static dp_status act_forward(const mlp *net, dp_device *dev, float *out, const float *in, size_t n)
{
    if (net->activation == MLP_RELU) return dp_relu_forward(dev, out, in, n);
    if (net->activation == MLP_SILU) return dp_silu_forward(dev, out, in, n);
    return dp_gelu_forward(dev, out, in, n);
}

static dp_status act_backward(const mlp *net, dp_device *dev, float *din, const float *in,
                              const float *dout, size_t n)
{
    if (net->activation == MLP_RELU) return dp_relu_backward(dev, din, in, dout, n);
    if (net->activation == MLP_SILU) return dp_silu_backward(dev, din, in, dout, n);
    return dp_gelu_backward(dev, din, in, dout, n);
}

/* Dropout's mask is a function of the chunk's global rows, the step and
 * the seed (dp_chunk), so any split over devices drops the same units. */
static int dropping(const mlp *net, const dp_chunk *c)
{
    return c->training && net->dropout > 0.0f;
}

static dp_status mlp_forward(void *ctx, dp_device *dev, dp_params p, const dp_chunk *c, void *ws,
                             float *logits)
{
    const mlp *net = ctx;
    size_t D = net->cfg.in_dim, H = net->cfg.hidden, K = net->cfg.classes, N = c->rows;
    float *pre = ws, *act = pre + N * H;
    dp_status s = fc_forward(net, dev, p, 0, pre, c->inputs, N, D, H);
    if (s == DP_OK) s = act_forward(net, dev, act, pre, N * H);
    if (s == DP_OK && dropping(net, c))
        s = dp_dropout_forward(dev, act, act, net->dropout, c->seed, c->step, c->row_begin,
                               N, H);
    if (s == DP_OK) s = fc_forward(net, dev, p, 1, logits, act, N, H, K);
    return s;
}

static dp_status mlp_backward(void *ctx, dp_device *dev, dp_params p, float *g,
                              const dp_chunk *c, void *ws, float *dlogits)
{
    const mlp *net = ctx;
    size_t D = net->cfg.in_dim, H = net->cfg.hidden, K = net->cfg.classes, N = c->rows;
    float *pre = ws, *act = pre + N * H, *dact = act + N * H;
    dp_status s = fc_backward(net, dev, p, g, 1, dact, dlogits, act, N, H, K);
    /* fc2's gradient is final: the engine may reduce it while fc1's
     * backward runs (dp_grads_ready: back to front, fc2 sits last). */
    size_t fc2 = net->tensors[2].offset;
    if (s == DP_OK) s = dp_grads_ready(c, fc2, net->n_params);
    /* Each backward overwrites d(act) in place: through the dropout, then
     * the activation, to d(pre). */
    if (s == DP_OK && dropping(net, c))
        s = dp_dropout_backward(dev, dact, dact, net->dropout, c->seed, c->step,
                                c->row_begin, N, H);
    if (s == DP_OK) s = act_backward(net, dev, dact, pre, dact, N * H);
    if (s == DP_OK) s = fc_backward(net, dev, p, g, 0, NULL, dact, c->inputs, N, D, H);
    if (s == DP_OK) s = dp_grads_ready(c, 0, fc2);
    return s;
}

void mlp_init_model(mlp *net, const mlp_config *cfg, dp_model *model)
{
    static const char *names[4] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    size_t D = cfg->in_dim, H = cfg->hidden, K = cfg->classes;
    size_t shapes[4][2] = {{H, D}, {H, 0}, {K, H}, {K, 0}};
    net->cfg = *cfg;
    net->activation = MLP_GELU;
    net->dropout = 0.0f;
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
    net->n_params = off;
    model->n_tensors = 4;
    model->tensors = net->tensors;
    model->init = mlp_init;
    model->workspace_bytes = mlp_workspace;
    model->forward = mlp_forward;
    model->backward = mlp_backward;
    model->param_dtype = cfg->param_dtype;
}
