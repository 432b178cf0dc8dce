/*
 * dp/file.h - what a file is, for the messages that refuse it: the one
 * wording the library and its programs share.
 */
#ifndef DP_FILE_H
#define DP_FILE_H

#include <sys/types.h>

#include "dp/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a file of mode m (struct stat's st_mode) is, as a noun for "is a %s"
 * or "(it is a %s)": "directory", "character device", "block device",
 * "FIFO", "socket", else "special file" (never asked of a regular file).
 * A static string. */
DP_API const char *dp_file_kind(mode_t m);

#ifdef __cplusplus
}
#endif

#endif /* DP_FILE_H */
