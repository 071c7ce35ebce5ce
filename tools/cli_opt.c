/*
 * cli_opt.c - the option parser and --help printer over tools/cli_table.c (rules in tools/cli.h).
 *
 * Test: ./build/test_cli_errors (unknown options, glued short values, ranges and their
 * messages, --help layout of every command).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define HELP_COL 26   /* descriptions start here */
#define HELP_WIDTH 94 /* help lines are wrapped before this column */

static const char *const k_section_title[CLI_N_SECTIONS] = {
    NULL,
    "Sampling (HF transformers order: repetition penalty, temperature, top-k, top-p, min-p;\n"
    "unset ones come from the model's generation_config.json, as vLLM does, else the defaults\n"
    "below; -v says where each value came from):",
    "Context:",
    NULL,
    "Debug options (A/B measurements and debugging; README.md \"Debug options\"):",
};

int cli_find(const char *lng)
{
    for (size_t i = 0; i < cli_table_n; i++)
        if (!strcmp(cli_table[i].lng, lng))
            return (int)i;
    return -1;
}

bool cli_given(const struct cli_args *a, const char *lng)
{
    for (size_t i = 0; i < cli_table_n; i++)
        if (!strcmp(cli_table[i].lng, lng) && a->given[i])
            return true;
    return false;
}

int cli_usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", qs_log_prog());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\ntry '%s --help'\n", qs_log_prog());
    return QS_EXIT_USAGE;
}

// --- values --------------------------------------------------------------------------------

/* What a valid value of o is, for messages: o->must, or from the kind and range. */
static const char *must_text(const struct cli_opt *o, char *buf, size_t n)
{
    if (o->must)
        return o->must;
    if (o->kind == CLI_INT)
        snprintf(buf, n, "an integer in [%.0f, %.0f]", o->lo, o->hi);
    else if (o->kind == CLI_FLOAT)
        snprintf(buf, n, "a number in %s%g, %g%s", o->lo_open ? "(" : "[", o->lo, o->hi,
                 o->hi_open ? ")" : "]");
    else if (o->kind == CLI_CHOICE)
        snprintf(buf, n, "one of %s", o->choices);
    else if (o->kind == CLI_U64)
        snprintf(buf, n, "a non-negative integer");
    else
        snprintf(buf, n, "valid");
    return buf;
}

static bool parse_long(const char *s, long *out, const char **why)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || !*s) {
        *why = "not an integer";
        return false;
    }
    if (errno == ERANGE) {
        *why = "out of range";
        return false;
    }
    *out = v;
    return true;
}

static bool in_range(const struct cli_opt *o, double v)
{
    if (!(v >= o->lo && v <= o->hi))
        return false;
    return !(o->lo_open && v == o->lo) && !(o->hi_open && v == o->hi);
}

static bool choice_ok(const char *choices, const char *s)
{
    size_t n = strlen(s);
    for (const char *c = choices; *c;) {
        size_t l = strcspn(c, "|");
        if (l == n && !strncmp(c, s, n))
            return true;
        c += l + (c[l] == '|');
    }
    return false;
}

/* Store arg as o's value in a; false with *why when it is not valid. */
static bool set_value(const struct cli_opt *o, const char *arg, struct cli_args *a,
                      const char **why)
{
    void *field = (char *)a + o->off;
    char *end;
    switch (o->kind) {
    case CLI_FLAG:
        *(bool *)field = true;
        return true;
    case CLI_INT: {
        long v;
        if (!parse_long(arg, &v, why))
            return false;
        if (!in_range(o, (double)v)) {
            *why = "out of range";
            return false;
        }
        *(long *)field = v;
        return true;
    }
    case CLI_FLOAT: {
        errno = 0;
        double v = strtod(arg, &end);
        if (end == arg || *end || !*arg || isnan(v)) {
            *why = "not a number";
            return false;
        }
        if (errno == ERANGE || !isfinite(v) || !isfinite((float)v) || !in_range(o, v)) {
            *why = "out of range";
            return false;
        }
        *(float *)field = (float)v;
        return true;
    }
    case CLI_U64:
        errno = 0;
        unsigned long long u = strtoull(arg, &end, 0);
        if (end == arg || *end || !*arg || arg[0] == '-') {
            *why = "not a non-negative integer";
            return false;
        }
        if (errno == ERANGE) {
            *why = "out of range";
            return false;
        }
        *(uint64_t *)field = u;
        return true;
    case CLI_CHOICE:
        if (!choice_ok(o->choices, arg)) {
            *why = "unknown value";
            return false;
        }
        *(const char **)field = arg;
        return true;
    case CLI_STR:
        *(const char **)field = arg;
        return true;
    case CLI_CUSTOM:
        return o->parse(o, arg, a, why);
    }
    return false;
}

// --- lookup --------------------------------------------------------------------------------

/* Long option `name` (len bytes) of cmd: exact, else the one it is an unambiguous prefix of.
 * NULL when none; *ambiguous when several. */
static const struct cli_opt *find_long(unsigned cmd, const char *name, size_t len,
                                       bool *ambiguous)
{
    const struct cli_opt *pre = NULL;
    *ambiguous = false;
    for (size_t i = 0; i < cli_table_n; i++) {
        const struct cli_opt *o = &cli_table[i];
        if (!(o->cmds & cmd) || strncmp(o->lng, name, len) != 0)
            continue;
        if (strlen(o->lng) == len)
            return o;
        *ambiguous = pre != NULL;
        pre = o;
    }
    return *ambiguous ? NULL : pre;
}

static const struct cli_opt *find_short(unsigned cmd, char c)
{
    for (size_t i = 0; i < cli_table_n; i++)
        if (cli_table[i].shrt == c && (cli_table[i].cmds & cmd))
            return &cli_table[i];
    return NULL;
}

/* Our own table mistakes: two options of one command with one name. Aborts (a bug, not
 * input). */
static void check_table(unsigned cmd)
{
    if (cli_table_n > sizeof(((struct cli_args *)0)->given)) {
        fprintf(stderr, "qshard: option table larger than cli_args.given\n");
        abort();
    }
    for (size_t i = 0; i < cli_table_n; i++)
        for (size_t j = i + 1; j < cli_table_n; j++) {
            const struct cli_opt *x = &cli_table[i], *y = &cli_table[j];
            if ((x->cmds & y->cmds & cmd) &&
                (!strcmp(x->lng, y->lng) || (x->shrt && x->shrt == y->shrt))) {
                fprintf(stderr, "qshard: option table: --%s and --%s collide\n", x->lng, y->lng);
                abort();
            }
        }
}

// --- parsing -------------------------------------------------------------------------------

/* Apply a value; report a bad one ("qshard run: --temp must be ..., got '1e39' (out of range)")
 * with the option spelled as the user wrote it. */
static int apply(const struct cli_opt *o, const char *spelled, const char *arg,
                 struct cli_args *a)
{
    const char *why = "invalid";
    char buf[96];
    if (!set_value(o, arg, a, &why))
        return cli_usage_error("%s must be %s, got '%s' (%s)", spelled,
                               must_text(o, buf, sizeof(buf)), arg, why);
    a->given[o - cli_table] = true;
    return QS_EXIT_OK;
}

static int parse_long_opt(unsigned cmd, int argc, char **argv, int *i, struct cli_args *a,
                          const struct cli_opt **help)
{
    const char *arg = argv[*i], *name = arg + 2, *eq = strchr(name, '=');
    const size_t len = eq ? (size_t)(eq - name) : strlen(name);
    bool amb;
    const struct cli_opt *o = find_long(cmd, name, len, &amb);
    if (!o)
        return cli_usage_error("%s option '%.*s'", amb ? "ambiguous" : "unknown",
                               (int)(len + 2), arg);
    if (!strcmp(o->lng, "help")) {
        *help = o;
        return QS_EXIT_OK;
    }
    char spelled[96];
    snprintf(spelled, sizeof(spelled), "--%s", o->lng);
    if (o->kind == CLI_FLAG) {
        if (eq)
            return cli_usage_error("%s takes no value", spelled);
        return apply(o, spelled, NULL, a);
    }
    if (!eq && *i + 1 >= argc)
        return cli_usage_error("%s needs a value (%s)", spelled, o->metavar);
    return apply(o, spelled, eq ? eq + 1 : argv[++*i], a);
}

/* "-x", "-xVALUE", "-x VALUE", "-vq": a glued value that is not valid, or a letter that is no
 * option of cmd, makes the whole word an unknown option ("-ngl" is not "-n gl"). */
static int parse_short_opt(unsigned cmd, int argc, char **argv, int *i, struct cli_args *a,
                           const struct cli_opt **help)
{
    const char *word = argv[*i];
    for (const char *c = word + 1; *c; c++) {
        const struct cli_opt *o = find_short(cmd, *c);
        if (!o)
            return cli_usage_error("unknown option '%s'", word);
        if (!strcmp(o->lng, "help")) {
            *help = o;
            return QS_EXIT_OK;
        }
        char spelled[4] = {'-', *c, '\0', '\0'};
        if (o->kind == CLI_FLAG) {
            apply(o, spelled, NULL, a);
            continue;
        }
        if (c[1]) { /* glued value: valid, or the word is not an option at all */
            const char *why;
            struct cli_args probe = *a;
            if (!set_value(o, c + 1, &probe, &why))
                return cli_usage_error("unknown option '%s'", word);
            return apply(o, spelled, c + 1, a);
        }
        if (*i + 1 >= argc)
            return cli_usage_error("%s needs a value (%s)", spelled, o->metavar);
        return apply(o, spelled, argv[++*i], a);
    }
    return QS_EXIT_OK;
}

int cli_parse(unsigned cmd, const char *prog, const char *usage, const char *trailer, int argc,
              char **argv, struct cli_args *a)
{
    memset(a, 0, sizeof(*a));
    qs_log_set_prog(prog);
    check_table(cmd);
    for (size_t k = 0; k < cli_table_n; k++) { /* the table's defaults */
        const struct cli_opt *o = &cli_table[k];
        const char *why;
        if ((o->cmds & cmd) && o->def && !set_value(o, o->def, a, &why)) {
            fprintf(stderr, "qshard: option table: bad default of --%s\n", o->lng);
            abort();
        }
    }
    a->n_stops = 0; /* repeatable options start empty whatever the defaults did */
    bool done = false;
    const struct cli_opt *help = NULL;
    for (int i = 1; i < argc && !help; i++) {
        const char *arg = argv[i];
        int rc = QS_EXIT_OK;
        if (!done && !strcmp(arg, "--")) {
            done = true;
        } else if (done || arg[0] != '-' || arg[1] == '\0') {
            if (a->n_pos == CLI_MAX_POS)
                return cli_usage_error("more than %d arguments", CLI_MAX_POS);
            a->pos[a->n_pos++] = arg;
        } else if (arg[1] == '-') {
            rc = parse_long_opt(cmd, argc, argv, &i, a, &help);
        } else {
            rc = parse_short_opt(cmd, argc, argv, &i, a, &help);
        }
        if (rc)
            return rc;
    }
    if (help) {
        cli_help(stdout, cmd, usage, trailer);
        return CLI_HELP;
    }
    if (a->verbose)
        qs_log_set_level(QS_LOG_DEBUG);
    if (a->quiet)
        qs_log_set_level(QS_LOG_WARN);
    return QS_EXIT_OK;
}

// --- help ----------------------------------------------------------------------------------

/* Print text from column `col` (the cursor is there), wrapped before HELP_WIDTH, continuation
 * lines indented to HELP_COL. */
static void wrap(FILE *f, const char *text, int col)
{
    while (*text) {
        size_t word = strcspn(text, " ");
        if (col > HELP_COL && col + (int)word >= HELP_WIDTH) {
            fprintf(f, "\n%*s", HELP_COL, "");
            col = HELP_COL;
        } else if (col > HELP_COL) {
            fputc(' ', f);
            col++;
        }
        fwrite(text, 1, word, f);
        col += (int)word;
        text += word;
        while (*text == ' ')
            text++;
    }
    fputc('\n', f);
}

static void help_line(FILE *f, const struct cli_opt *o)
{
    char name[64], desc[1024];
    int n = o->shrt ? snprintf(name, sizeof(name), "  -%c, --%s", o->shrt, o->lng)
                    : snprintf(name, sizeof(name), "  --%s", o->lng);
    if (o->metavar)
        snprintf(name + n, sizeof(name) - (size_t)n, " %s", o->metavar);
    fputs(name, f);
    int col = (int)strlen(name);
    if (col + 2 > HELP_COL) {
        fprintf(f, "\n%*s", HELP_COL, "");
    } else {
        fprintf(f, "%*s", HELP_COL - col, "");
    }
    if (o->def && o->kind != CLI_FLAG)
        snprintf(desc, sizeof(desc), "%s (default %s)", o->help, o->def);
    else
        snprintf(desc, sizeof(desc), "%s", o->help);
    wrap(f, desc, HELP_COL);
}

void cli_help(FILE *f, unsigned cmd, const char *usage, const char *trailer)
{
    fputs(usage, f);
    for (int sec = 0; sec < CLI_N_SECTIONS; sec++) {
        bool any = false;
        for (size_t i = 0; i < cli_table_n; i++) {
            const struct cli_opt *o = &cli_table[i];
            if (!(o->cmds & cmd) || (int)o->sec != sec)
                continue;
            if (!any && k_section_title[sec])
                fprintf(f, "\n%s\n", k_section_title[sec]);
            any = true;
            help_line(f, o);
        }
    }
    if (trailer)
        fprintf(f, "\n%s", trailer);
}

struct rt_opts cli_model_opts(const struct cli_args *a)
{
    struct rt_opts o = rt_opts_default();
    if (a->device)
        o.device = !strcmp(a->device, "cuda") ? RT_DEVICE_CUDA : RT_DEVICE_CPU;
    if (a->threads > 0)
        o.n_threads = (int)a->threads;
    if (a->ctx > 0)
        o.n_ctx = (int)a->ctx;
    if (a->batch > 0)
        o.max_batch = (int)a->batch;
    o.no_graph = a->no_graph;
    o.no_pdl = a->no_pdl;
    o.no_defer = a->no_defer;
    o.no_rope_kv = a->no_rope_kv;
    o.no_wgmma = a->no_wgmma;
    o.host_sample = a->host_sample;
    if (a->no_p2p)
        o.p2p_allreduce = 0;
    if (a->block_size > 0)
        o.block_size = (int)a->block_size;
    if (a->kv_cache_gb > 0)
        o.kv_cache_bytes = (double)a->kv_cache_gb * 1e9;
    return o;
}
