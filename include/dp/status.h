/*
 * dp/status.h - status codes and the per-thread last-error message.
 *
 * Every fallible dp_ call returns a dp_status. On failure the library also
 * records a one-line message (which call, which device, file:line, and how
 * to fix it) in thread-local storage; dp_last_error() returns it. The
 * library never prints, exits or aborts.
 */
#ifndef DP_STATUS_H
#define DP_STATUS_H

#include "dp/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dp_status {
    DP_OK = 0,
    DP_ERR_INVALID_ARGUMENT, /* a parameter is out of range or inconsistent */
    DP_ERR_OUT_OF_MEMORY,    /* a device or host allocation failed or hit its limit */
    DP_ERR_DEVICE,           /* a backend (CUDA, cuBLAS) call failed */
    DP_ERR_NO_DEVICE,        /* the requested device does not exist here */
    DP_ERR_IO,               /* reading or writing a file failed */
    DP_ERR_FORMAT,           /* a file or string is malformed */
    DP_ERR_NON_FINITE,       /* a loss or gradient is NaN or Inf */
    DP_ERR_ABORTED,          /* the step was aborted because another worker failed */
    DP_ERR_UNSUPPORTED,      /* the operation is not available in this build */
    DP_ERR_INTERNAL,         /* a broken invariant inside dp: please report it */
    DP_ERR_TIMEOUT,          /* a worker made no progress within the engine's watchdog */
    DP_ERR_BUSY,             /* the object is serving another thread's call: retry later */
    DP_ERR_COMM,             /* communication between ranks (MPI) failed */
    DP_STATUS_COUNT
} dp_status;

/* Short, static, human-readable name of a status ("out of memory").
 * Never NULL; a value outside the enum gives "invalid status". */
DP_API const char *dp_strerror(dp_status status);

/* The last error message recorded on the calling thread, or "" if none.
 * The pointer stays valid until the next dp_ call on this thread. */
DP_API const char *dp_last_error(void);

/* Forget the calling thread's last error message. */
DP_API void dp_clear_error(void);

/*
 * For callbacks (a model's forward/backward/validate_inputs, a criterion):
 * records a printf-style message as the calling thread's last error and
 * returns status, so a failing callback reads
 *     return dp_set_error(DP_ERR_INVALID_ARGUMENT, "row %zu: x is NaN", r);
 * The engine prefixes the device and phase: dp_engine_step then fails with
 * dp_last_error() == "cpu:0 forward: row 3: x is NaN". The message is
 * recorded verbatim (no function or file prefix); one past 1023 bytes
 * keeps its start and its end (where the reason and the fix are) around
 * " [...] ", cut between UTF-8 characters. fmt must not be NULL (NULL
 * records "").
 */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 2, 3)))
#endif
DP_API dp_status dp_set_error(dp_status status, const char *fmt, ...);

#ifdef __cplusplus
}
#endif

#endif /* DP_STATUS_H */
