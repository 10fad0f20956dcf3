/* listen.h -- the poll port's listening sockets (TCP and unix), set up
 * before libevent accepts on them (accept.h: what accept errors do). */
#ifndef FP_LISTEN_H
#define FP_LISTEN_H

#include <stdint.h>
#include <sys/types.h>

#include <event2/util.h>

/* The kernel caps this at net.core.somaxconn. When nginx opens hundreds of
 * upstream connections at once, SYNs beyond the backlog are dropped and
 * retried after a second. */
#define FP_LISTEN_BACKLOG 4096

/* A unix socket file we bound, to be removed at exit if still ours. */
struct fp_unix_sock {
    const char *path;           /* NULL: none */
    dev_t dev;
    ino_t ino;
};

/* A non-blocking listening socket on host:port, or -1 (logged). */
evutil_socket_t fp_listen_tcp(const char *host, uint16_t port);

/* A non-blocking listening unix socket at path with the given mode, or -1
 * (logged). A socket file left by a server that is gone is replaced; one
 * a server still listens on, or a file that is not a socket, is not. The
 * file's identity goes to *u, so that fp_listen_unix_release removes only
 * our own. */
evutil_socket_t fp_listen_unix(const char *path, unsigned mode,
                               struct fp_unix_sock *u);

/* Removes u's socket file, if it is still ours (a restarted instance may
 * have bound a new one at the same path meanwhile); u is then empty. */
void fp_listen_unix_release(struct fp_unix_sock *u);

#endif
