/* resolve.h -- a host name to an address, once, at start-up.
 *
 * hiredis's redisAsyncConnect() takes a host and calls getaddrinfo() on
 * it, which blocks the loop on DNS; given a numeric address it does not.
 * So the Redis connections (cache_redis.c, announce.c) resolve their host
 * here before the loop runs and connect to the number ever after. */
#ifndef FP_RESOLVE_H
#define FP_RESOLVE_H

#include <stddef.h>
#include <sys/socket.h>

/* host:port -> its first address (memcached connects to it directly).
 * Returns 0, or a getaddrinfo error (EAI_*): give it to gai_strerror(). */
int fp_resolve(const char *host, unsigned port, struct sockaddr_storage *out,
               socklen_t *outlen);

/* host:port -> out (numeric, NUL-terminated; outlen NI_MAXHOST is ample).
 * Returns 0, or a getaddrinfo error (EAI_*): give it to gai_strerror(). */
int fp_resolve_numeric(const char *host, unsigned port, char *out,
                       size_t outlen);

#endif
