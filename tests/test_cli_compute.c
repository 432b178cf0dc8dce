/*
 * cli/compute.c's choices that depend on the devices, where no device is
 * needed to check them (the specs are plain values): --attention auto
 * (cli_resolve_attention) and --vocab-pad auto (cli_vocab_pad).
 */
#include "cli_internal.h" /* cli_compute_option */
#include "dp_cli.h"
#include "dp_test.h"

static dp_device_spec spec(dp_device_kind kind, int index)
{
    dp_device_spec s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.index = index;
    return s;
}

/* What auto chose for a bf16 flag, specs and head size. */
static int auto_fused(int bf16, const dp_device_spec *specs, size_t k, size_t hs, int *flagged)
{
    cli_compute cp;
    memset(&cp, 0, sizeof cp);
    cp.bf16 = bf16;
    cli_resolve_attention(&cp, specs, k, hs);
    *flagged = cp.fused_att && !cp.att_given; /* auto's choice */
    cr_assert_eq(cp.chunked_att, 0);
    return cp.fused_att;
}

/* Fused exactly where the tensor-core kernels run: bf16, every device a
 * GPU, head size 64; whole (nothing set) anywhere else. */
Test(cli_compute, attention_auto_is_fused_only_in_bf16_on_gpus_at_head_size_64)
{
    dp_device_spec gpus[2] = {spec(DP_DEVICE_CUDA, 0), spec(DP_DEVICE_CUDA, 0)};
    dp_device_spec cpus[2] = {spec(DP_DEVICE_CPU, 0), spec(DP_DEVICE_CPU, 1)};
    dp_device_spec mixed[2] = {spec(DP_DEVICE_CUDA, 0), spec(DP_DEVICE_CPU, 0)};
    int flagged = -1;
    cr_assert_eq(auto_fused(1, gpus, 2, 64, &flagged), 1);
    cr_assert_eq(flagged, 1);
    cr_assert_eq(auto_fused(1, gpus, 1, 64, &flagged), 1);
    cr_assert_eq(auto_fused(0, gpus, 2, 64, &flagged), 0, "fp32");
    cr_assert_eq(flagged, 0);
    cr_assert_eq(auto_fused(1, gpus, 2, 24, &flagged), 0, "head size 24");
    cr_assert_eq(auto_fused(1, gpus, 2, 128, &flagged), 0, "head size 128");
    cr_assert_eq(auto_fused(1, cpus, 2, 64, &flagged), 0, "CPUs");
    cr_assert_eq(auto_fused(1, mixed, 2, 64, &flagged), 0, "a CPU among them");
    cr_assert_eq(auto_fused(1, gpus, 0, 64, &flagged), 0, "no devices");
}

/* A given --attention is kept, whatever the devices. */
Test(cli_compute, a_given_attention_is_never_changed)
{
    dp_device_spec gpu = spec(DP_DEVICE_CUDA, 0);
    static const char *const values[] = {"whole", "chunked", "fused"};
    for (int i = 0; i < 3; i++) {
        cli_compute cp;
        memset(&cp, 0, sizeof cp);
        cp.bf16 = 1;
        char *argv[] = {(char *)"prog", NULL};
        cr_assert_eq(cli_compute_option(CLI_O_ATTENTION, values[i], argv, &cp), 0);
        cr_assert_eq(cp.att_given, 1);
        cli_resolve_attention(&cp, &gpu, 1, 64);
        cr_assert_eq(cp.fused_att, i == 2, "%s", values[i]);
        cr_assert_eq(cp.chunked_att, i == 1, "%s", values[i]);
        cr_assert_eq(cp.fused_att && !cp.att_given, 0, "%s: taken for auto's", values[i]);
    }
}

/* --vocab-pad auto: 64 with a GPU among the devices, none on CPUs; a
 * given pad is kept. */
Test(cli_compute, vocab_pad_auto_pads_on_gpus_only)
{
    dp_device_spec gpu = spec(DP_DEVICE_CUDA, 0), cpu = spec(DP_DEVICE_CPU, 0);
    cli_compute cp;
    memset(&cp, 0, sizeof cp);
    cr_assert_eq(cli_vocab_pad(&cp, &gpu, 1), CLI_VOCAB_PAD_GPU);
    cr_assert_eq(cli_vocab_pad(&cp, &cpu, 1), 1);
    cp.vocab_pad = 8;
    cr_assert_eq(cli_vocab_pad(&cp, &gpu, 1), 8);
}
