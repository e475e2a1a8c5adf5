/*
 * wireload: the load generator and the fake broker of bench/workers.py, in C.
 *
 * Why C: on a two-core machine the proxy's workers share the cores with whatever
 * drives them. The Python load processes and fake broker took 40-50 % of the two
 * cores at two workers' capacity (bench/RESULTS.md, seventeenth session), so the
 * two-worker figure measured what the load left over. This program does the same
 * work (one epoll loop, no per-request allocation) for a few per cent of a core.
 * bench/workers.py compiles it with the system's cc and runs it; nothing else
 * uses it.
 *
 *   wireload broker PORT RESPONSES
 *       Listen on 127.0.0.1:PORT (SO_REUSEPORT: several may share it) and answer
 *       every request frame with the response recorded for its API key, its
 *       correlation id copied from the request. RESPONSES holds records of
 *       [u16 api_key][i32 size][size bytes] (big-endian). Prints "ready".
 *
 *   wireload load PORT REQUESTS CONNS DEPTH RATE WARM WINDOW
 *       Open CONNS connections to 127.0.0.1:PORT and keep up to DEPTH requests in
 *       flight on each, offering RATE requests/s in all (0: as many as the depth
 *       allows). REQUESTS holds size-prefixed request frames, sent in order,
 *       round and round, each with a fresh correlation id. Prints "connected"
 *       once every connection is up, then, WARM seconds later, counts the
 *       responses received in the next WINDOW seconds and prints
 *       "<responses> <seconds>"; its connections stay open, idle, until its
 *       stdin is closed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK 65536
#define MAX_EVENTS 256
#define MAX_BURST 8 /* frames per connection per turn when rate-limited, as the Python loader */
#define TICK 0.002   /* seconds between offers, as the Python loader */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} buf_t;

typedef struct {
    int fd;
    buf_t in, out;
    int inflight;
    int32_t corr;
    int want_out; /* EPOLLOUT registered */
} conn_t;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) die("realloc");
    b->cap = cap;
}

static void append(buf_t *b, const void *p, size_t n) {
    reserve(b, n);
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void consume(buf_t *b, size_t n) {
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The length of the size-prefixed frame that starts at `pos` in `b`, prefix included, once it is all there (else 0):
   the broker's and the load's read loops both cut their input with it. */
static size_t whole_frame(const buf_t *b, size_t pos) {
    if (b->len - pos < 4) return 0;
    size_t len = 4 + be32(b->p + pos);
    return b->len - pos < len ? 0 : len;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static buf_t read_file(const char *path) {
    buf_t b = {0};
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    uint8_t chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) append(&b, chunk, n);
    fclose(f);
    return b;
}

static void nonblocking(int fd) {
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) die("fcntl");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* as asyncio/uvloop sockets */
}

static void watch(int ep, conn_t *c, int out) {
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl");
    c->want_out = out;
}

/* Write what `c` holds; returns -1 when the peer is gone. */
static int flush_out(int ep, conn_t *c) {
    size_t off = 0;
    while (off < c->out.len) {
        ssize_t w = write(c->fd, c->out.p + off, c->out.len - off);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            return -1;
        }
        off += (size_t)w;
    }
    consume(&c->out, off);
    if ((c->out.len > 0) != c->want_out) watch(ep, c, c->out.len > 0);
    return 0;
}

/* Read everything available into c->in; returns -1 on EOF or error. */
static int fill_in(conn_t *c) {
    for (;;) {
        reserve(&c->in, READ_CHUNK);
        ssize_t r = read(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len);
        if (r > 0) {
            c->in.len += (size_t)r;
            continue;
        }
        if (r == 0) return -1;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno == EINTR) continue;
        return -1;
    }
}

static void drop(int ep, conn_t *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->in.p);
    free(c->out.p);
    free(c);
}

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

/* ---- broker ---- */

typedef struct {
    const uint8_t *frame; /* size-prefixed */
    size_t len;
} frame_t;

static frame_t responses[65536];

static int broker(int port, const char *path) {
    buf_t file = read_file(path);
    for (size_t pos = 0; pos + 6 <= file.len;) {
        unsigned key = (unsigned)file.p[pos] << 8 | file.p[pos + 1];
        size_t len = 4 + be32(file.p + pos + 2);
        if (pos + 2 + len > file.len || len < 8) {
            fprintf(stderr, "wireload: %s: truncated response record\n", path);
            return 1;
        }
        responses[key] = (frame_t){file.p + pos + 2, len};
        pos += 2 + len;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (ls < 0) die("socket");
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(ls, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    struct sockaddr_in a = loopback(port);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    if (listen(ls, 1024) < 0) die("listen");
    fcntl(ls, F_SETFL, fcntl(ls, F_GETFL) | O_NONBLOCK);
    int ep = epoll_create1(0);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &lev);
    printf("ready\n");
    fflush(stdout);
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, -1);
        if (n < 0 && errno != EINTR) die("epoll_wait");
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept(ls, NULL, NULL)) >= 0) {
                    nonblocking(fd);
                    c = calloc(1, sizeof *c);
                    c->fd = fd;
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
                }
                continue;
            }
            int gone = (evs[i].events & EPOLLIN) && fill_in(c) < 0;
            size_t pos = 0, len;
            while ((len = whole_frame(&c->in, pos)) >= 12) { /* a request's header holds its key and correlation id */
                unsigned key = (unsigned)c->in.p[pos + 4] << 8 | c->in.p[pos + 5];
                frame_t r = responses[key];
                if (!r.frame) {
                    fprintf(stderr, "wireload broker: no response recorded for API key %u\n", key);
                    return 1;
                }
                append(&c->out, r.frame, 4);
                append(&c->out, c->in.p + pos + 8, 4); /* the request's correlation id */
                append(&c->out, r.frame + 8, r.len - 8);
                pos += len;
            }
            consume(&c->in, pos);
            if (gone || flush_out(ep, c) < 0) drop(ep, c);
        }
    }
}

/* ---- load ---- */

static frame_t *requests;
static size_t n_requests, next_request;

static void send_requests(conn_t *c, int n) {
    for (int i = 0; i < n; i++) {
        frame_t f = requests[next_request++ % n_requests];
        c->corr = (c->corr + 1) & 0x7FFFFFFF;
        uint8_t corr[4] = {(uint8_t)(c->corr >> 24), (uint8_t)(c->corr >> 16), (uint8_t)(c->corr >> 8), (uint8_t)c->corr};
        append(&c->out, f.frame, 8);
        append(&c->out, corr, 4);
        append(&c->out, f.frame + 12, f.len - 12);
    }
    c->inflight += n;
}

static int load(int port, const char *path, int nconns, int depth, double rate, double warm, double window) {
    buf_t file = read_file(path);
    for (size_t pos = 0; pos + 4 <= file.len;) {
        size_t len = 4 + be32(file.p + pos);
        if (pos + len > file.len || len < 12) {
            fprintf(stderr, "wireload: %s: truncated request frame\n", path);
            return 1;
        }
        requests = realloc(requests, (n_requests + 1) * sizeof *requests);
        requests[n_requests++] = (frame_t){file.p + pos, len};
        pos += len;
    }
    if (!n_requests) {
        fprintf(stderr, "wireload: %s holds no request frame\n", path);
        return 1;
    }
    int ep = epoll_create1(0);
    conn_t **conns = calloc((size_t)nconns, sizeof *conns);
    for (int i = 0; i < nconns; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = loopback(port);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        nonblocking(fd);
        conns[i] = calloc(1, sizeof **conns);
        conns[i]->fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = conns[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    printf("connected\n");
    fflush(stdout);
    double t_start = now(), t_warm = t_start + warm, t_end = t_warm + window, next_tick = t_start, last = t_start;
    double credit = 0;
    double t0 = 0;
    unsigned long long completed = 0, n0 = 0;
    int counting = 0, k = 0;
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        double t = now();
        if (!counting && t >= t_warm) {
            counting = 1;
            n0 = completed;
            t0 = t;
        }
        if (t >= t_end) break;
        /* Every TICK, offer what the rate allows, round robin, at most MAX_BURST at a time (saturating: refill
           every connection to DEPTH). Offering on every wake-up instead would send a frame per write as each
           response arrives, and the proxy would then see many more, smaller reads than the Python load gives it. */
        if (t >= next_tick) {
            next_tick = t + TICK;
            if (rate <= 0) {
                for (int i = 0; i < nconns; i++)
                    if (conns[i]->inflight < depth) send_requests(conns[i], depth - conns[i]->inflight);
            } else {
                credit += rate * (t - last); /* the time since the last offer, however late this wake-up is */
                int idle = 0;
                while (credit >= 1 && idle < nconns) {
                    conn_t *c = conns[k++ % nconns];
                    int room = depth - c->inflight;
                    if (room <= 0) {
                        idle++;
                        continue;
                    }
                    idle = 0;
                    int n = room < MAX_BURST ? room : MAX_BURST;
                    if (n > (int)credit) n = (int)credit;
                    send_requests(c, n);
                    credit -= n;
                }
                if (idle >= nconns && credit > (double)depth * nconns) credit = (double)depth * nconns; /* no backlog */
            }
            last = t;
            for (int i = 0; i < nconns; i++)
                if (conns[i]->out.len && flush_out(ep, conns[i]) < 0) {
                    fprintf(stderr, "wireload load: connection %d closed by the proxy\n", i);
                    return 1;
                }
        }
        int timeout = (int)((next_tick - now()) * 1000 + 0.999); /* ms, rounded up: never a busy loop */
        int n = epoll_wait(ep, evs, MAX_EVENTS, timeout > 0 ? timeout : 0);
        if (n < 0 && errno != EINTR) die("epoll_wait");
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if ((evs[i].events & EPOLLIN) && fill_in(c) < 0) {
                fprintf(stderr, "wireload load: a connection was closed by the proxy\n");
                return 1;
            }
            size_t pos = 0, len;
            while ((len = whole_frame(&c->in, pos)) > 0) {
                pos += len;
                c->inflight--;
                completed++;
            }
            consume(&c->in, pos);
            if ((evs[i].events & EPOLLOUT) && flush_out(ep, c) < 0) {
                fprintf(stderr, "wireload load: a connection was closed by the proxy\n");
                return 1;
            }
        }
    }
    printf("%llu %.6f\n", completed - n0, now() - t0);
    fflush(stdout);
    /* The connections stay open (idle) until the caller closes our stdin: it reads the proxy's state after
       its own window, which ends a moment after ours. */
    char byte;
    while (read(0, &byte, 1) > 0) {
    }
    for (int i = 0; i < nconns; i++) drop(ep, conns[i]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "broker")) return broker(atoi(argv[2]), argv[3]);
    if (argc == 9 && !strcmp(argv[1], "load"))
        return load(atoi(argv[2]), argv[3], atoi(argv[4]), atoi(argv[5]), atof(argv[6]), atof(argv[7]), atof(argv[8]));
    fprintf(stderr, "usage: wireload broker PORT RESPONSES\n"
                    "       wireload load PORT REQUESTS CONNS DEPTH RATE WARM WINDOW\n");
    return 2;
}
