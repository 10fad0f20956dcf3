/* resolve.c -- host to numeric address at start-up (resolve.h). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* getaddrinfo under -std=c11 */
#endif
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "resolve.h"

int fp_resolve_numeric(const char *host, unsigned port, char *out,
                       size_t outlen)
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
    if (rc == 0 && res != NULL)
        rc = getnameinfo(res->ai_addr, res->ai_addrlen, out, (socklen_t)outlen,
                         NULL, 0, NI_NUMERICHOST);
    else if (rc == 0)
        rc = EAI_NONAME;
    if (res != NULL)
        freeaddrinfo(res);
    return rc;
}
