/* evcompat.h -- the libevent this poll server was verified against.
 *
 * Three places use evhttp 2.1.12 internals that no public API replaces
 * (docs/architecture.md, "libevent internals"): http.c's send_now (writes
 * an answer to the connection's socket and completes the request with
 * evhttp_send_reply_end, knowing what evhttp_send_done does), keep_reading
 * (reads a connection with no read callback while its request waits, as
 * evhttp_write_buffer does) and deadline.c's adoption (evhttp sets the
 * connection as its bufferevent's callback argument). Another libevent may
 * break any of them silently, so the build refuses another version's
 * headers (here and in the Makefile) and main() refuses to start when the
 * library loaded at run time is not the one the headers described. */
#ifndef FP_EVCOMPAT_H
#define FP_EVCOMPAT_H

#include <event2/event.h>

/* 2.1.12: major, minor, patch; the low byte (release state) may differ. */
#define FP_LIBEVENT_VERIFIED 0x02010c00
#define FP_LIBEVENT_MASK     0xffffff00

#if (LIBEVENT_VERSION_NUMBER & FP_LIBEVENT_MASK) != FP_LIBEVENT_VERIFIED
#error "poll_server relies on libevent 2.1.12's evhttp internals (src/evcompat.h)"
#endif

#endif
