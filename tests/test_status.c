/* Status strings and the per-thread last-error message. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h" /* dp_error_prefix, dp_error_fit */
#include "dp/tokenizer.h" /* dp_utf8_check */
#include "dp_test.h"

Test(status, every_code_has_a_distinct_name)
{
    for (int i = 0; i < DP_STATUS_COUNT; i++) {
        const char *a = dp_strerror((dp_status)i);
        cr_assert(a && *a && strcmp(a, "invalid status") != 0, "status %d has no name", i);
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(a, dp_strerror((dp_status)j), "statuses %d and %d share a name", i, j);
    }
    cr_assert_str_eq(dp_strerror(DP_STATUS_COUNT), "invalid status");
    cr_assert_str_eq(dp_strerror((dp_status)-3), "invalid status");
}

/* One rule for every *_name of a value outside its enum: "invalid <what>". */
Test(status, names_outside_an_enum_say_invalid)
{
    cr_assert_str_eq(dp_phase_name(DP_PHASE_COUNT), "invalid phase");
    cr_assert_str_eq(dp_phase_name((dp_phase)-1), "invalid phase");
    cr_assert_str_eq(dp_mode_name(DP_MODE_COUNT), "invalid mode");
    cr_assert_str_eq(dp_dtype_name(DP_DTYPE_COUNT), "invalid dtype");
    cr_assert_str_eq(dp_tokenizer_kind_name(DP_TOKENIZER_KIND_COUNT), "invalid tokenizer kind");
    cr_assert_str_eq(dp_split_name(DP_SPLIT_COUNT), "invalid split");
    cr_assert_str_eq(dp_strerror(DP_STATUS_COUNT), "invalid status");
}

Test(status, error_message_names_call_and_device)
{
    dp_clear_error();
    cr_assert_str_eq(dp_last_error(), "");
    dp_device *dev = dp_test_cpu(3);
    void *p = (void *)&p;
    cr_assert_eq(dp_device_alloc(dev, 0, &p), DP_ERR_INVALID_ARGUMENT);
    cr_assert_null(p, "a failed allocation must set *out to NULL");
    const char *msg = dp_last_error();
    cr_assert(strstr(msg, "dp_device_alloc") && strstr(msg, "cpu:3") && strstr(msg, "device.c:"),
              "message lacks call, device or file:line: %s", msg);
    dp_device_close(dev);
}

static void *other_thread(void *arg)
{
    (void)arg;
    /* A fresh thread starts with no message. */
    return (void *)(strcmp(dp_last_error(), "") == 0 ? (void *)1 : NULL);
}

Test(status, last_error_is_per_thread)
{
    dp_device *dev = dp_test_cpu(0);
    void *p;
    cr_assert_eq(dp_device_alloc(dev, 0, &p), DP_ERR_INVALID_ARGUMENT);
    cr_assert_str_neq(dp_last_error(), "");
    pthread_t th;
    void *ret = NULL;
    cr_assert_eq(pthread_create(&th, NULL, other_thread, NULL), 0);
    pthread_join(th, &ret);
    cr_assert_not_null(ret, "another thread saw this thread's error message");
    dp_device_close(dev);
}

/* A message past the 1023 bytes kept (a 5000-byte path) keeps its start
 * and its end, where the reason and the fix are; cut between UTF-8
 * characters, never inside one. Short messages are kept whole. */
Test(status, a_long_message_keeps_its_start_and_its_end)
{
    static char path[5001];
    memset(path, 'a', 5000);
    dp_set_error(DP_ERR_IO, "cannot open '/x/%s': File name too long; use a shorter path", path);
    const char *m = dp_last_error();
    size_t n = strlen(m);
    cr_assert_lt(n, 1024);
    cr_assert_gt(n, 900, "only %zu bytes kept", n);
    cr_assert_eq(strncmp(m, "cannot open '/x/aaa", 19), 0, "%s", m);
    cr_assert(strstr(m, " [...] "), "%s", m);
    const char *end = "File name too long; use a shorter path";
    cr_assert_str_eq(m + n - strlen(end), end);

    /* two-byte characters: whichever byte the cut falls on, the rest is UTF-8 */
    for (size_t pad = 0; pad < 3; pad++) {
        static char text[4000];
        memset(text, 'x', pad);
        for (size_t i = pad; i + 2 <= 3000; i += 2) memcpy(text + i, "\xc3\xa9", 2);
        text[pad + (3000 - pad) / 2 * 2] = '\0';
        dp_set_error(DP_ERR_FORMAT, "%s!", text);
        m = dp_last_error();
        cr_assert_eq(dp_utf8_check(m, strlen(m), NULL), DP_OK, "pad %zu: cut inside a character",
                     pad);
        cr_assert_eq(m[strlen(m) - 1], '!');
    }

    /* a prefix on a long message keeps the end too */
    dp_set_error(DP_ERR_IO, "%s: the reason", path);
    dp_error_prefix("rank %d", 1);
    m = dp_last_error();
    cr_assert_eq(strncmp(m, "rank 1: aaa", 11), 0, "%s", m);
    cr_assert_str_eq(m + strlen(m) - 12, ": the reason");

    dp_set_error(DP_ERR_IO, "short %d", 5);
    cr_assert_str_eq(dp_last_error(), "short 5");
}

/* dp_error_fit, for messages kept outside the thread's last error (a
 * worker's, a rank's outcome): whole when they fit, else start and end,
 * cut between UTF-8 characters; in place too. */
Test(status, fit_keeps_start_and_end_in_any_buffer)
{
    char dst[64];
    dp_error_fit(dst, sizeof dst, "short", 5);
    cr_assert_str_eq(dst, "short");
    char src[300];
    size_t n = 0;
    for (; n + 2 <= 200; n += 2) memcpy(src + n, "\xc3\xa9", 2);
    n += (size_t)sprintf(src + n, ": the reason; the fix");
    for (size_t cap = 20; cap <= sizeof dst; cap += 7) {
        dp_error_fit(dst, cap, src, n);
        size_t m = strlen(dst);
        cr_assert_lt(m, cap);
        cr_assert_eq(dp_utf8_check(dst, m, NULL), DP_OK, "cap %zu: cut inside a character", cap);
        cr_assert(strstr(dst, " [...] "), "cap %zu: %s", cap, dst);
        cr_assert_str_eq(dst + m - 7, "the fix", "cap %zu: %s", cap, dst);
    }
    char in_place[300];
    memcpy(in_place, src, n + 1);
    dp_error_fit(in_place, 64, in_place, n);
    dp_error_fit(dst, 64, src, n);
    cr_assert_str_eq(in_place, dst);
    dp_error_fit(dst, 4, src, n); /* no room for both ends: a start of whole characters */
    cr_assert_str_eq(dst, "\xc3\xa9");
    dp_error_fit(dst, 1, src, n);
    cr_assert_str_eq(dst, "");
}
