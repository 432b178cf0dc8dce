/*
 * backend/devlist.c - parsing device lists ("cpu:4", "cuda:0,1", "auto").
 *
 * Grammar: list = item ("," item)*; item = "auto" | kind [":" index] | index,
 * where a bare index continues the kind of the item before it
 * ("cpu:0,1" = cpu:0, cpu:1). The one-item list "cpu:N" is a count: N
 * virtual CPU devices (the convention of --devices cpu:4).
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/error.h"

// --- the CUDA module ------------------------------------------------------------

dp_status dp_backend_cuda(const dp_cuda_module **out)
{
    *out = NULL;
#ifdef DP_MODULE_BUILT_CUDA
    const void *table = NULL;
    if (dp_module_load(DP_MODULE_CUDA, &table) != DP_OK) return DP_ERR_NO_DEVICE;
    *out = table;
    return DP_OK;
#else
    return DP_FAIL(DP_ERR_NO_DEVICE, "this build has no CUDA backend; rebuild with -DDP_CUDA=ON "
                   "or use cpu devices");
#endif
}

int dp_backend_cuda_count(void)
{
    const dp_cuda_module *m = NULL;
    return dp_backend_cuda(&m) == DP_OK ? m->count() : 0;
}

int dp_cuda_device_count(void) { return dp_backend_cuda_count(); }

/* No CUDA device for list text: when the CUDA module cannot be loaded,
 * its message (the library and the fix); else NULL-free DP_OK. */
static dp_status cuda_module_missing(const char *text)
{
    const dp_cuda_module *m = NULL;
#ifdef DP_MODULE_BUILT_CUDA
    if (dp_backend_cuda(&m) != DP_OK) {
        dp_error_prefix("device list \"%s\"", text);
        return DP_ERR_NO_DEVICE;
    }
#endif
    (void)m, (void)text;
    return DP_OK;
}

int dp_cpu_core_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > DP_MAX_DEVICES ? DP_MAX_DEVICES : (int)n);
}

/* Parses a non-negative decimal integer filling [s, e); -1 if malformed. */
static long parse_index(const char *s, const char *e)
{
    if (s == e) return -1;
    long v = 0;
    for (const char *p = s; p < e; p++) {
        if (!isdigit((unsigned char)*p)) return -1;
        v = v * 10 + (*p - '0');
        if (v > 1000000) return -1;
    }
    return v;
}

static void trim(const char **s, const char **e)
{
    while (*s < *e && isspace((unsigned char)**s)) (*s)++;
    while (*e > *s && isspace((unsigned char)(*e)[-1])) (*e)--;
}

static dp_status push(dp_device_spec *specs, size_t cap, size_t *n, dp_device_kind kind,
                      int index, const char *text)
{
    /* an engine takes at most DP_MAX_DEVICES, however large specs is */
    size_t most = cap < DP_MAX_DEVICES ? cap : DP_MAX_DEVICES;
    if (*n >= most)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device list \"%s\" has more than %zu devices",
                       text, most);
    if (kind == DP_DEVICE_CPU)
        for (size_t i = 0; i < *n; i++)
            if (specs[i].kind == DP_DEVICE_CPU && specs[i].index == index)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                               "device list \"%s\" names cpu:%d twice; write cpu:N for N "
                               "virtual CPU devices",
                               text, index);
    if (*n > 0 && specs[0].kind != kind)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "device list \"%s\" mixes cpu and cuda devices; use one kind", text);
    specs[*n].kind = kind;
    specs[*n].index = index;
    (*n)++;
    return DP_OK;
}

static dp_status push_all_cuda(dp_device_spec *specs, size_t cap, size_t *n, const char *text)
{
    int count = dp_cuda_device_count();
    if (count == 0) DP_TRY(cuda_module_missing(text));
    if (count == 0)
        return DP_FAIL(DP_ERR_NO_DEVICE, "device list \"%s\" asks for CUDA devices but none "
                       "is visible (no GPU, no driver, or a build without CUDA); use cpu or "
                       "auto", text);
    for (int i = 0; i < count; i++) DP_TRY(push(specs, cap, n, DP_DEVICE_CUDA, i, text));
    return DP_OK;
}

static dp_status parse_list(const char *text, dp_device_spec *specs, size_t cap, size_t *n);

dp_status dp_device_list_parse(const char *text, dp_device_spec *specs, size_t cap, size_t *n)
{
    dp_status s = parse_list(text, specs, cap, n);
    if (s != DP_OK && n) *n = 0; /* no partial list on error */
    return s;
}

static dp_status parse_list(const char *text, dp_device_spec *specs, size_t cap, size_t *n)
{
    if (!text || !specs || !n)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "text, specs and n must not be NULL");
    *n = 0;
    const char *s = text, *end = text + strlen(text);
    trim(&s, &end);
    if (s == end)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "empty device list; use e.g. cpu:4, cuda:0,1 or auto");

    size_t len = (size_t)(end - s);
    if (len == 4 && strncmp(s, "auto", 4) == 0) {
        if (dp_cuda_device_count() > 0) return push_all_cuda(specs, cap, n, text);
        int cores = dp_cpu_core_count();
        for (int i = 0; i < cores; i++) DP_TRY(push(specs, cap, n, DP_DEVICE_CPU, i, text));
        return DP_OK;
    }

    /* The one-item count form "cpu:N". */
    if (len > 4 && strncmp(s, "cpu:", 4) == 0 && !memchr(s, ',', len)) {
        const char *ns = s + 4, *ne = end;
        trim(&ns, &ne);
        long count = parse_index(ns, ne);
        if (count < 0)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device list \"%s\": \"%.*s\" is not a "
                           "device count; write cpu:N with N >= 1", text, (int)(ne - ns), ns);
        if (count == 0) count = 1; /* "cpu:0" names the single device cpu:0 */
        for (long i = 0; i < count; i++) DP_TRY(push(specs, cap, n, DP_DEVICE_CPU, (int)i, text));
        return DP_OK;
    }

    /* Kinds first: a mixed list is a usage error wherever it runs, before any
     * CUDA index is checked against this machine's devices. */
    int named_cpu = 0, named_cuda = 0;
    for (const char *p = s; p < end; p++) {
        if ((p == s || p[-1] == ',' || isspace((unsigned char)p[-1])) && end - p >= 3 &&
            strncmp(p, "cpu", 3) == 0)
            named_cpu = 1;
        if ((p == s || p[-1] == ',' || isspace((unsigned char)p[-1])) && end - p >= 4 &&
            strncmp(p, "cuda", 4) == 0)
            named_cuda = 1;
    }
    if (named_cpu && named_cuda)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT,
                       "device list \"%s\" mixes cpu and cuda devices; use one kind", text);

    int have_kind = 0;
    dp_device_kind kind = DP_DEVICE_CPU;
    int cuda_count = -1;
    while (s <= end) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        const char *ie = comma ? comma : end;
        const char *is = s;
        trim(&is, &ie);
        if (is == ie)
            return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device list \"%s\" has an empty entry; "
                           "separate devices with single commas", text);
        const char *colon = memchr(is, ':', (size_t)(ie - is));
        const char *ks = is, *ke = colon ? colon : ie;
        const char *idx_s = NULL, *idx_e = NULL;
        if (isdigit((unsigned char)*is) || *is == '-' || *is == '+') {
            if (!have_kind)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device list \"%s\" starts with a "
                               "bare index; name the kind first, e.g. cpu:0,1 or cuda:0,1", text);
            idx_s = is;
            idx_e = ie;
        } else {
            size_t kl = (size_t)(ke - ks);
            if (kl == 3 && strncmp(ks, "cpu", 3) == 0) kind = DP_DEVICE_CPU;
            else if (kl == 4 && strncmp(ks, "cuda", 4) == 0) kind = DP_DEVICE_CUDA;
            else if (kl == 4 && strncmp(ks, "auto", 4) == 0)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device list \"%s\": auto must stand "
                               "alone", text);
            else
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device list \"%s\": unknown device "
                               "kind \"%.*s\"; use cpu, cuda or auto", text, (int)kl, ks);
            have_kind = 1;
            if (colon) {
                idx_s = colon + 1;
                idx_e = ie;
                trim(&idx_s, &idx_e);
            }
        }
        if (!idx_s) {
            if (kind == DP_DEVICE_CUDA) DP_TRY(push_all_cuda(specs, cap, n, text));
            else DP_TRY(push(specs, cap, n, DP_DEVICE_CPU, 0, text));
        } else {
            long idx = parse_index(idx_s, idx_e);
            if (idx < 0)
                return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "device list \"%s\": \"%.*s\" is not "
                               "a device index (a non-negative integer)", text,
                               (int)(idx_e - idx_s), idx_s);
            if (kind == DP_DEVICE_CUDA) {
                if (cuda_count < 0) cuda_count = dp_cuda_device_count();
                if (cuda_count == 0) DP_TRY(cuda_module_missing(text));
                if (idx >= cuda_count)
                    return DP_FAIL(DP_ERR_NO_DEVICE, "device list \"%s\": cuda:%ld does not "
                                   "exist (%d CUDA device%s visible)", text, idx, cuda_count,
                                   cuda_count == 1 ? "" : "s");
            }
            DP_TRY(push(specs, cap, n, kind, (int)idx, text));
        }
        if (!comma) break;
        s = comma + 1;
    }
    return DP_OK;
}
