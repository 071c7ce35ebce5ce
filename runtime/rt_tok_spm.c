/*
 * rt_tok_spm.c - tokenizer.model: a minimal reader for SentencePiece's ModelProto (binary
 * protobuf), treating the file as hostile, and the conversion of its BPE model into the shared
 * struct rt_tok (merges derived from the piece scores).
 *
 * Fields read (google/sentencepiece src/sentencepiece_model.proto):
 *   ModelProto        1 pieces (repeated SentencePiece)  2 trainer_spec  3 normalizer_spec
 *   SentencePiece     1 piece (string)  2 score (float)  3 type (NORMAL=1 UNKNOWN=2 CONTROL=3
 *                     USER_DEFINED=4 UNUSED=5 BYTE=6; default NORMAL)
 *   TrainerSpec       3 model_type (UNIGRAM=1 BPE=2 WORD=3 CHAR=4; default UNIGRAM)
 *                     24 treat_whitespace_as_suffix  35 byte_fallback
 *                     40 unk_id (default 0)  41 bos_id (1)  42 eos_id (2)
 *   NormalizerSpec    1 name  2 precompiled_charsmap  3 add_dummy_prefix (default true)
 *                     4 remove_extra_whitespaces (true)  5 escape_whitespaces (true)
 * Everything else is skipped by wire type. Wire format: protobuf encoding guide (varints,
 * wire types 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32; groups 3/4 are rejected).
 *
 * BPE behaviour (sentencepiece bpe_model.cc): pieces of type NORMAL, USER_DEFINED and UNUSED can
 * be produced by merging; two adjacent symbols merge when their concatenation is such a piece,
 * highest score first, leftmost on ties; characters outside the vocabulary become <0xXX> byte
 * pieces when byte_fallback is on, else unk (consecutive unknowns fused).
 * Test: ./build/test_tok (the tokenizer.model and tokenizer.json paths must agree).
 */
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"     /* qs_log_error */
#include "rt_tok_int.h" /* struct rt_tok, maps */

enum {
    SPM_NORMAL = 1,
    SPM_UNKNOWN = 2,
    SPM_CONTROL = 3,
    SPM_USER_DEFINED = 4,
    SPM_UNUSED = 5,
    SPM_BYTE = 6,
};
enum { SPM_MODEL_BPE = 2 };

/* A bounded cursor over protobuf bytes. */
struct pb {
    const unsigned char *p, *end;
};

static bool pb_varint(struct pb *b, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end)
            return false;
        unsigned char c = *b->p++;
        x |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false; /* more than 10 bytes */
}

/* One field: its number, wire type, and value (varint/fixed in *v, bytes in *sub). */
static bool pb_field(struct pb *b, uint32_t *field, int *wire, uint64_t *v, struct pb *sub)
{
    uint64_t key;
    if (!pb_varint(b, &key) || (key >> 3) == 0 || (key >> 3) > 0x1FFFFFFF)
        return false;
    *field = (uint32_t)(key >> 3);
    *wire = (int)(key & 7);
    switch (*wire) {
    case 0:
        return pb_varint(b, v);
    case 1:
        if (b->end - b->p < 8)
            return false;
        memcpy(v, b->p, 8); /* little-endian host assumed (x86-64, aarch64) */
        b->p += 8;
        return true;
    case 5: {
        uint32_t x;
        if (b->end - b->p < 4)
            return false;
        memcpy(&x, b->p, 4);
        b->p += 4;
        *v = x;
        return true;
    }
    case 2: {
        uint64_t n;
        if (!pb_varint(b, &n) || n > (uint64_t)(b->end - b->p))
            return false;
        sub->p = b->p;
        sub->end = b->p + n;
        b->p += n;
        return true;
    }
    default:
        return false;
    }
}

struct spm_piece {
    const char *s;
    uint32_t len;
    float score;
    int type;
};

struct spm_model {
    struct spm_piece *pieces;
    size_t n, cap;
    int64_t model_type, unk_id, bos_id, eos_id;
    bool byte_fallback, ws_suffix;
    bool add_dummy_prefix, remove_extra_ws, escape_ws;
    bool have_normalizer_name;
    char name[32];
    size_t charsmap_len;
};

static enum rt_tok_err bad(const char *what, size_t offset)
{
    qs_log_error("rt_tok_spm_load", "tokenizer.model: %s (near byte %zu): truncated or not a SentencePiece model", what, offset);
    return RT_TOK_ERR_MODEL;
}

static enum rt_tok_err parse_piece(struct spm_model *m, struct pb b, size_t off)
{
    struct spm_piece pc = {.s = NULL, .len = 0, .score = 0.0f, .type = SPM_NORMAL};
    bool have_piece = false;
    while (b.p < b.end) {
        uint32_t f;
        int w;
        uint64_t v = 0;
        struct pb sub = {0};
        if (!pb_field(&b, &f, &w, &v, &sub))
            return bad("bad field in a piece", off);
        if (f == 1 && w == 2) {
            pc.s = (const char *)sub.p;
            pc.len = (uint32_t)(sub.end - sub.p);
            have_piece = true;
        } else if (f == 2 && w == 5) {
            uint32_t x = (uint32_t)v;
            memcpy(&pc.score, &x, 4);
        } else if (f == 3 && w == 0) {
            if (v < 1 || v > 6)
                return bad("piece type out of range", off);
            pc.type = (int)v;
        }
    }
    if (!have_piece || pc.len == 0 || pc.score != pc.score)
        return bad("piece without text or with a NaN score", off);
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 1024;
        struct spm_piece *np = realloc(m->pieces, cap * sizeof(*np));
        if (!np) {
            qs_log_error("rt_tok_spm_load", "out of memory");
            return RT_TOK_ERR_NOMEM;
        }
        m->pieces = np, m->cap = cap;
    }
    m->pieces[m->n++] = pc;
    return RT_TOK_ERR_NONE;
}

static enum rt_tok_err parse_trainer(struct spm_model *m, struct pb b, size_t off)
{
    while (b.p < b.end) {
        uint32_t f;
        int w;
        uint64_t v = 0;
        struct pb sub;
        if (!pb_field(&b, &f, &w, &v, &sub))
            return bad("bad field in trainer_spec", off);
        if (w != 0)
            continue;
        switch (f) {
        case 3: m->model_type = (int64_t)v; break;
        case 24: m->ws_suffix = v != 0; break;
        case 35: m->byte_fallback = v != 0; break;
        case 40: m->unk_id = (int32_t)(uint32_t)v; break; /* int32: negatives are 10-byte varints */
        case 41: m->bos_id = (int32_t)(uint32_t)v; break;
        case 42: m->eos_id = (int32_t)(uint32_t)v; break;
        default: break;
        }
    }
    return RT_TOK_ERR_NONE;
}

static enum rt_tok_err parse_normalizer(struct spm_model *m, struct pb b, size_t off)
{
    while (b.p < b.end) {
        uint32_t f;
        int w;
        uint64_t v = 0;
        struct pb sub = {0};
        if (!pb_field(&b, &f, &w, &v, &sub))
            return bad("bad field in normalizer_spec", off);
        if (f == 1 && w == 2) {
            size_t n = (size_t)(sub.end - sub.p);
            if (n >= sizeof(m->name))
                n = sizeof(m->name) - 1;
            memcpy(m->name, sub.p, n);
            m->name[n] = '\0';
            m->have_normalizer_name = true;
        } else if (f == 2 && w == 2) {
            m->charsmap_len = (size_t)(sub.end - sub.p);
        } else if (w == 0 && f == 3) {
            m->add_dummy_prefix = v != 0;
        } else if (w == 0 && f == 4) {
            m->remove_extra_ws = v != 0;
        } else if (w == 0 && f == 5) {
            m->escape_ws = v != 0;
        }
    }
    return RT_TOK_ERR_NONE;
}

static enum rt_tok_err parse_model(struct spm_model *m, const unsigned char *buf, size_t len)
{
    struct pb b = {buf, buf + len};
    bool have_trainer = false;
    while (b.p < b.end) {
        size_t off = (size_t)(b.p - buf);
        uint32_t f;
        int w;
        uint64_t v = 0;
        struct pb sub = {0};
        if (!pb_field(&b, &f, &w, &v, &sub))
            return bad("bad top-level field", off);
        enum rt_tok_err err = RT_TOK_ERR_NONE;
        if (f == 1 && w == 2)
            err = parse_piece(m, sub, off);
        else if (f == 2 && w == 2)
            err = parse_trainer(m, sub, off), have_trainer = true;
        else if (f == 3 && w == 2)
            err = parse_normalizer(m, sub, off);
        if (err)
            return err;
    }
    if (m->n == 0 || !have_trainer)
        return bad("no pieces or no trainer_spec", len);
    return RT_TOK_ERR_NONE;
}

static int32_t spm_id(int64_t id, size_t n)
{
    return id >= 0 && (uint64_t)id < n ? (int32_t)id : -1;
}

/* Sort ids by score, highest first (ties by id for a deterministic rank). */
static int score_cmp(const void *a, const void *b, void *ctx)
{
    const struct spm_model *m = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float sx = m->pieces[x].score, sy = m->pieces[y].score;
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return x < y ? -1 : x > y;
}

static bool is_mergeable(int type)
{
    return type == SPM_NORMAL || type == SPM_USER_DEFINED || type == SPM_UNUSED;
}

/* Merges: every split of every mergeable piece into two mergeable pieces, ranked by the
 * piece's score (dense rank: equal scores share a rank, so the leftmost pair wins). */
static enum rt_tok_err build_merges(struct rt_tok *tok, const struct spm_model *m)
{
    size_t n = m->n, n_pairs = 0;
    int32_t *order = malloc(n * sizeof(int32_t)), *rank = malloc(n * sizeof(int32_t));
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    if (!order || !rank) {
        qs_log_error("rt_tok_spm_load", "out of memory");
        err = RT_TOK_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        order[i] = (int32_t)i;
        n_pairs += m->pieces[i].len - 1;
    }
    qsort_r(order, n, sizeof(int32_t), score_cmp, (void *)m);
    int32_t r = -1;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || m->pieces[order[i]].score != m->pieces[order[i - 1]].score)
            r++;
        rank[order[i]] = r;
    }
    if ((err = rt_tok_pairmap_init(&tok->merges, n_pairs)))
        goto out;
    for (size_t i = 0; i < n; i++) {
        const struct spm_piece *p = &m->pieces[i];
        if (!is_mergeable(p->type))
            continue;
        for (uint32_t k = 1; k < p->len; k++) {
            if (((unsigned char)p->s[k] & 0xC0) == 0x80)
                continue; /* split only at character boundaries */
            int32_t l = rt_tok_strmap_get(tok, p->s, k);
            int32_t rr = rt_tok_strmap_get(tok, p->s + k, p->len - k);
            if (l < 0 || rr < 0)
                continue;
            rt_tok_pairmap_put(&tok->merges, l, rr, rank[i], (int32_t)i);
            if (tok->ent[i].split_l < 0)
                tok->ent[i].split_l = l, tok->ent[i].split_r = rr;
        }
    }
out:
    free(order);
    free(rank);
    return err;
}

static int hex2(const char *s)
{
    int v = 0;
    for (int i = 0; i < 2; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    return v;
}

enum rt_tok_err rt_tok_spm_load(const unsigned char *buf, size_t len, struct rt_tok **out)
{
    struct spm_model m = {.model_type = 1, .unk_id = 0, .bos_id = 1, .eos_id = 2,
                          .add_dummy_prefix = true, .remove_extra_ws = true, .escape_ws = true};
    struct rt_tok *tok = NULL;
    *out = NULL;
    enum rt_tok_err err = parse_model(&m, buf, len);
    if (err)
        goto fail;
    if (m.model_type != SPM_MODEL_BPE || m.ws_suffix) {
        qs_log_error(__func__, "tokenizer.model: model_type %lld%s is not supported (only BPE with whitespace as prefix)",
                     (long long)m.model_type, m.ws_suffix ? " with treat_whitespace_as_suffix" : "");
        err = RT_TOK_ERR_UNSUPPORTED;
        goto fail;
    }
    if (m.charsmap_len > 0 || (m.have_normalizer_name && strcmp(m.name, "identity") != 0)) {
        qs_log_error(__func__, "tokenizer.model: normalizer \"%s\" (precompiled charsmap of %zu bytes) is not supported, only identity",
                     m.name, m.charsmap_len);
        err = RT_TOK_ERR_UNSUPPORTED;
        goto fail;
    }
    if (m.n > RT_TOK_MAX_VOCAB) {
        err = bad("too many pieces", len);
        goto fail;
    }
    if (!(tok = rt_tok_alloc((int32_t)m.n))) {
        qs_log_error(__func__, "out of memory");
        err = RT_TOK_ERR_NOMEM;
        goto fail;
    }
    tok->kind = RT_TOK_KIND_SPM;
    for (size_t i = 0; i < m.n; i++) {
        const struct spm_piece *p = &m.pieces[i];
        struct rt_tok_entry *e = &tok->ent[i];
        if ((err = rt_tok_arena_put(tok, p->s, p->len, &e->piece_off)))
            goto fail;
        e->piece_len = e->model_len = p->len;
        e->model_off = e->piece_off;
        switch (p->type) {
        case SPM_NORMAL: e->attr = RT_TOKA_MODEL; break;
        case SPM_UNUSED: e->attr = RT_TOKA_MODEL | RT_TOKA_UNUSED; break;
        case SPM_USER_DEFINED: e->attr = RT_TOKA_MODEL | RT_TOKA_ADDED; break; /* matched whole */
        case SPM_UNKNOWN: /* fall through */
        case SPM_CONTROL: e->attr = RT_TOKA_ADDED | RT_TOKA_SPECIAL; break;
        case SPM_BYTE: {
            int b = (p->len == 6 && memcmp(p->s, "<0x", 3) == 0 && p->s[5] == '>') ? hex2(p->s + 3) : -1;
            if (b < 0 || tok->byte_id[b] >= 0) {
                qs_log_error(__func__, "tokenizer.model: byte piece %zu \"%.*s\" is not a new <0xXX>", i, (int)p->len, p->s);
                err = RT_TOK_ERR_MODEL;
                goto fail;
            }
            e->attr = RT_TOKA_BYTE;
            tok->byte_id[b] = (int32_t)i;
            break;
        }
        }
    }
    if ((err = rt_tok_strmap_build(tok))) {
        if (err == RT_TOK_ERR_JSON)
            err = RT_TOK_ERR_MODEL; /* duplicate piece: reported by the map */
        goto fail;
    }
    if ((err = build_merges(tok, &m)))
        goto fail;
    tok->unk_id = spm_id(m.unk_id, m.n);
    tok->bos_id = spm_id(m.bos_id, m.n);
    int32_t eos = spm_id(m.eos_id, m.n);
    if (eos >= 0)
        tok->eos_ids[tok->n_eos++] = eos;
    if (tok->unk_id < 0 || tok->ent[tok->unk_id].attr & RT_TOKA_MODEL) {
        qs_log_error(__func__, "tokenizer.model: unk_id %lld is not an UNKNOWN piece", (long long)m.unk_id);
        err = RT_TOK_ERR_MODEL;
        goto fail;
    }
    tok->byte_fallback = m.byte_fallback;
    tok->fuse_unk = true;
    tok->dummy_prefix = m.add_dummy_prefix;
    tok->escape_spaces = m.escape_ws;
    tok->remove_extra_ws = m.remove_extra_ws;
    tok->strip_space = m.add_dummy_prefix;
    tok->add_bos = tok->bos_id >= 0; /* HF LlamaTokenizer: add_bos_token=True, add_eos_token=False */
    tok->add_eos = false;
    free(m.pieces);
    *out = tok;
    return RT_TOK_ERR_NONE;
fail:
    free(m.pieces);
    rt_tok_free(tok);
    return err;
}
