/*
 * backend/device_event.c - events of a device's queue (dp/device.h):
 * record, wait, synchronise, elapsed time, each checked and refused while
 * the device records a graph (backend/device_graph.h).
 */
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/device_graph.h"
#include "core/error.h"

struct dp_event {
    dp_device *dev;
    void *h;      /* the backend's handle */
    int recorded; /* dp_event_record has been called */
};

dp_status dp_event_create(dp_device *dev, dp_event **out)
{
    if (!dev || !out) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev and out must not be NULL");
    *out = NULL;
    dp_event *ev = calloc(1, sizeof *ev);
    if (!ev) return DP_FAIL(DP_ERR_OUT_OF_MEMORY, "%s: cannot allocate an event", dev->name);
    ev->dev = dev;
    dp_status s = dev->ops->event_create(dev, &ev->h);
    if (s != DP_OK) {
        free(ev);
        return s;
    }
    *out = ev;
    return DP_OK;
}

void dp_event_destroy(dp_event *ev)
{
    if (!ev) return;
    ev->dev->ops->event_destroy(ev->dev, ev->h);
    free(ev);
}

dp_status dp_event_record(dp_event *ev)
{
    if (!ev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "ev must not be NULL");
    /* A recorded event would mark nothing until a replay: a wait for it
     * now would not wait for the work before it. */
    DP_TRY(dp_device_refuse_recording(ev->dev, "an event"));
    DP_TRY(ev->dev->ops->event_record(ev->dev, ev->h));
    ev->recorded = 1;
    return DP_OK;
}

static dp_status check_recorded(const char *what, const dp_event *ev)
{
    if (!ev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s must not be NULL", what);
    if (!ev->recorded)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s: event %s was never recorded; call "
                       "dp_event_record first", ev->dev->name, what);
    return DP_OK;
}

dp_status dp_event_wait(dp_device *dev, dp_event *ev)
{
    if (!dev) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "dev must not be NULL");
    DP_TRY(check_recorded("ev", ev));
    if (dev->kind != ev->dev->kind)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "%s cannot wait for an event of %s: devices "
                       "must be of one kind", dev->name, ev->dev->name);
    DP_TRY(dp_device_refuse_recording(dev, "a wait for an event"));
    return dev->ops->event_wait(dev, ev->dev, ev->h);
}

dp_status dp_event_synchronize(dp_event *ev)
{
    DP_TRY(check_recorded("ev", ev));
    DP_TRY(dp_device_refuse_recording(ev->dev, "a wait for an event"));
    return ev->dev->ops->event_synchronize(ev->dev, ev->h);
}

dp_status dp_event_elapsed(dp_event *start, dp_event *end, double *seconds)
{
    if (!seconds) return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "seconds must not be NULL");
    DP_TRY(check_recorded("start", start));
    DP_TRY(check_recorded("end", end));
    DP_TRY(dp_device_refuse_recording(end->dev, "a wait for an event"));
    if (start->dev != end->dev)
        return DP_FAIL(DP_ERR_INVALID_ARGUMENT, "events of %s and %s: elapsed time needs two "
                       "events of one device", start->dev->name, end->dev->name);
    return start->dev->ops->event_elapsed(start->dev, start->h, end->h, seconds);
}

int dp_device_is_host_memory(const dp_device *dev) { return dev && dev->ops->host_memory; }
