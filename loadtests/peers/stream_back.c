/* stream_back.c -- the rooms bench's floor upstream (loadtests/rooms.py,
 * system proxied-stream): a trivial event-stream server on a unix socket,
 * behind nginx's proxy_pass with proxy_buffering off.
 *
 *   stream_back <socket path>
 *
 * - GET <anything>: answered with an event-stream head and held; nothing
 *   is ever read from or sent on it again but the events.
 * - POST <anything> with a Content-Length body: the body is written as one
 *   event, "data: <body>\n\n", to every held stream (one write each; a
 *   stream whose socket does not take it whole is dropped and counted),
 *   then answered 201 with the number of streams written to, and closed.
 * - GET /stats: the number of held streams, and closed.
 *
 * The body is not parsed (a floor: no JSON, no cache, no ids); the bench
 * sends one-line JSON. Responses are close-delimited (no Content-Length),
 * as the poll server's streams are. Plain epoll, level-triggered, one
 * thread. Stopped with SIGTERM/SIGINT (the bench, by its pid). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define HEAD_MAX 8192
#define BODY_MAX 65536
#define BUF_START 2048

enum state { READING, STREAMING };

struct conn {
    int fd;
    enum state st;
    size_t len;          /* bytes in buf */
    size_t cap;          /* buf's size */
    size_t head;         /* the head's length, once it is in */
    size_t need;         /* head + body length, once the head is in */
    size_t slot;         /* index in streams[] while STREAMING */
    char *buf;           /* the request (freed once the stream is held) */
};

static struct conn **streams;
static size_t nstreams, cap_streams;
static unsigned long dropped;
static volatile sig_atomic_t stop;

static const char stream_head[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    "Cache-Control: no-store\r\nConnection: close\r\n\r\n";

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static void unhold(struct conn *c)
{
    if (c->st != STREAMING)
        return;
    streams[c->slot] = streams[--nstreams];
    streams[c->slot]->slot = c->slot;
    c->st = READING;
}

static void conn_free(int ep, struct conn *c)
{
    unhold(c);
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->buf);
    free(c);
}

static int hold(struct conn *c)
{
    if (nstreams == cap_streams) {
        size_t n = cap_streams ? cap_streams * 2 : 1024;
        struct conn **p = realloc(streams, n * sizeof(*p));
        if (p == NULL)
            return -1;
        streams = p;
        cap_streams = n;
    }
    c->slot = nstreams;
    streams[nstreams++] = c;
    c->st = STREAMING;
    free(c->buf); /* a held stream keeps only its struct */
    c->buf = NULL;
    c->len = c->cap = 0;
    return 0;
}

/* A short answer and the end of the connection. */
static void answer(int ep, struct conn *c, int code, const char *body)
{
    char out[256];
    int n = snprintf(out, sizeof(out),
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     code, code == 201 ? "Created" : code == 200 ? "OK" : "Bad Request",
                     strlen(body), body);
    if (n > 0 && write(c->fd, out, (size_t)n) < 0)
        perror("stream_back: write");
    conn_free(ep, c);
}

static void publish(int ep, struct conn *c, const char *body, size_t len)
{
    char num[32];
    char *ev = malloc(len + 8);
    size_t evlen = len + 8, sent = 0;

    if (ev == NULL) {
        answer(ep, c, 503, "out of memory\n");
        return;
    }
    memcpy(ev, "data: ", 6);
    memcpy(ev + 6, body, len);
    memcpy(ev + 6 + len, "\n\n", 2);
    for (size_t i = 0; i < nstreams;) {
        struct conn *s = streams[i];
        ssize_t w = send(s->fd, ev, evlen, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w != (ssize_t)evlen) {
            dropped++;
            conn_free(ep, s); /* swaps the last stream into slot i */
            continue;
        }
        sent++;
        i++;
    }
    free(ev);
    snprintf(num, sizeof(num), "%zu\n", sent);
    answer(ep, c, 201, num);
}

/* The request head is in c->buf[0..c->head); act on it once its body is in. */
static void request(int ep, struct conn *c)
{
    if (strncmp(c->buf, "POST ", 5) == 0) {
        size_t clen = 0;
        char *p = c->buf;
        if (c->need > 0) { /* the rest of the body came */
            if (c->len >= c->need)
                publish(ep, c, c->buf + c->head, c->need - c->head);
            return;
        }
        while ((p = strchr(p, '\n')) != NULL && p < c->buf + c->head) {
            p++;
            if (strncasecmp(p, "content-length:", 15) == 0)
                clen = strtoul(p + 15, NULL, 10);
        }
        if (clen > BODY_MAX) {
            answer(ep, c, 400, "body too large\n");
            return;
        }
        c->need = c->head + clen;
        if (c->need + 1 > c->cap) {
            char *b = realloc(c->buf, c->need + 1);
            if (b == NULL) {
                conn_free(ep, c);
                return;
            }
            c->buf = b;
            c->cap = c->need + 1;
        }
        if (c->len >= c->need)
            publish(ep, c, c->buf + c->head, clen);
        return;
    }
    if (strncmp(c->buf, "GET /stats ", 11) == 0) {
        char num[64];
        snprintf(num, sizeof(num), "%zu %lu\n", nstreams, dropped);
        answer(ep, c, 200, num);
        return;
    }
    if (strncmp(c->buf, "GET ", 4) != 0) {
        answer(ep, c, 400, "GET or POST\n");
        return;
    }
    if (write(c->fd, stream_head, sizeof(stream_head) - 1) != (ssize_t)(sizeof(stream_head) - 1)
        || hold(c) != 0)
        conn_free(ep, c);
}

static void readable(int ep, struct conn *c)
{
    char *end;
    ssize_t n;

    if (c->st == STREAMING) { /* nothing to read: only the end of it */
        char sink[512];
        n = read(c->fd, sink, sizeof(sink));
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            conn_free(ep, c);
        return;
    }
    n = read(c->fd, c->buf + c->len, c->cap - 1 - c->len);
    if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            conn_free(ep, c);
        return;
    }
    c->len += (size_t)n;
    c->buf[c->len] = '\0';
    if (c->need > 0) {
        request(ep, c);
        return;
    }
    if ((end = strstr(c->buf, "\r\n\r\n")) != NULL) {
        c->head = (size_t)(end - c->buf) + 4;
        request(ep, c);
    } else if (c->len + 1 >= c->cap) {
        char *b;
        if (c->cap >= HEAD_MAX) {
            answer(ep, c, 400, "head too large\n");
            return;
        }
        if ((b = realloc(c->buf, c->cap * 2)) == NULL) {
            conn_free(ep, c);
            return;
        }
        c->buf = b;
        c->cap *= 2;
    }
}

int main(int argc, char **argv)
{
    struct sockaddr_un sa;
    struct epoll_event ev, evs[256];
    int lfd, ep;

    if (argc != 2 || strlen(argv[1]) >= sizeof(sa.sun_path)) {
        fprintf(stderr, "usage: stream_back <socket path>\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    strcpy(sa.sun_path, argv[1]);
    unlink(argv[1]);
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 4096) != 0) {
        perror("stream_back: listen");
        return 1;
    }
    chmod(argv[1], 0666); /* nginx's workers may run as another user (nginx does the same) */
    if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        perror("stream_back: epoll");
        return 1;
    }
    ev.events = EPOLLIN;
    ev.data.ptr = NULL; /* the listener */
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    while (!stop) {
        int n = epoll_wait(ep, evs, 256, 1000);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (c != NULL) {
                readable(ep, c);
                continue;
            }
            for (;;) {
                int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                    break;
                if ((c = calloc(1, sizeof(*c))) == NULL
                    || (c->buf = malloc(BUF_START)) == NULL) {
                    free(c);
                    close(fd);
                    continue;
                }
                c->fd = fd;
                c->cap = BUF_START;
                ev.events = EPOLLIN;
                ev.data.ptr = c;
                if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
                    close(fd);
                    free(c->buf);
                    free(c);
                }
            }
        }
    }
    unlink(argv[1]);
    return 0;
}
