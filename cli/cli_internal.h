/*
 * cli/cli_internal.h - what the files of the dp_cli library share and
 * the programs do not call: the rank messages name, printing a line with
 * the program's prefix, and the compute options' parser.
 */
#ifndef DP_CLI_INTERNAL_H
#define DP_CLI_INTERNAL_H

/* Messages name this rank from now on ("prog: rank 1: ..."). */
void cli_set_rank(int rank);

/* Prints "<program>: [rank r: ]<text>" as one line on stderr. */
void cli_print_line(const char *text);

/* The one name of the file path reaches, malloc'd (NULL: out of memory):
 * symbolic links followed (to nothing too), "./", ".." and trailing
 * slashes resolved, through the real directory when the file does not
 * exist yet; path itself where even its directory does not. */
char *cli_resolved_path(const char *path);

struct cli_compute;

/* One of CLI_COMPUTE_LONGOPTS's codes with its value into *cp (compute.c):
 * 0, 1 after a message, or CLI_NOT_MINE for another code. */
int cli_compute_option(int c, const char *v, char **argv, struct cli_compute *cp);

#endif /* DP_CLI_INTERNAL_H */
