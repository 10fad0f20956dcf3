/* stream.h -- event streams (docs/api.md, "Event streams"): a poll whose
 * Accept names text/event-stream (GET, on nginx's stream route or with no
 * route) is answered with its current answer as an event, then one event
 * per change, on one connection, held on its key (or its parts' keys,
 * chpoll.c) as a long poll is, for [stream] lifetime_s. Each event's id is
 * its answer's ETag, so Last-Event-ID means what If-None-Match does; a
 * comment goes out every [stream] heartbeat_ms; a stream whose key misses
 * or whose change cannot be read ends, and its client's reconnect falls
 * back to the app as a poll does. Formatting and policy here; the holding
 * is hold.c's (through longpoll.c and chpoll.c), the writing conn.c's. */
#ifndef FP_STREAM_H
#define FP_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "httpparse.h"
#include "request.h"
#include "stats.h"

/* Is the request head one for a stream? */
int fp_stream_wanted(const struct fp_http_head *hd);

/* r's answer (value, tagged tag) was read: its stream starts, with that
 * answer as its first event unless r's Last-Event-ID (or If-None-Match)
 * names tag. Returns 1 if the stream is open (the caller holds it on its
 * keys next), 0 if it was answered with that one event and ended ([stream]
 * max held, a drain: the caller lets go of what it holds), -1 if its
 * connection is gone (fp_conn_ops.abandon ran: r is not to be touched). */
int fp_stream_open(struct fp_request *r, const char *value, size_t len,
                   uint64_t tag);

/* The stream's answer is now (value, tag): an event, unless tag is the
 * last event's. 0, or -1 if the connection is gone (r with it). */
int fp_stream_send(struct fp_request *r, const char *value, size_t len,
                   uint64_t tag);

/* Ends r's stream (the caller let go of its keys): a retry hint of
 * 0..[stream] retry_spread_ms, then the connection closes. */
void fp_stream_end(struct fp_request *r, enum fp_stat_stream_end why);

/* The connection's timer fired (fp_conn_ops.stream_tick): a heartbeat, and
 * the timer re-armed. Returns 1 if the stream's life is over (the caller
 * lets go of its keys and calls fp_stream_end), else 0 (or the connection
 * is gone: then -1). */
int fp_stream_tick(struct fp_request *r);

/* r's connection closed under its stream (fp_conn_ops.abandon). */
void fp_stream_gone(struct fp_request *r);

#endif
