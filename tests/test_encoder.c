/* Token + position embedding: forward and backward against float64
 * references, += semantics, repeated token ids, determinism, bad arguments. */
#include "kernels/encoder.h"
#include "nn_test_util.h"

#define B 3
#define T 5
#define C 7
#define V 11
#define MAXT 8

/* Token ids drawn from [0, hi): hi < V leaves rows of wte unused, and a
 * small hi makes every id repeat many times within the batch. */
static void random_ids(dp_rng *rng, int32_t *ids, size_t n, uint64_t hi)
{
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)dp_rng_below(rng, hi);
}

Test(encoder, forward_matches_float64)
{
    dp_device *dev = dp_test_cpu(0);
    dp_rng rng;
    dp_rng_seed(&rng, 101);
    float wte[V * C], wpe[MAXT * C];
    int32_t ids[B * T];
    dp_rng_fill_normal(&rng, wte, V * C, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, wpe, MAXT * C, 0.0f, 1.0f);
    random_ids(&rng, ids, B * T, V);

    float *d_wte = dp_test_upload(dev, wte, V * C), *d_wpe = dp_test_upload(dev, wpe, MAXT * C);
    int32_t *d_ids = nn_upload_i32(dev, ids, B * T);
    float *d_out = dp_test_nn_filled(dev, B * T * C, NAN);
    /* T < MAXT: only the first T rows of wpe are read. */
    dp_assert_ok(dp_encoder_forward(dev, d_out, d_ids, d_wte, d_wpe, B, T, C));

    double ref[B * T * C];
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t c = 0; c < C; c++)
                ref[(b * T + t) * C + c] =
                    (double)wte[ids[b * T + t] * C + c] + (double)wpe[t * C + c];
    float *out = dp_test_nn_download(dev, d_out, B * T * C);
    double outd[B * T * C];
    for (size_t i = 0; i < B * T * C; i++) outd[i] = out[i];
    /* One float addition per element: within half an ulp (2^-24 relative). */
    dp_assert_allclose(outd, ref, B * T * C, 0.0, 6e-8);

    free(out);
    dp_device_free(dev, d_wte);
    dp_device_free(dev, d_wpe);
    dp_device_free(dev, d_ids);
    dp_device_free(dev, d_out);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* Runs the backward on fresh copies of the given initial gradients. */
static void run_backward(dp_device *dev, float *dwte, float *dwpe, const float *dwte0,
                         const float *dwpe0, const float *dout, const int32_t *ids)
{
    float *d_dwte = dp_test_upload(dev, dwte0, V * C);
    float *d_dwpe = dp_test_upload(dev, dwpe0, MAXT * C);
    float *d_dout = dp_test_upload(dev, dout, B * T * C);
    int32_t *d_ids = nn_upload_i32(dev, ids, B * T);
    dp_assert_ok(dp_encoder_backward(dev, d_dwte, d_dwpe, d_dout, d_ids, B, T, C));
    dp_assert_ok(dp_copy_d2h(dev, dwte, d_dwte, V * C * sizeof(float)));
    dp_assert_ok(dp_copy_d2h(dev, dwpe, d_dwpe, MAXT * C * sizeof(float)));
    dp_device_free(dev, d_dwte);
    dp_device_free(dev, d_dwpe);
    dp_device_free(dev, d_dout);
    dp_device_free(dev, d_ids);
}

Test(encoder, backward_accumulates_with_repeated_ids)
{
    dp_device *dev = dp_test_cpu(0);
    dp_rng rng;
    dp_rng_seed(&rng, 202);
    float dwte0[V * C], dwpe0[MAXT * C], dout[B * T * C];
    int32_t ids[B * T];
    /* Nonzero initial gradients: the backward must add to them. */
    dp_rng_fill_uniform(&rng, dwte0, V * C, -2.0f, 2.0f);
    dp_rng_fill_uniform(&rng, dwpe0, MAXT * C, -2.0f, 2.0f);
    dp_rng_fill_normal(&rng, dout, B * T * C, 0.0f, 1.0f);
    random_ids(&rng, ids, B * T, 3); /* ids 0..2 only: each repeats ~5 times */
    ids[0] = ids[1] = ids[B * T - 1] = 2; /* adjacent and cross-batch repeats */

    float dwte[V * C], dwpe[MAXT * C];
    run_backward(dev, dwte, dwpe, dwte0, dwpe0, dout, ids);

    double ref_wte[V * C], ref_wpe[MAXT * C], got_wte[V * C], got_wpe[MAXT * C];
    for (size_t i = 0; i < V * C; i++) ref_wte[i] = dwte0[i];
    for (size_t i = 0; i < MAXT * C; i++) ref_wpe[i] = dwpe0[i];
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t c = 0; c < C; c++) {
                double g = dout[(b * T + t) * C + c];
                ref_wte[ids[b * T + t] * C + c] += g;
                ref_wpe[t * C + c] += g;
            }
    for (size_t i = 0; i < V * C; i++) got_wte[i] = dwte[i];
    for (size_t i = 0; i < MAXT * C; i++) got_wpe[i] = dwpe[i];
    /* Float sums of at most B*T = 15 terms of size ~1-2: a few ulps of ~10. */
    dp_assert_allclose(got_wte, ref_wte, V * C, 1e-5, 1e-5);
    dp_assert_allclose(got_wpe, ref_wpe, MAXT * C, 1e-5, 1e-5);
    /* Rows of tokens that never occur, and positions t >= T, are untouched. */
    cr_assert(memcmp(dwte + 3 * C, dwte0 + 3 * C, (V - 3) * C * sizeof(float)) == 0,
              "dwte rows of unused token ids changed");
    cr_assert(memcmp(dwpe + T * C, dwpe0 + T * C, (MAXT - T) * C * sizeof(float)) == 0,
              "dwpe rows past T changed");

    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(encoder, backward_is_deterministic)
{
    /* Two runs, with the buffers at different addresses (a decoy allocation
     * shifts the second run), give bitwise identical gradients. */
    dp_device *dev = dp_test_cpu(0);
    dp_rng rng;
    dp_rng_seed(&rng, 303);
    float dwte0[V * C], dwpe0[MAXT * C], dout[B * T * C];
    int32_t ids[B * T];
    dp_rng_fill_uniform(&rng, dwte0, V * C, -1.0f, 1.0f);
    dp_rng_fill_uniform(&rng, dwpe0, MAXT * C, -1.0f, 1.0f);
    dp_rng_fill_normal(&rng, dout, B * T * C, 0.0f, 1e3f);
    random_ids(&rng, ids, B * T, 2);
    float a_wte[V * C], a_wpe[MAXT * C], b_wte[V * C], b_wpe[MAXT * C];
    run_backward(dev, a_wte, a_wpe, dwte0, dwpe0, dout, ids);
    void *decoy = NULL;
    dp_assert_ok(dp_device_alloc(dev, 4096, &decoy));
    run_backward(dev, b_wte, b_wpe, dwte0, dwpe0, dout, ids);
    cr_assert(memcmp(a_wte, b_wte, sizeof a_wte) == 0, "dwte differs between two runs");
    cr_assert(memcmp(a_wpe, b_wpe, sizeof a_wpe) == 0, "dwpe differs between two runs");
    dp_device_free(dev, decoy);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

Test(encoder, bad_arguments)
{
    dp_device *dev = dp_test_cpu(0);
    float *buf = dp_test_nn_filled(dev, V * C, 0.0f);
    int32_t zeros[B * T] = {0};
    int32_t *ids = nn_upload_i32(dev, zeros, B * T);

    dp_test_nn_assert_invalid(dp_encoder_forward(NULL, buf, ids, buf, buf, B, T, C), "dev", NULL);
    dp_test_nn_assert_invalid(dp_encoder_forward(dev, NULL, ids, buf, buf, B, T, C), "out", "cpu:0");
    dp_test_nn_assert_invalid(dp_encoder_forward(dev, buf, NULL, buf, buf, B, T, C), "inp", "cpu:0");
    dp_test_nn_assert_invalid(dp_encoder_forward(dev, buf, ids, NULL, buf, B, T, C), "wte", "cpu:0");
    dp_test_nn_assert_invalid(dp_encoder_forward(dev, buf, ids, buf, NULL, B, T, C), "wpe", "cpu:0");
    dp_test_nn_assert_invalid(dp_encoder_forward(dev, buf, ids, buf, buf, 0, T, C), "B=0",
                      "dp_encoder_forward");
    dp_test_nn_assert_invalid(dp_encoder_forward(dev, buf, ids, buf, buf, B, T, 0), "C=0", NULL);
    dp_test_nn_assert_invalid(dp_encoder_forward(dev, buf, ids, buf, buf, SIZE_MAX / 2, 4, C),
                      "overflow", NULL);
    dp_test_nn_assert_invalid(dp_encoder_backward(NULL, buf, buf, buf, ids, B, T, C), "dev", NULL);
    dp_test_nn_assert_invalid(dp_encoder_backward(dev, NULL, buf, buf, ids, B, T, C), "dwte", NULL);
    dp_test_nn_assert_invalid(dp_encoder_backward(dev, buf, NULL, buf, ids, B, T, C), "dwpe", NULL);
    dp_test_nn_assert_invalid(dp_encoder_backward(dev, buf, buf, NULL, ids, B, T, C), "dout", NULL);
    dp_test_nn_assert_invalid(dp_encoder_backward(dev, buf, buf, buf, NULL, B, T, C), "inp", NULL);
    dp_test_nn_assert_invalid(dp_encoder_backward(dev, buf, buf, buf, ids, B, 0, C), "T=0",
                      "dp_encoder_backward");

    dp_device_free(dev, buf);
    dp_device_free(dev, ids);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

#define LB 7
#define LT 91
#define LC 5
#define LV 131080
static const int32_t pool[] = {3, 65539, 131075, 0, 65535, 70000, 131079};
#define NPOOL (sizeof pool / sizeof *pool)

/* ids drawn from pool and normal dout, dwte0, dwpe0 (LB, LT, LC, LV). */
typedef struct grouping {
    int32_t ids[LB * LT];
    float dout[LB * LT * LC], dwte0[(size_t)LV * LC], dwpe0[LT * LC];
} grouping;

static grouping *grouping_make(uint64_t seed)
{
    static grouping g;
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    for (size_t i = 0; i < LB * LT; i++) g.ids[i] = pool[dp_rng_below(&rng, NPOOL)];
    dp_rng_fill_normal(&rng, g.dout, LB * LT * LC, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, g.dwte0, (size_t)LV * LC, 0.0f, 1.0f);
    dp_rng_fill_normal(&rng, g.dwpe0, LT * LC, 0.0f, 1.0f);
    return &g;
}

/* dp_encoder_backward on a CPU device from g: dwte(LV,LC), dwpe(LT,LC). */
static void grouping_backward(const grouping *g, float **dwte, float **dwpe)
{
    dp_device *dev = dp_test_cpu(0);
    const size_t BT = LB * LT;
    float *d_dout = dp_test_upload(dev, g->dout, BT * LC);
    float *d_dwte = dp_test_upload(dev, g->dwte0, (size_t)LV * LC);
    float *d_dwpe = dp_test_upload(dev, g->dwpe0, LT * LC);
    int32_t *d_ids = nn_upload_i32(dev, g->ids, BT);
    dp_assert_ok(dp_encoder_backward(dev, d_dwte, d_dwpe, d_dout, d_ids, LB, LT, LC));
    *dwte = dp_test_nn_download(dev, d_dwte, (size_t)LV * LC);
    *dwpe = dp_test_nn_download(dev, d_dwpe, LT * LC);
    void *bufs[] = {d_dout, d_dwte, d_dwpe, d_ids};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dp_device_free(dev, bufs[i]);
    dp_test_nn_assert_all_freed(dev);
    dp_device_close(dev);
}

/* dwte, large: each token's rows are summed from 0 in row order, then added
 * (kernels/encoder.h: rows grouped by token with a stable two-pass radix
 * sort, the order the GPU uses too). Token ids share their low 16 bits
 * (3, 65539, 131075) or their high ones, so both radix passes and their
 * stability matter. Bit for bit against that order emulated here, and
 * against float64 within float rounding. dwpe is checked too. */
Test(encoder, backward_groups_rows_by_token)
{
    const size_t npool = NPOOL, BT = LB * LT;
    const grouping *gr = grouping_make(202);
    const int32_t *ids = gr->ids;
    const float *dout = gr->dout, *dwte0 = gr->dwte0, *dwpe0 = gr->dwpe0;
    float *dwte, *dwpe;
    grouping_backward(gr, &dwte, &dwpe);
    for (size_t p = 0; p < npool; p++) {
        size_t v = (size_t)pool[p];
        for (size_t c = 0; c < LC; c++) {
            float acc = 0.0f;
            double ref = 0.0;
            int seen = 0;
            for (size_t bt = 0; bt < BT; bt++)
                if ((size_t)ids[bt] == v) {
                    acc += dout[bt * LC + c];
                    ref += dout[bt * LC + c];
                    seen = 1;
                }
            float want = seen ? dwte0[v * LC + c] + acc : dwte0[v * LC + c];
            cr_assert(dwte[v * LC + c] == want, "dwte[%zu][%zu] = %.9g, the grouped order gives "
                      "%.9g", v, c, (double)dwte[v * LC + c], (double)want);
            cr_assert(fabs(dwte[v * LC + c] - (dwte0[v * LC + c] + ref)) <= 1e-4,
                      "dwte[%zu][%zu] = %.9g, float64 %.9g", v, c, (double)dwte[v * LC + c],
                      dwte0[v * LC + c] + ref);
        }
    }
    /* Rows of tokens never seen are untouched. */
    for (size_t c = 0; c < LC; c++) cr_assert(dwte[1 * LC + c] == dwte0[1 * LC + c]);
    for (size_t i = 0; i < LT * LC; i++) {
        float acc = 0.0f;
        for (size_t b = 0; b < LB; b++) acc += dout[b * LT * LC + i];
        cr_assert(dwpe[i] == dwpe0[i] + acc, "dwpe[%zu] = %.9g, want %.9g", i, (double)dwpe[i],
                  (double)(dwpe0[i] + acc));
    }
    free(dwte);
    free(dwpe);
}

/* The GPU's dwte items (kernels/encoder.h's sorted-row items; the GPU
 * sorts with CUB's stable radix sort, the host's dp_encoder_group_rows
 * gives the same order): run here over every (sorted row, channel) in
 * reverse (no item depends on another's), they give the CPU backend's
 * dwte bit for bit, on the ids of backward_groups_rows_by_token. */
Test(encoder, gpu_items_over_sorted_rows_match_the_cpu)
{
    const size_t BT = LB * LT;
    const grouping *g = grouping_make(203);
    static float gpu[(size_t)LV * LC];
    static uint32_t scratch[3 * LB * LT + 1 + 65536], keys[LB * LT];
    cr_assert_eq(sizeof scratch / sizeof *scratch, dp_encoder_group_scratch_words(BT));
    uint32_t *order, *seg;
    size_t ng = dp_encoder_group_rows(g->ids, BT, scratch, &order, &seg);
    cr_assert_eq(ng, NPOOL, "%zu groups of %zu ids", ng, NPOOL);
    for (size_t j = 0; j < BT; j++) keys[j] = (uint32_t)g->ids[order[j]];
    memcpy(gpu, g->dwte0, sizeof gpu);
    for (size_t i = BT * LC; i-- > 0;)
        dp_encoder_backward_wte_sorted_elem(gpu, g->dout, keys, order, BT, LC, i);
    float *cpu, *dwpe;
    grouping_backward(g, &cpu, &dwpe);
    cr_assert(memcmp(cpu, gpu, sizeof gpu) == 0, "the sorted-row items give another dwte");
    free(cpu);
    free(dwpe);
}
