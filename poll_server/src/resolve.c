/* resolve.c -- host to address at start-up (resolve.h). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* getaddrinfo under -std=c11 */
#endif
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "resolve.h"

int fp_resolve(const char *host, unsigned port, struct sockaddr_storage *out,
               socklen_t *outlen)
{
    struct addrinfo hints, *res = NULL;
    char ps[8];
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    (void)snprintf(ps, sizeof(ps), "%u", port);
    rc = getaddrinfo(host, ps, &hints, &res);
    if (rc == 0 && (res == NULL || res->ai_addrlen > sizeof(*out)))
        rc = EAI_NONAME;
    if (rc == 0) {
        memcpy(out, res->ai_addr, res->ai_addrlen);
        *outlen = res->ai_addrlen;
    }
    if (res != NULL)
        freeaddrinfo(res);
    return rc;
}

int fp_resolve_numeric(const char *host, unsigned port, char *out,
                       size_t outlen)
{
    struct sockaddr_storage sa;
    socklen_t salen;
    int rc = fp_resolve(host, port, &sa, &salen);

    if (rc == 0)
        rc = getnameinfo((struct sockaddr *)&sa, salen, out, (socklen_t)outlen,
                         NULL, 0, NI_NUMERICHOST);
    return rc;
}
