/* listen.c -- listening sockets for the poll port (listen.h). */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "listen.h"
#include "log.h"

evutil_socket_t fp_listen_tcp(const char *host, uint16_t port)
{
    struct addrinfo hints, *res = NULL, *ai;
    char portstr[8];
    evutil_socket_t fd = -1;
    int one = 1, rc, err = 0;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_ADDRCONFIG;
    (void)snprintf(portstr, sizeof(portstr), "%u", (unsigned)port);
    if ((rc = getaddrinfo(host, portstr, &hints, &res)) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot resolve %s: %s", host,
               gai_strerror(rc));
        return -1;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
            bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            listen(fd, FP_LISTEN_BACKLOG) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        fp_log(FP_LOG_ERROR, "http: cannot listen on %s:%u: %s", host,
               (unsigned)port, strerror(err));
    return fd;
}

/* Is a server listening on this unix socket? A stale file refuses the
 * connect; a live one accepts it (or is too busy to: EAGAIN). */
static int unix_in_use(const struct sockaddr_un *sa)
{
    evutil_socket_t fd;
    int rc, err;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 1; /* cannot tell: do not remove it */
    rc = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
    err = errno;
    close(fd);
    return rc == 0 || (err != ECONNREFUSED && err != ENOENT);
}

evutil_socket_t fp_listen_unix(const char *path, unsigned mode,
                               struct fp_unix_sock *u)
{
    struct sockaddr_un sa;
    struct stat old, st;
    evutil_socket_t fd;
    mode_t um;
    int rc;

    if (path == NULL) /* never: the caller checks (keeps -Wformat quiet) */
        return -1;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        fp_log(FP_LOG_ERROR, "http: unix socket path too long: %s", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (lstat(path, &old) == 0) {
        if (!S_ISSOCK(old.st_mode)) {
            fp_log(FP_LOG_ERROR, "http: %s exists and is not a socket", path);
            return -1;
        }
        if (unix_in_use(&sa)) {
            fp_log(FP_LOG_ERROR, "http: a server already listens on %s", path);
            return -1;
        }
        if (unlink(path) != 0 && errno != ENOENT) {
            fp_log(FP_LOG_ERROR, "http: cannot remove the stale socket %s: %s",
                   path, strerror(errno));
            return -1;
        }
        fp_log(FP_LOG_INFO, "http: removed the stale socket %s", path);
    } else if (errno != ENOENT) {
        fp_log(FP_LOG_ERROR, "http: cannot check %s: %s", path, strerror(errno));
        return -1;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fp_log(FP_LOG_ERROR, "http: cannot create a unix socket: %s",
               strerror(errno));
        return -1;
    }
    /* Created no wider than 0600, then opened up to mode: never wider than
     * asked, not even for a moment. (Start-up: no other thread.) */
    um = umask(0177);
    rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(um);
    if (rc != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot bind %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (chmod(path, (mode_t)mode) != 0 || stat(path, &st) != 0 ||
        listen(fd, FP_LISTEN_BACKLOG) != 0) {
        fp_log(FP_LOG_ERROR, "http: cannot listen on %s: %s", path,
               strerror(errno));
        (void)unlink(path);
        close(fd);
        return -1;
    }
    u->path = path;
    u->dev = st.st_dev;
    u->ino = st.st_ino;
    return fd;
}

void fp_listen_unix_release(struct fp_unix_sock *u)
{
    struct stat st;

    if (u->path == NULL)
        return;
    if (stat(u->path, &st) == 0 && st.st_dev == u->dev &&
        st.st_ino == u->ino && unlink(u->path) != 0)
        fp_log(FP_LOG_WARN, "http: cannot remove %s: %s", u->path,
               strerror(errno));
    u->path = NULL;
}
