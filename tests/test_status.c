/* Status strings and the per-thread last-error message. */
#include <pthread.h>
#include <string.h>

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
