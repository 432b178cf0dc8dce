/*
 * cli/cli_internal.h - what the files of the dp_cli library share and
 * the programs do not call: the rank messages name, and printing a line
 * with the program's prefix.
 */
#ifndef DP_CLI_INTERNAL_H
#define DP_CLI_INTERNAL_H

/* Messages name this rank from now on ("prog: rank 1: ..."). */
void cli_set_rank(int rank);

/* Prints "<program>: [rank r: ]<text>" as one line on stderr. */
void cli_print_line(const char *text);

#endif /* DP_CLI_INTERNAL_H */
