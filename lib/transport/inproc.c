/*
 * transport/inproc.c - the transport of a job of one rank: nothing leaves
 * the process. The devices' own collectives (parallel/comm.c) do all the
 * work; every operation here is the wrappers' default (transport.c).
 */
#include "transport/transport.h"

static int accepts(int nranks, int host_memory) { return nranks == 1; }

const dp_transport_ops dp_transport_inproc = {
    .name = "in-process",
    .accepts = accepts,
};
