/*
 * srv_http.c - the HTTP side of `qshard serve` (tools/serve/serve.h): libmicrohttpd with one
 * thread per connection (a waiting request blocks only its own thread), routing, the API key,
 * body limits, whole and streamed (SSE) responses, client-disconnect detection, the request
 * log, and srv_run: bind, load, serve, drain on SIGINT / SIGTERM.
 *
 * A vanished client: a connection thread waiting for its request polls its socket every
 * SRV_POLL_MS for POLLRDHUP / POLLHUP (the peer closed); the request is then cancelled at
 * once, which frees its KV blocks at the engine's next step.
 */
/* POLLRDHUP needs _GNU_SOURCE (the Makefile defines it) */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "cli.h" /* cli_exit_rt */
#include "qs_log.h"
#include "qs_util.h"
#include "srv_int.h"

enum route {
    R_NONE = 0, R_HEALTH, R_MODELS, R_METRICS, R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE,
};

static const struct {
    const char *path;
    enum route route;
    bool post, auth;
} routes[] = {
    {"/health", R_HEALTH, false, false},
    {"/v1/models", R_MODELS, false, true},
    {"/metrics", R_METRICS, false, false},
    {"/v1/completions", R_COMPLETIONS, true, true},
    {"/v1/chat/completions", R_CHAT, true, true},
    {"/tokenize", R_TOKENIZE, true, true},
    {"/detokenize", R_DETOKENIZE, true, true},
};

/* Per-connection request state (MHD's con_cls). */
struct conn {
    int ri;                 /* index into routes, -1: unknown path */
    char *body;
    size_t n, cap;
    bool too_big;
    bool open;              /* a completion's reply is queued: on_completed drops n_open */
    double t0;
};

/* A streamed response. */
struct stream {
    struct srv *v;
    struct srv_req *r;
    struct MHD_Connection *c;
    int fd;
    char *buf;
    size_t len, cap, off;
    bool end, gone;
    char path[32];
};

static void log_request(const struct srv_req *r, const char *method, const char *path,
                        int status, double t0, const char *note)
{
    size_t np = 0, nc = 0;
    double ttft = -1;
    const char *finish = "-";
    if (r) {
        for (int k = 0; k < r->n_prompts; k++)
            np += r->n_prompt_ids[k];
        for (int i = 0; i < r->n_choices; i++) {
            nc += r->ch[i].n_completion;
            if (r->ch[i].t_first > 0 && (ttft < 0 || r->ch[i].t_first - r->t_start < ttft))
                ttft = r->ch[i].t_first - r->t_start;
        }
        if (r->n_choices && r->ch[0].done)
            finish = r->ch[0].finish == RT_GEN_FINISH_CANCELLED ? "abort"
                                                                : rt_gen_finish_reason(r->ch[0].finish);
    }
    fprintf(stderr, "qshard serve: %s %s %.100s %d prompt=%zu completion=%zu ttft=%.1fms "
            "total=%.1fms finish=%s%s%s\n", r ? r->id : "-", method, path, status, np, nc,
            ttft < 0 ? 0.0 : ttft * 1e3, (qs_now_s() - t0) * 1e3, finish, note ? " " : "",
            note ? note : "");
}

/* Whether the peer closed its end (a vanished client). */
static bool peer_gone(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Restart the connection's idle clock: time spent waiting for the engine is not idleness.
 * (libmicrohttpd 0.9.75 resets the clock only when the timeout changes from 0.) */
static void touch(struct MHD_Connection *c, int timeout_s)
{
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)timeout_s);
}

static void wait_a_bit(struct srv_req *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += SRV_POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

// --- responses ---------------------------------------------------------------------------------

/* The Allow header of a 405 being sent by this connection thread (first_call sets it). */
static _Thread_local const char *t_allow;

/* Queue body (malloc'd, taken) with status and a content type. */
static enum MHD_Result reply(struct srv *v, struct MHD_Connection *c, int status, char *body,
                             const char *type)
{
    if (!body) {
        status = 500;
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                      "\"param\":null,\"code\":null}}");
        type = "application/json";
    }
    struct MHD_Response *res = MHD_create_response_from_buffer(
        body ? strlen(body) : 0, body, MHD_RESPMEM_MUST_FREE);
    if (!res) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 405 && t_allow) /* the method the route takes */
        MHD_add_response_header(res, MHD_HTTP_HEADER_ALLOW, t_allow);
    if (status == 401)
        MHD_add_response_header(res, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    srv_count_status(v, status);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, res);
    MHD_destroy_response(res);
    return ok;
}

static enum MHD_Result reply_error(struct srv *v, struct MHD_Connection *c,
                                   const struct srv_error *e)
{
    return reply(v, c, e->status, srv_error_json(e), "application/json");
}

static enum MHD_Result reply_err(struct srv *v, struct MHD_Connection *c, int status,
                                 const char *type, const char *code, const char *msg)
{
    struct srv_error e = {0};
    srv_error_set(&e, status, type, NULL, code, "%s", msg);
    return reply_error(v, c, &e);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    struct stream *st = cls;
    struct srv_req *r = st->r;
    for (;;) {
        if (st->off < st->len) {
            const size_t n = st->len - st->off < max ? st->len - st->off : max;
            memcpy(out, st->buf + st->off, n);
            st->off += n;
            if (st->off == st->len)
                st->off = st->len = 0;
            return (ssize_t)n;
        }
        if (st->end)
            return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&r->mu);
        for (;;) {
            if (!srv_req_stream(r, &st->buf, &st->len, &st->cap))
                st->end = true;
            if (st->len > 0 || st->end)
                break;
            wait_a_bit(r);
            if (peer_gone(st->fd)) {
                st->gone = true;
                break;
            }
        }
        pthread_mutex_unlock(&r->mu);
        if (st->gone)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        touch(st->c, st->v->o.timeout_s); /* the timeout counts from here */
    }
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    struct srv *v = st->v;
    if (!st->end || st->gone)
        srv_cancel(v, st->r);
    pthread_mutex_lock(&st->r->mu);
    log_request(st->r, "POST", st->path, 200, st->r->t_start, st->end && !st->gone ? NULL
                                                                           : "(client gone)");
    pthread_mutex_unlock(&st->r->mu);
    srv_req_unref(st->r);
    free(st->buf);
    free(st);
    atomic_fetch_sub(&v->n_open, 1);
}

/* A completion or chat request: parse, queue, then answer whole or as a stream. */
static enum MHD_Result completion(struct srv *v, struct MHD_Connection *c, struct conn *k,
                                  enum srv_kind kind)
{
    const char *path = routes[k->ri].path;
    struct srv_error err = {0};
    struct srv_req *r = srv_req_parse(v, kind, k->body ? k->body : "", k->n, &err);
    if (!r) {
        log_request(NULL, "POST", path, err.status, k->t0, err.message);
        return reply_error(v, c, &err);
    }
    if (r->n_choices > v->o.max_queue) { /* would never fit: not worth a retry (429) */
        srv_error_set(&err, 400, "invalid_request_error", "n", NULL,
                      "the request asks for %d sequences (prompts x n), more than the server's "
                      "queue holds (--max-queue %d)", r->n_choices, v->o.max_queue);
        log_request(r, "POST", path, 400, k->t0, err.message);
        srv_req_unref(r);
        return reply_error(v, c, &err);
    }
    const int st = srv_submit(v, r);
    if (st) {
        srv_error_set(&err, st, st == 429 ? "rate_limit_error" : "service_unavailable", NULL,
                      st == 429 ? "rate_limit_exceeded" : NULL,
                      st == 429 ? "the server's queue is full (%d waiting at most: "
                                  "--max-queue); retry later"
                                : "the server is shutting down%.0d", v->o.max_queue);
        log_request(r, "POST", path, st, k->t0, NULL);
        srv_req_unref(r);
        return reply_error(v, c, &err);
    }
    atomic_fetch_add(&v->n_open, 1);
    const int fd = conn_fd(c);
    if (r->stream) {
        struct stream *s = calloc(1, sizeof(*s));
        struct MHD_Response *res =
            s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s,
                                                  stream_free)
              : NULL;
        if (!res) {
            free(s);
            srv_cancel(v, r);
            srv_req_unref(r);
            atomic_fetch_sub(&v->n_open, 1);
            return MHD_NO;
        }
        *s = (struct stream){.v = v, .r = r, .c = c, .fd = fd};
        snprintf(s->path, sizeof s->path, "%s", path);
        MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(res, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        srv_count_status(v, 200);
        enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, res);
        MHD_destroy_response(res); /* stream_free runs when MHD is done with it */
        return ok;
    }
    pthread_mutex_lock(&r->mu);
    bool gone = false;
    while (r->n_done < r->n_choices && !gone) {
        wait_a_bit(r);
        gone = r->n_done < r->n_choices && peer_gone(fd);
    }
    pthread_mutex_unlock(&r->mu);
    /* every choice done: the engine writes no more to r, so the body is built without its
     * lock (the engine thread would wait on it) */
    int status = 0;
    char *body = gone ? NULL : srv_req_response(r, &status);
    if (gone)
        pthread_mutex_lock(&r->mu); /* choices still run: their fields move */
    log_request(r, "POST", path, gone ? 499 : status, k->t0, gone ? "(client gone)" : NULL);
    if (gone)
        pthread_mutex_unlock(&r->mu);
    if (gone) {
        srv_cancel(v, r);
        srv_req_unref(r);
        atomic_fetch_sub(&v->n_open, 1);
        return MHD_NO; /* close the connection */
    }
    srv_req_unref(r);
    touch(c, v->o.timeout_s); /* the time spent generating was not idle */
    k->open = true; /* n_open drops when MHD has sent the reply (on_completed) */
    return reply(v, c, status, body, "application/json");
}

// --- the access handler ----------------------------------------------------------------------

static bool authorized(const struct srv *v, struct MHD_Connection *c)
{
    if (!v->o.api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7))
        return false;
    h += 7;
    const size_t a = strlen(h), b = strlen(v->o.api_key);
    unsigned char d = a != b;
    for (size_t i = 0; i < a && i < b; i++) /* no early exit: timing says nothing of the key */
        d |= (unsigned char)(h[i] ^ v->o.api_key[i]);
    return d == 0;
}

/* The first call for a request (headers only): route, key, size. A non-zero status answers
 * it at once. */
static int first_call(struct srv *v, struct MHD_Connection *c, struct conn *k, const char *url,
                      const char *method, struct srv_error *e)
{
    k->ri = -1;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (!strcmp(url, routes[i].path))
            k->ri = (int)i;
    if (k->ri < 0)
        return srv_error_set(e, 404, "invalid_request_error", NULL, "not_found",
                             "no such endpoint: %.200s", url);
    const bool post = !strcmp(method, "POST");
    const bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    t_allow = routes[k->ri].post ? "POST" : "GET, HEAD";
    if (routes[k->ri].post ? !post : !get)
        return srv_error_set(e, 405, "invalid_request_error", NULL, "method_not_allowed",
                             "%s needs %s, not %.20s", url, routes[k->ri].post ? "POST" : "GET",
                             method);
    if (routes[k->ri].auth && !authorized(v, c))
        return srv_error_set(e, 401, "invalid_request_error", NULL, "invalid_api_key",
                             "missing or incorrect API key (send \"Authorization: Bearer "
                             "KEY\")");
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > v->o.max_body)
        return srv_error_set(e, 413, "invalid_request_error", NULL, "request_too_large",
                             "the body is larger than the limit of %zu bytes (--max-body-mb)",
                             v->o.max_body);
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    struct srv *v = cls;
    struct conn *k = *con_cls;
    if (!k) {
        qs_log_set_thread_quiet(true); /* library messages go into the responses */
        k = calloc(1, sizeof(*k));
        if (!k)
            return MHD_NO;
        *con_cls = k;
        k->t0 = qs_now_s();
        struct srv_error e = {0};
        if (first_call(v, c, k, url, method, &e)) {
            log_request(NULL, method, url, e.status, k->t0, e.message);
            return reply_error(v, c, &e);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_big && k->n + *upload_size > v->o.max_body)
            k->too_big = true;
        if (!k->too_big) {
            if (k->n + *upload_size + 1 > k->cap) {
                size_t cap = k->cap ? k->cap : 4096;
                while (cap < k->n + *upload_size + 1)
                    cap *= 2;
                char *p = realloc(k->body, cap);
                if (!p)
                    return MHD_NO;
                k->body = p;
                k->cap = cap;
            }
            memcpy(k->body + k->n, upload, *upload_size);
            k->n += *upload_size;
            k->body[k->n] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->too_big)
        return reply_err(v, c, 413, "invalid_request_error", "request_too_large",
                         "the body is larger than the limit (--max-body-mb)");
    const enum route rt = routes[k->ri].route;
    if (rt == R_HEALTH)
        return atomic_load(&v->ready) && !atomic_load(&v->draining)
                   ? reply(v, c, 200, strdup("{\"status\":\"ok\"}"), "application/json")
                   : reply(v, c, 503, strdup(atomic_load(&v->draining)
                                                 ? "{\"status\":\"shutting down\"}"
                                                 : "{\"status\":\"loading\"}"),
                           "application/json");
    if (rt == R_METRICS)
        return reply(v, c, 200, srv_metrics_text(v), "text/plain; version=0.0.4");
    if (!atomic_load(&v->ready))
        return reply_err(v, c, 503, "service_unavailable", NULL,
                         "the model is still loading; retry when /health answers 200");
    if (rt == R_MODELS) {
        log_request(NULL, method, url, 200, k->t0, NULL);
        return reply(v, c, 200, srv_models_json(v), "application/json");
    }
    if (rt == R_TOKENIZE || rt == R_DETOKENIZE) {
        struct srv_error e = {0};
        char *s = srv_tokenize_json(v, k->body ? k->body : "", k->n, rt == R_DETOKENIZE, &e);
        log_request(NULL, method, url, e.status ? e.status : 200, k->t0,
                    e.status ? e.message : NULL);
        return e.status ? reply_error(v, c, &e) : reply(v, c, 200, s, "application/json");
    }
    return completion(v, c, k, rt == R_CHAT ? SRV_CHAT : SRV_COMPLETION);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)c, (void)toe;
    struct srv *v = cls;
    struct conn *k = *con_cls;
    if (k) {
        if (k->open)
            atomic_fetch_sub(&v->n_open, 1);
        free(k->body);
        free(k);
    }
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code)
{
    (void)cls, (void)socket_ctx;
    if (code != MHD_CONNECTION_NOTIFY_STARTED)
        return;
    const int fd = conn_fd(c), one = 1;
    if (fd >= 0) /* SSE events are small: no Nagle delay */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    const struct srv *v = cls;
    if (atomic_load(&v->ready) && qs_log_get_level() < QS_LOG_DEBUG)
        return; /* client mistakes (bad request lines, resets) are answered, not logged */
    fprintf(stderr, "qshard serve: libmicrohttpd: ");
    vfprintf(stderr, fmt, ap);
}

// --- srv_run --------------------------------------------------------------------------------------

static const double ttft_le[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double tpot_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5};
static const double e2e_le[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0};
#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Start the daemon on o->host:o->port; *port = the port bound. */
static struct MHD_Daemon *start_daemon(struct srv *v, unsigned *port)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (inet_pton(AF_INET, v->o.host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)v->o.port);
    } else if (inet_pton(AF_INET6, v->o.host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)v->o.port);
        flags |= MHD_USE_IPv6;
    } else { /* a name: its first address (localhost -> 127.0.0.1, as vLLM binds it) */
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
        if (getaddrinfo(v->o.host, NULL, &hints, &ai) != 0 || !ai ||
            ai->ai_addrlen > sizeof ss) {
            qs_log_error("serve", "--host '%s' is neither an IP address nor a name this "
                         "machine resolves", v->o.host);
            if (ai)
                freeaddrinfo(ai);
            return NULL;
        }
        memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
        if (ai->ai_family == AF_INET6) {
            a6->sin6_port = htons((uint16_t)v->o.port);
            flags |= MHD_USE_IPv6;
        } else {
            a4->sin_port = htons((uint16_t)v->o.port);
        }
        freeaddrinfo(ai);
    }
    struct rlimit rl;
    unsigned limit = 4096;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max; /* every idle connection holds a descriptor */
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < limit + 64)
            limit = rl.rlim_cur > 128 ? (unsigned)rl.rlim_cur - 64 : 64;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)v->o.port, NULL, NULL, on_request, v,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, v,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)v->o.timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, limit,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, v,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, v,
        MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20),
        MHD_OPTION_END);
    if (!d) {
        qs_log_error("serve", "cannot listen on %s port %d (in use, or not an address of this "
                     "machine; --port 0 takes any free port)", v->o.host, v->o.port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = di ? di->port : (unsigned)v->o.port;
    return d;
}

/* Wait up to ms for SIGINT / SIGTERM; the signal, or 0. */
static int wait_signal(const sigset_t *set, long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    const int s = ms < 0 ? sigwaitinfo(set, NULL) : sigtimedwait(set, NULL, &ts);
    return s > 0 ? s : 0;
}

/* Open the model and start the engine; 0 or an exit code. */
static int load(struct srv *v)
{
    struct rt_session *s = NULL;
    enum rt_err e = rt_session_open(&v->o.session, &s);
    if (!e) {
        const struct rt_engine_opts eo = {.max_batch_tokens = v->o.max_batch_tokens};
        e = rt_engine_create(s, &eo, &v->eng);
    }
    if (!e) {
        v->s = s;
        v->n_ctx = rt_session_n_ctx(s);
        struct rt_engine_stats st;
        rt_engine_stats(v->eng, &st);
        pthread_mutex_lock(&v->mu); /* /metrics reads it while the model loads */
        v->st = st;
        pthread_mutex_unlock(&v->mu);
        e = srv_engine_start(v);
    }
    if (e) {
        rt_engine_free(v->eng);
        v->eng = NULL;
        v->s = NULL;
        rt_session_close(s);
        return cli_exit_rt(e);
    }
    v->t_loaded = (double)time(NULL);
    return 0;
}

/* SIGINT / SIGTERM: refuse new requests, let the running ones finish for the bound, cancel
 * the rest, stop. A second signal cancels at once. */
static void drain(struct srv *v, struct MHD_Daemon *d, const sigset_t *set, int sig)
{
    fprintf(stderr, "qshard serve: %s: shutting down (%d requests running get up to %d s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", atomic_load(&v->n_open),
            v->o.shutdown_timeout_s);
    atomic_store(&v->draining, true);
    const MHD_socket lfd = MHD_quiesce_daemon(d);
    if (lfd != MHD_INVALID_SOCKET) /* new connections are refused at once, not left waiting */
        close(lfd);
    const double t_end = qs_now_s() + v->o.shutdown_timeout_s;
    while (atomic_load(&v->n_open) > 0 && qs_now_s() < t_end)
        if (wait_signal(set, 50))
            break;
    srv_engine_stop(v); /* cancels what still runs; their responses end with "abort" */
    const double t_conn = qs_now_s() + 5.0;
    while (atomic_load(&v->n_open) > 0 && qs_now_s() < t_conn)
        wait_signal(set, 20);
    MHD_stop_daemon(d);
}

int srv_run(const struct srv_opts *o)
{
    struct srv v;
    memset(&v, 0, sizeof v);
    v.o = *o;
    v.model_name = o->model_name;
    pthread_mutex_init(&v.mu, NULL);
    pthread_cond_init(&v.cv, NULL);
    sem_init(&v.big_parse, 0, SRV_BIG_PARSES);
    v.ttft = (struct srv_hist){.n = N_OF(ttft_le), .le = ttft_le};
    v.tpot = (struct srv_hist){.n = N_OF(tpot_le), .le = tpot_le};
    v.e2e = (struct srv_hist){.n = N_OF(e2e_le), .le = e2e_le};
    v.rng = o->seed ? o->seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^
                                    (uint64_t)(qs_now_s() * 1e9);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* every thread started below inherits it */
    signal(SIGPIPE, SIG_IGN);
    unsigned port = 0;
    struct MHD_Daemon *d = start_daemon(&v, &port);
    if (!d)
        return QS_EXIT_USAGE;
    const bool v6 = strchr(o->host, ':') != NULL;
    fprintf(stderr, "qshard serve: listening on http://%s%s%s:%u\n", v6 ? "[" : "", o->host,
            v6 ? "]" : "", port);
    int rc = 0, sig = o->load_delay_ms > 0 ? wait_signal(&set, o->load_delay_ms) : 0;
    if (!sig)
        rc = load(&v);
    if (!sig && !rc) {
        atomic_store(&v.ready, true);
        if (o->api_key)
            qs_log_info("an API key is required on /v1/* (--api-key or QSHARD_API_KEY)");
        if (o->chat_family == RT_CHAT_NONE &&
            (!rt_session_tok(v.s) || rt_chat_detect(rt_session_tok(v.s)) == RT_CHAT_NONE))
            qs_log_warn("no chat template recognised in the model's tokenizer_config.json: "
                        "/v1/chat/completions answers 400 unless the server is started with "
                        "--chat-template");
        fprintf(stderr, "qshard serve: ready\n");
        qs_log_info("serving %s as '%s': context %d tokens, up to %d KV blocks of %d tokens",
                    o->session.path, v.model_name, v.n_ctx, v.st.blocks_total,
                    rt_exec_block_size(rt_session_model(v.s)));
        sig = wait_signal(&set, -1);
    }
    if (rc) {
        MHD_stop_daemon(d);
    } else {
        drain(&v, d, &set, sig);
        fprintf(stderr, "qshard serve: stopped\n");
    }
    rt_engine_free(v.eng);
    rt_session_close(v.s);
    pthread_mutex_destroy(&v.mu);
    pthread_cond_destroy(&v.cv);
    sem_destroy(&v.big_parse);
    return rc;
}
