/*
 * backend/cuda/cudnn_sdpa.cpp - the cuDNN attention module (libdp-cudnn;
 * its table and layouts: cudnn_sdpa.h).
 *
 * One graph per shape and direction, built through cuDNN's frontend
 * (graph API: sdpa and sdpa_backward nodes, causal mask, the scale passed
 * by value, bfloat16 input/output, float32 intermediates and compute)
 * and kept in the context with its execution plan: building a plan costs
 * milliseconds, a step runs each shape 2 * layers times.
 *
 * The tensors are described with strides over dp's buffers, so nothing
 * is copied: q, k, v are read in place in qkv (B,T,3C), c_attn's output,
 * o and do are (B,T,C), and dq, dk, dv land at their places in (B,T,3C)
 * (the layout llm.c's cudnn_att.cpp reads).
 *
 * The frontend reports errors as values, but parts of it can throw
 * (allocation, its loader): every entry catches everything, as no
 * exception may cross into C.
 */
#include <cudnn_frontend.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cudnn_sdpa.h"

namespace fe = cudnn_frontend;

namespace {

enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
                 UID_SCALE };

/* Keep at most this many plans per context: a training run uses two per
 * micro-batch shape (forward, backward), its evaluation another, and
 * sampling one per context length it reaches (the oldest go first). */
const size_t MAX_PLANS = 64;

struct plan {
    dp_sdpa_desc desc;
    int backward;
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t ws;
};

struct context {
    cudnnHandle_t handle = nullptr;
    std::vector<plan> plans; /* oldest first */
};

void say(char *err, size_t n, const char *what, const std::string &why)
{
    if (err && n) std::snprintf(err, n, "%s: %s", what, why.c_str());
}

int declined(char *err, size_t n, const char *what, fe::error_t e)
{
    say(err, n, what, e.get_message());
    return DP_SDPA_DECLINED;
}

bool same(const dp_sdpa_desc &a, const dp_sdpa_desc &b)
{
    return a.B == b.B && a.T == b.T && a.NH == b.NH && a.hs == b.hs &&
           std::memcmp(&a.scale, &b.scale, sizeof a.scale) == 0;
}

/* dims {B, NH, T, hs} with the strides of a (B,T,width) row-major buffer
 * whose head h of this tensor starts at column h*hs. */
std::vector<int64_t> tok_strides(const dp_sdpa_desc &d, int64_t width)
{
    return {d.T * width, d.hs, width, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const char *name,
                                                    int64_t uid, const dp_sdpa_desc &d,
                                                    std::vector<int64_t> stride)
{
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({d.B, d.NH, d.T, d.hs})
                        .set_stride(stride));
}

/* The graph of one direction, described (not built). */
std::shared_ptr<fe::graph::Graph> describe(const dp_sdpa_desc &d, int backward)
{
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t C = d.NH * d.hs;
    const std::vector<int64_t> qkv = tok_strides(d, 3 * C);
    auto Q = input(*g, "Q", UID_Q, d, qkv);
    auto K = input(*g, "K", UID_K, d, qkv);
    auto V = input(*g, "V", UID_V, d, qkv);
    auto scale = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("scale")
                               .set_uid(UID_SCALE)
                               .set_dim({1, 1, 1, 1})
                               .set_stride({1, 1, 1, 1})
                               .set_is_pass_by_value(true)
                               .set_data_type(fe::DataType_t::FLOAT));
    const std::vector<int64_t> stats_dim = {d.B, d.NH, d.T, 1},
                               stats_stride = {d.NH * d.T, d.T, 1, 1};
    if (!backward) {
        auto opts = fe::graph::SDPA_attributes()
                        .set_name("dp_sdpa")
                        .set_generate_stats(true)
                        .set_causal_mask(true)
                        .set_attn_scale(scale);
        auto [O, stats] = g->sdpa(Q, K, V, opts);
        O->set_output(true).set_uid(UID_O).set_dim({d.B, d.NH, d.T, d.hs}).set_stride(
            tok_strides(d, C));
        stats->set_output(true)
            .set_uid(UID_STATS)
            .set_data_type(fe::DataType_t::FLOAT)
            .set_dim(stats_dim)
            .set_stride(stats_stride);
        return g;
    }
    auto O = input(*g, "O", UID_O, d, tok_strides(d, C));
    auto dO = input(*g, "dO", UID_DO, d, tok_strides(d, C));
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(UID_STATS)
                               .set_dim(stats_dim)
                               .set_stride(stats_stride)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("dp_sdpa_backward")
                    .set_causal_mask(true)
                    .set_attn_scale(scale)
                    .set_deterministic_algorithm(true);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opts);
    dQ->set_output(true).set_uid(UID_DQ).set_dim({d.B, d.NH, d.T, d.hs}).set_stride(qkv);
    dK->set_output(true).set_uid(UID_DK).set_dim({d.B, d.NH, d.T, d.hs}).set_stride(qkv);
    dV->set_output(true).set_uid(UID_DV).set_dim({d.B, d.NH, d.T, d.hs}).set_stride(qkv);
    return g;
}

/* The kept plan of (d, backward), built on the first call. */
int plan_of(context *c, const dp_sdpa_desc &d, int backward, plan **out, char *err, size_t n)
{
    for (auto &p : c->plans)
        if (p.backward == backward && same(p.desc, d)) {
            *out = &p;
            return DP_SDPA_DONE;
        }
    const char *what = backward ? "cuDNN's attention backward" : "cuDNN's attention forward";
    std::shared_ptr<fe::graph::Graph> g;
    try { /* the frontend throws where it has no SDPA implementation for d */
        g = describe(d, backward);
    } catch (const std::exception &ex) {
        say(err, n, what, ex.what());
        return DP_SDPA_DECLINED;
    }
    fe::error_t e = g->validate();
    if (e.is_bad()) return declined(err, n, what, e);
    e = g->build_operation_graph(c->handle);
    if (e.is_bad()) return declined(err, n, what, e);
    e = g->create_execution_plans({fe::HeurMode_t::A});
    if (e.is_bad()) return declined(err, n, what, e);
    e = g->check_support(c->handle);
    if (e.is_bad()) return declined(err, n, what, e);
    e = g->build_plans(c->handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
    if (e.is_bad()) return declined(err, n, what, e);
    int64_t ws = 0;
    e = g->get_workspace_size(ws);
    if (e.is_bad()) return declined(err, n, what, e);
    if (c->plans.size() >= MAX_PLANS) c->plans.erase(c->plans.begin());
    c->plans.push_back(plan{d, backward, g, ws < 0 ? 0 : ws});
    *out = &c->plans.back();
    return DP_SDPA_DONE;
}

int run(context *c, plan *p, std::unordered_map<int64_t, void *> &pack, float scale, void *ws,
        char *err, size_t n)
{
    pack[UID_SCALE] = &scale;
    fe::error_t e = p->graph->execute(c->handle, pack, ws);
    if (e.is_bad()) {
        say(err, n, p->backward ? "cuDNN's attention backward" : "cuDNN's attention forward",
            e.get_message());
        return DP_SDPA_FAILED;
    }
    return DP_SDPA_DONE;
}

/* Runs body, turning any exception into DP_SDPA_FAILED with its text. */
template <class F> int guarded(char *err, size_t n, F body)
{
    try {
        return body();
    } catch (const std::exception &ex) {
        say(err, n, "cuDNN", ex.what());
    } catch (...) {
        say(err, n, "cuDNN", "an unknown exception");
    }
    return DP_SDPA_FAILED;
}

// --- the table's entries ---------------------------------------------------------------------

int sdpa_open(void **ctx, void *stream, char *err, size_t n)
{
    *ctx = nullptr;
    return guarded(err, n, [&]() {
        auto c = std::make_unique<context>();
        cudnnStatus_t s = cudnnCreate(&c->handle);
        if (s != CUDNN_STATUS_SUCCESS) {
            say(err, n, "cudnnCreate", cudnnGetErrorString(s));
            return (int)DP_SDPA_DECLINED;
        }
        s = cudnnSetStream(c->handle, (cudaStream_t)stream);
        if (s != CUDNN_STATUS_SUCCESS) {
            say(err, n, "cudnnSetStream", cudnnGetErrorString(s));
            cudnnDestroy(c->handle);
            return (int)DP_SDPA_FAILED;
        }
        *ctx = c.release();
        return (int)DP_SDPA_DONE;
    });
}

void sdpa_close(void *ctx)
{
    auto *c = static_cast<context *>(ctx);
    if (!c) return;
    try {
        c->plans.clear();
    } catch (...) {
    }
    if (c->handle) cudnnDestroy(c->handle);
    delete c;
}

int sdpa_workspace(void *ctx, const dp_sdpa_desc *d, int backward, size_t *bytes, char *err,
                   size_t n)
{
    *bytes = 0;
    return guarded(err, n, [&]() {
        plan *p = nullptr;
        int r = plan_of(static_cast<context *>(ctx), *d, backward, &p, err, n);
        if (r == DP_SDPA_DONE) *bytes = (size_t)p->ws;
        return r;
    });
}

int sdpa_forward(void *ctx, const dp_sdpa_desc *d, const uint16_t *qkv, uint16_t *o,
                 float *lse, void *ws, char *err, size_t n)
{
    return guarded(err, n, [&]() {
        auto *c = static_cast<context *>(ctx);
        plan *p = nullptr;
        int r = plan_of(c, *d, 0, &p, err, n);
        if (r != DP_SDPA_DONE) return r;
        const size_t C = (size_t)(d->NH * d->hs);
        std::unordered_map<int64_t, void *> pack = {
            {UID_Q, (void *)qkv}, {UID_K, (void *)(qkv + C)}, {UID_V, (void *)(qkv + 2 * C)},
            {UID_O, o},           {UID_STATS, lse}};
        return run(c, p, pack, d->scale, ws, err, n);
    });
}

int sdpa_backward(void *ctx, const dp_sdpa_desc *d, const uint16_t *qkv, const uint16_t *o,
                  const uint16_t *dout, const float *lse, uint16_t *dqkv, void *ws, char *err,
                  size_t n)
{
    return guarded(err, n, [&]() {
        auto *c = static_cast<context *>(ctx);
        plan *p = nullptr;
        int r = plan_of(c, *d, 1, &p, err, n);
        if (r != DP_SDPA_DONE) return r;
        const size_t C = (size_t)(d->NH * d->hs);
        std::unordered_map<int64_t, void *> pack = {
            {UID_Q, (void *)qkv},         {UID_K, (void *)(qkv + C)},
            {UID_V, (void *)(qkv + 2 * C)}, {UID_O, (void *)o},
            {UID_DO, (void *)dout},       {UID_STATS, (void *)lse},
            {UID_DQ, dqkv},               {UID_DK, dqkv + C},
            {UID_DV, dqkv + 2 * C}};
        return run(c, p, pack, d->scale, ws, err, n);
    });
}

const dp_cudnn_module table = {
    {DP_MODULE_ABI, "cudnn"}, sdpa_open, sdpa_close, sdpa_workspace, sdpa_forward, sdpa_backward,
};

} // namespace

extern "C" DP_API const void *dp_module_cudnn(void);
extern "C" DP_API const void *dp_module_cudnn(void) { return &table; }
