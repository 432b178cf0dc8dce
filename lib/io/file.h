/*
 * io/file.h - reading an input file safely (internal to the library):
 * the name of a file's kind for messages, and a whole regular file read
 * into memory without blocking on a FIFO or device put in its place.
 */
#ifndef DP_IO_FILE_H
#define DP_IO_FILE_H

#include <stddef.h>
#include <sys/types.h>

#include "dp/file.h" /* dp_file_kind */
#include "dp/status.h"


/*
 * The whole regular file at path, malloc'd and NUL-terminated, in *buf
 * (*len bytes before the NUL). what names the file's role in messages
 * ("tokenizer file"). Refused: anything but a regular file (checked again
 * on the open descriptor, so a FIFO swapped in is not waited on), a file
 * over max_bytes, an empty one. On failure *buf is NULL and *len 0.
 */
dp_status dp_file_read(const char *path, const char *what, size_t max_bytes, char **buf,
                       size_t *len);

#endif /* DP_IO_FILE_H */
