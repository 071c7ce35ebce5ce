/*
 * fmt_names.c - see fmt_names.h. Test: tests/test_fmt.c (round trips of every role).
 */
#include "fmt_names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct role_info {
    const char *pattern;
    bool per_layer, per_expert, linear;
};

static const struct role_info roles[FMT_N_COUNT] = {
#define FMT_X_INFO(role, pattern, per_layer, per_expert, linear) \
    [role] = {pattern, per_layer, per_expert, linear},
    FMT_NAME_LIST(FMT_X_INFO)
#undef FMT_X_INFO
};

char *fmt_name(char *buf, size_t cap, enum fmt_name role, int layer, int expert,
               const char *suffix)
{
    if ((int)role < 0 || role >= FMT_N_COUNT || !buf || cap == 0)
        return NULL;
    const struct role_info *r = &roles[role];
    if ((r->per_layer && layer < 0) || (r->per_expert && expert < 0))
        return NULL;
    int n;
    if (r->per_expert)
        n = snprintf(buf, cap, r->pattern, layer, expert);
    else if (r->per_layer)
        n = snprintf(buf, cap, r->pattern, layer);
    else
        n = snprintf(buf, cap, "%s", r->pattern);
    if (n < 0 || (size_t)n >= cap)
        return NULL;
    if (suffix && *suffix) {
        size_t sl = strlen(suffix);
        if ((size_t)n + sl >= cap)
            return NULL;
        memcpy(buf + n, suffix, sl + 1);
    }
    return buf;
}

bool fmt_name_is_linear(enum fmt_name role)
{
    return (int)role >= 0 && role < FMT_N_COUNT && roles[role].linear;
}

/* Match `s` against pattern p, whose only conversions are "%d" (non-negative decimal, no
 * leading zeros except "0"). Returns the rest of s after the pattern, or NULL. */
static const char *match(const char *p, const char *s, int *vals, int *n_vals)
{
    *n_vals = 0;
    while (*p) {
        if (p[0] == '%' && p[1] == 'd') {
            if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
                return NULL;
            long v = 0;
            while (*s >= '0' && *s <= '9' && v <= 100000000)
                v = v * 10 + (*s++ - '0');
            if (v > 100000000)
                return NULL;
            vals[(*n_vals)++] = (int)v;
            p += 2;
        } else if (*p++ != *s++) {
            return NULL;
        }
    }
    return s;
}

bool fmt_name_parse(const char *name, enum fmt_name *role, int *layer, int *expert,
                    const char **suffix_out)
{
    static const char *const suffixes[] = {FMT_SUFFIX_QWEIGHT, FMT_SUFFIX_SCALES,
                                           FMT_SUFFIX_QZEROS, FMT_SUFFIX_WEIGHT, FMT_SUFFIX_BIAS};
    if (!name)
        return false;
    for (int i = 0; i < FMT_N_COUNT; i++) {
        int vals[2], nv;
        const char *rest = match(roles[i].pattern, name, vals, &nv);
        if (!rest)
            continue;
        bool ok = *rest == '\0';
        if (roles[i].linear)
            for (size_t k = 0; !ok && k < sizeof(suffixes) / sizeof(suffixes[0]); k++)
                ok = strcmp(rest, suffixes[k]) == 0;
        if (!ok)
            continue;
        if (role)
            *role = (enum fmt_name)i;
        if (layer)
            *layer = roles[i].per_layer ? vals[0] : -1;
        if (expert)
            *expert = roles[i].per_expert ? vals[1] : -1;
        if (suffix_out)
            *suffix_out = rest;
        return true;
    }
    return false;
}

const char *fmt_name_in_layer(const char *name)
{
    int vals[2], nv;
    return name ? match(FMT_NAME_LAYER, name, vals, &nv) : NULL;
}
