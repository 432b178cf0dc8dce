/*
 * tests/fuzz/fuzz_devlist.c - libFuzzer harness for the device-list parser
 * (dp_device_list_parse, the --devices flag) and the byte-size parser
 * (dp_parse_bytes in dp/units.h, --memory-limit).
 *
 * Input: byte 0 gives the capacity (0..DP_MAX_DEVICES), the rest up to the
 * first NUL is the text. An accepted list has 1..cap entries of one kind,
 * non-negative indices and no repeated CPU device, and parsing is
 * deterministic; this build has no GPU, so an accepted list is CPU only.
 * A refused list leaves *n = 0, untouched entries past it and a message.
 * A byte size that parses is the same when parsed again with spaces around.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp/device.h"
#include "dp/units.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t cap = data[0] % (DP_MAX_DEVICES + 1);
    size_t len = strnlen((const char *)data + 1, size - 1);
    char *text = malloc(len + 3);
    FUZZ_CHECK(text, "out of memory");
    memcpy(text, data + 1, len);
    text[len] = '\0';

    // One guard entry past cap catches a write out of bounds of the caller's array.
    dp_device_spec specs[DP_MAX_DEVICES + 1];
    memset(specs, 0x5a, sizeof specs);
    dp_device_spec *buf = cap ? malloc(cap * sizeof *buf) : NULL; // ASan sees overruns
    size_t n = 12345;
    dp_clear_error();
    dp_status st = dp_device_list_parse(text, buf ? buf : specs, cap, &n);
    if (st == DP_OK) {
        FUZZ_CHECK(n >= 1 && n <= cap, "%zu devices with cap %zu for \"%s\"", n, cap, text);
        FUZZ_CHECK(dp_cuda_device_count() > 0 || buf[0].kind == DP_DEVICE_CPU,
                   "a CUDA device accepted without GPUs: \"%s\"", text);
        for (size_t i = 0; i < n; i++) {
            FUZZ_CHECK(buf[i].kind == buf[0].kind, "mixed kinds in \"%s\"", text);
            FUZZ_CHECK(buf[i].index >= 0, "negative index %d in \"%s\"", buf[i].index, text);
            if (buf[i].kind == DP_DEVICE_CPU)
                for (size_t j = 0; j < i; j++)
                    FUZZ_CHECK(buf[j].index != buf[i].index, "cpu:%d twice in \"%s\"",
                               buf[i].index, text);
        }
        // Deterministic, and a larger capacity gives the same list.
        size_t n2 = 0;
        FUZZ_CHECK(dp_device_list_parse(text, specs, DP_MAX_DEVICES, &n2) == DP_OK && n2 == n &&
                       memcmp(specs, buf, n * sizeof *buf) == 0,
                   "reparse of \"%s\" differs", text);
    } else {
        FUZZ_CHECK(st == DP_ERR_INVALID_ARGUMENT || st == DP_ERR_NO_DEVICE,
                   "status %d for \"%s\"", (int)st, text);
        FUZZ_CHECK(n == 0, "n = %zu after an error", n);
        FUZZ_CHECK_MESSAGE(st);
    }
    if (!buf) FUZZ_CHECK(specs[0].index == 0x5a5a5a5a, "cap 0 but an entry was written");
    free(buf);

    // Byte sizes.
    size_t bytes = 0, again = 0;
    st = dp_parse_bytes(text, &bytes);
    if (st == DP_OK) {
        text[len] = '\0';
        char *padded = malloc(len + 3);
        FUZZ_CHECK(padded, "out of memory");
        padded[0] = ' ';
        memcpy(padded + 1, text, len);
        padded[len + 1] = ' ';
        padded[len + 2] = '\0';
        dp_status st2 = dp_parse_bytes(padded, &again);
        FUZZ_CHECK(st2 != DP_OK || again == bytes, "\"%s\" gave %zu, padded %zu", text, bytes,
                   again);
        free(padded);
    } else {
        FUZZ_CHECK(st == DP_ERR_INVALID_ARGUMENT, "status %d", (int)st);
        FUZZ_CHECK_MESSAGE(st);
    }
    free(text);
    return 0;
}
