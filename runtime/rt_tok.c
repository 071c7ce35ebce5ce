/*
 * rt_tok.c - the tokenizer core: error strings, string/pair hash maps, rt_tok_load (reads the
 * files through rt_tok_json.c / rt_tok_spm.c, then indexes added tokens, byte ids and decode
 * bytes), the encode driver (added-token matching, BOS/EOS), decoding, streaming decoding,
 * accessors, rt_tok_load_dir. The model half of encoding is rt_tok_bpe.c; chat formatting is
 * rt_chat.c. API and contracts: rt_tok.h. Test: ./build/test_tok.
 *
 * Behaviour followed (facts, not code): huggingface/tokenizers (tokenizer/added_vocabulary.rs
 * leftmost-longest added-token matching, decoders/{byte_fallback,strip,fuse,byte_level}.rs,
 * processors/template.rs) and google/sentencepiece (decoding of byte pieces and "▁").
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>      /* XXH3_64bits: piece hash */
#include <zlib.h>        /* gzopen: tokenizer.json.gz */

#include "qs_log.h"     /* qs_log_error */
#include "rt_tok_int.h" /* struct rt_tok */

const char *rt_tok_err_str(enum rt_tok_err err)
{
    switch (err) {
#define RT_TOK_X_STR(name, value, msg) \
    case name:                         \
        return msg;
        RT_TOK_ERR_LIST(RT_TOK_X_STR)
#undef RT_TOK_X_STR
    }
    return "unknown error";
}

// --- arena, maps, allocation ----------------------------------------------------------------

enum rt_tok_err rt_tok_arena_put(struct rt_tok *tok, const void *s, size_t n, uint32_t *off)
{
    if (n > UINT32_MAX / 2 || tok->arena_len + n + 1 > UINT32_MAX) {
        qs_log_error(__func__, "tokenizer strings exceed 4 GiB");
        return RT_TOK_ERR_TOO_LONG;
    }
    if (tok->arena_len + n + 1 > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap : 4096;
        while (cap < tok->arena_len + n + 1)
            cap *= 2;
        char *a = realloc(tok->arena, cap);
        if (!a) {
            qs_log_error(__func__, "out of memory for %zu bytes of tokenizer strings", cap);
            return RT_TOK_ERR_NOMEM;
        }
        tok->arena = a, tok->arena_cap = cap;
    }
    if (n)
        memcpy(tok->arena + tok->arena_len, s, n);
    tok->arena[tok->arena_len + n] = '\0'; /* every string is NUL-terminated */
    *off = (uint32_t)tok->arena_len;
    tok->arena_len += n + 1;
    return RT_TOK_ERR_NONE;
}

static uint32_t hash_str(const char *s, size_t n)
{
    return (uint32_t)XXH3_64bits(s, n);
}

enum rt_tok_err rt_tok_strmap_build(struct rt_tok *tok)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)tok->n_vocab)
        cap *= 2;
    free(tok->model_map.slot);
    tok->model_map.slot = malloc(cap * sizeof(int32_t));
    if (!tok->model_map.slot) {
        qs_log_error(__func__, "out of memory for the vocabulary hash (%zu slots)", cap);
        return RT_TOK_ERR_NOMEM;
    }
    memset(tok->model_map.slot, 0xFF, cap * sizeof(int32_t));
    tok->model_map.mask = (uint32_t)(cap - 1);
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const struct rt_tok_entry *e = &tok->ent[id];
        if (!(e->attr & RT_TOKA_MODEL))
            continue;
        const char *s = tok->arena + e->model_off;
        uint32_t h = hash_str(s, e->model_len) & tok->model_map.mask;
        for (;; h = (h + 1) & tok->model_map.mask) {
            int32_t o = tok->model_map.slot[h];
            if (o < 0) {
                tok->model_map.slot[h] = id;
                break;
            }
            if (tok->ent[o].model_len == e->model_len &&
                memcmp(tok->arena + tok->ent[o].model_off, s, e->model_len) == 0) {
                qs_log_error(__func__, "vocabulary piece \"%s\" appears twice (ids %d and %d)", s,
                             (int)o, (int)id);
                return RT_TOK_ERR_JSON;
            }
        }
    }
    return RT_TOK_ERR_NONE;
}

int32_t rt_tok_strmap_get(const struct rt_tok *tok, const char *s, size_t n)
{
    const struct rt_tok_strmap *m = &tok->model_map;
    if (!m->slot)
        return -1;
    for (uint32_t h = hash_str(s, n) & m->mask;; h = (h + 1) & m->mask) {
        int32_t id = m->slot[h];
        if (id < 0)
            return -1;
        const struct rt_tok_entry *e = &tok->ent[id];
        if (e->model_len == n && memcmp(tok->arena + e->model_off, s, n) == 0)
            return id;
    }
}

static uint64_t pair_key(int32_t l, int32_t r)
{
    return ((uint64_t)(uint32_t)(l + 1) << 32) | (uint32_t)(r + 1);
}

static uint32_t pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL; /* murmur3 fmix64 */
    k ^= k >> 33;
    return (uint32_t)k;
}

enum rt_tok_err rt_tok_pairmap_init(struct rt_tok_pairmap *m, size_t n_expected)
{
    size_t cap = 16;
    while (cap < 2 * n_expected + 16)
        cap *= 2;
    free(m->slot);
    m->slot = calloc(cap, sizeof(*m->slot));
    if (!m->slot) {
        qs_log_error(__func__, "out of memory for the merge table (%zu slots)", cap);
        return RT_TOK_ERR_NOMEM;
    }
    m->mask = (uint32_t)(cap - 1);
    m->n = 0;
    return RT_TOK_ERR_NONE;
}

/* Insert or overwrite (a later duplicate merge wins, as in HF's HashMap collect). The caller
 * sized the map for every insertion, so it is never more than half full. */
void rt_tok_pairmap_put(struct rt_tok_pairmap *m, int32_t l, int32_t r, int32_t rank,
                        int32_t result)
{
    uint64_t k = pair_key(l, r);
    for (uint32_t h = pair_hash(k) & m->mask;; h = (h + 1) & m->mask) {
        if (m->slot[h].key == 0 || m->slot[h].key == k) {
            if (m->slot[h].key == 0)
                m->n++;
            m->slot[h] = (struct rt_tok_merge){k, rank, result};
            return;
        }
    }
}

const struct rt_tok_merge *rt_tok_pairmap_get(const struct rt_tok_pairmap *m, int32_t l, int32_t r)
{
    if (!m->slot)
        return NULL;
    uint64_t k = pair_key(l, r);
    for (uint32_t h = pair_hash(k) & m->mask;; h = (h + 1) & m->mask) {
        if (m->slot[h].key == k)
            return &m->slot[h];
        if (m->slot[h].key == 0)
            return NULL;
    }
}

struct rt_tok *rt_tok_alloc(int32_t n_vocab)
{
    struct rt_tok *tok = calloc(1, sizeof(*tok));
    if (!tok)
        return NULL;
    tok->ent = calloc(n_vocab > 0 ? (size_t)n_vocab : 1, sizeof(*tok->ent));
    if (!tok->ent) {
        free(tok);
        return NULL;
    }
    tok->n_vocab = n_vocab;
    for (int32_t i = 0; i < n_vocab; i++)
        tok->ent[i].split_l = tok->ent[i].split_r = -1;
    for (int i = 0; i < 256; i++)
        tok->byte_id[i] = -1;
    tok->unk_id = tok->bos_id = -1;
    rt_tok_bytelevel_map(tok->bl_cp);
    return tok;
}

void rt_tok_free(struct rt_tok *tok)
{
    if (!tok)
        return;
    free(tok->ent);
    free(tok->arena);
    free(tok->model_map.slot);
    free(tok->merges.slot);
    free(tok->added);
    free(tok->nadded);
    free(tok->nadded_off);
    free(tok->nadded_len);
    free(tok->chat_template);
    free(tok);
}

/* The id of an exact vocabulary string: an added token's content first, then a model piece. */
int32_t rt_tok_find(const struct rt_tok *tok, const char *piece)
{
    if (!tok || !piece)
        return -1;
    size_t n = strlen(piece);
    for (size_t i = 0; i < tok->n_added + tok->n_nadded; i++) {
        int32_t id = i < tok->n_added ? tok->added[i] : tok->nadded[i - tok->n_added];
        const struct rt_tok_entry *e = &tok->ent[id];
        if (e->piece_len == n && memcmp(tok->arena + e->piece_off, piece, n) == 0)
            return id;
    }
    if (tok->added == NULL) { /* during loading, before the added index exists */
        for (int32_t id = 0; id < tok->n_vocab; id++) {
            const struct rt_tok_entry *e = &tok->ent[id];
            if ((e->attr & RT_TOKA_ADDED) && e->piece_len == n &&
                memcmp(tok->arena + e->piece_off, piece, n) == 0)
                return id;
        }
    }
    return rt_tok_strmap_get(tok, piece, n);
}

// --- finishing a load -----------------------------------------------------------------------

static int added_cmp(const void *pa, const void *pb, void *ctx)
{
    const struct rt_tok *tok = ctx;
    const struct rt_tok_entry *a = &tok->ent[*(const int32_t *)pa];
    const struct rt_tok_entry *b = &tok->ent[*(const int32_t *)pb];
    unsigned char fa = (unsigned char)tok->arena[a->piece_off];
    unsigned char fb = (unsigned char)tok->arena[b->piece_off];
    if (fa != fb)
        return fa < fb ? -1 : 1;
    if (a->piece_len != b->piece_len)
        return a->piece_len > b->piece_len ? -1 : 1;
    return memcmp(tok->arena + a->piece_off, tok->arena + b->piece_off, a->piece_len);
}

static int nadded_cmp(const void *pa, const void *pb, void *ctx)
{
    const struct rt_tok *tok = ctx;
    size_t a = (size_t)(*(const int32_t *)pa), b = (size_t)(*(const int32_t *)pb);
    uint32_t la = tok->nadded_len[a], lb = tok->nadded_len[b];
    return la != lb ? (la > lb ? -1 : 1) : (a < b ? -1 : a > b);
}

/* Added tokens with normalized=true under a SentencePiece normalizer (Prepend / Replace) are
 * matched in the normalised text against their normalised content ("▁" + content, spaces as
 * "▁"), longest first: RT_TOKA_NMATCH, listed in tok->nadded. */
static enum rt_tok_err build_nadded(struct rt_tok *tok)
{
    if (tok->kind != RT_TOK_KIND_SPM || !(tok->norm_prepend || tok->norm_replace))
        return RT_TOK_ERR_NONE;
    size_t n = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        n += (tok->ent[id].attr & (RT_TOKA_ADDED | RT_TOKA_NORMALIZED)) ==
             (RT_TOKA_ADDED | RT_TOKA_NORMALIZED);
    if (n == 0)
        return RT_TOK_ERR_NONE;
    int32_t *ids = malloc(n * sizeof(int32_t)), *order = malloc(n * sizeof(int32_t));
    uint32_t *off = malloc(n * sizeof(uint32_t)), *len = malloc(n * sizeof(uint32_t));
    char *buf = NULL;
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    if (!ids || !order || !off || !len) {
        qs_log_error(__func__, "out of memory");
        err = RT_TOK_ERR_NOMEM;
        goto out;
    }
    size_t k = 0;
    for (int32_t id = 0; id < tok->n_vocab && !err; id++) {
        struct rt_tok_entry *e = &tok->ent[id];
        if ((e->attr & (RT_TOKA_ADDED | RT_TOKA_NORMALIZED)) != (RT_TOKA_ADDED | RT_TOKA_NORMALIZED))
            continue;
        char *nb = realloc(buf, 3 * (size_t)e->piece_len + 4);
        if (!nb) {
            qs_log_error(__func__, "out of memory");
            err = RT_TOK_ERR_NOMEM;
            break;
        }
        buf = nb;
        size_t m = 0;
        if (tok->norm_prepend) {
            memcpy(buf, RT_TOK_SPM_SPACE, 3);
            m = 3;
        }
        for (uint32_t i = 0; i < e->piece_len; i++) {
            char c = tok->arena[e->piece_off + i];
            if (c == ' ' && tok->norm_replace) {
                memcpy(buf + m, RT_TOK_SPM_SPACE, 3);
                m += 3;
            } else {
                buf[m++] = c;
            }
        }
        e->attr |= RT_TOKA_NMATCH;
        ids[k] = id;
        len[k] = (uint32_t)m;
        order[k] = (int32_t)k;
        err = rt_tok_arena_put(tok, buf, m, &off[k]);
        k++;
    }
    if (err)
        goto out;
    tok->nadded_off = off, tok->nadded_len = len; /* for the sort */
    qsort_r(order, n, sizeof(int32_t), nadded_cmp, tok);
    tok->nadded = malloc(n * sizeof(int32_t));
    uint32_t *soff = malloc(n * sizeof(uint32_t)), *slen = malloc(n * sizeof(uint32_t));
    if (!tok->nadded || !soff || !slen) {
        free(soff);
        free(slen);
        tok->nadded_off = tok->nadded_len = NULL;
        qs_log_error(__func__, "out of memory");
        err = RT_TOK_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        tok->nadded[i] = ids[order[i]];
        soff[i] = off[order[i]];
        slen[i] = len[order[i]];
    }
    tok->nadded_off = soff, tok->nadded_len = slen;
    tok->n_nadded = n;
out:
    free(ids);
    free(order);
    free(off);
    free(len);
    free(buf);
    return err;
}

/* Index the added tokens by first byte, longest first. Two added tokens with the same content
 * are an error (`dup_err`): which one a match meant would be ambiguous. */
static enum rt_tok_err build_added(struct rt_tok *tok, enum rt_tok_err dup_err)
{
    enum rt_tok_err err = build_nadded(tok);
    if (err)
        return err;
    size_t n = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        n += (tok->ent[id].attr & (RT_TOKA_ADDED | RT_TOKA_NMATCH)) == RT_TOKA_ADDED;
    free(tok->added);
    tok->added = malloc((n ? n : 1) * sizeof(int32_t));
    if (!tok->added) {
        qs_log_error(__func__, "out of memory");
        return RT_TOK_ERR_NOMEM;
    }
    tok->n_added = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        if ((tok->ent[id].attr & (RT_TOKA_ADDED | RT_TOKA_NMATCH)) == RT_TOKA_ADDED)
            tok->added[tok->n_added++] = id;
    qsort_r(tok->added, n, sizeof(int32_t), added_cmp, tok);
    for (size_t i = 1; i < n; i++) {
        if (added_cmp(&tok->added[i - 1], &tok->added[i], tok) == 0) {
            qs_log_error(__func__, "added token \"%s\" is given to ids %d and %d",
                         tok->arena + tok->ent[tok->added[i]].piece_off, (int)tok->added[i - 1],
                         (int)tok->added[i]);
            return dup_err;
        }
    }
    memset(tok->added_first, 0, sizeof(tok->added_first));
    memset(tok->added_second, 0, sizeof(tok->added_second));
    memset(tok->added_single, 0, sizeof(tok->added_single));
    for (size_t i = 0; i < n; i++) {
        const struct rt_tok_entry *e = &tok->ent[tok->added[i]];
        const unsigned char *c = (const unsigned char *)tok->arena + e->piece_off;
        tok->added_first[c[0] + 1]++;
        if (e->piece_len == 1)
            tok->added_single[c[0] / 8] |= (uint8_t)(1u << (c[0] % 8));
        else
            tok->added_second[c[0]][c[1] / 8] |= (uint8_t)(1u << (c[1] % 8));
    }
    for (int b = 0; b < 256; b++)
        tok->added_first[b + 1] += tok->added_first[b];
    return RT_TOK_ERR_NONE;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

/* "<0xXX>" -> XX, else -1 (HF decoders/byte_fallback.rs accepts either hex case). */
static int byte_piece(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || hexval(s[3]) < 0 || hexval(s[4]) < 0)
        return -1;
    return hexval(s[3]) * 16 + hexval(s[4]);
}

/* The bytes each id decodes to (struct rt_tok_entry.dec_*). */
static enum rt_tok_err build_dec(struct rt_tok *tok)
{
    int16_t rev[0x144]; /* byte-level code point -> byte */
    for (int i = 0; i < 0x144; i++)
        rev[i] = -1;
    for (int b = 0; b < 256; b++)
        rev[tok->bl_cp[b]] = (int16_t)b;
    char *buf = NULL;
    size_t cap = 0;
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    for (int32_t id = 0; id < tok->n_vocab && !err; id++) {
        struct rt_tok_entry *e = &tok->ent[id];
        e->dec_off = e->piece_off, e->dec_len = e->piece_len;
        if ((e->attr & RT_TOKA_ADDED) || e->piece_len == 0)
            continue;
        if (e->piece_len + 1 > cap) {
            cap = 2 * e->piece_len + 16;
            char *nb = realloc(buf, cap);
            if (!nb) {
                qs_log_error(__func__, "out of memory");
                err = RT_TOK_ERR_NOMEM;
                break;
            }
            buf = nb;
        }
        const char *p = tok->arena + e->piece_off;
        size_t n = e->piece_len, m = 0;
        if (tok->kind == RT_TOK_KIND_SPM) {
            int b = byte_piece(p, n);
            if (b >= 0) {
                buf[m++] = (char)b;
                e->attr |= RT_TOKA_BYTE; /* decoded by the byte-run rules (rt_tok_decode) */
            } else {
                for (size_t i = 0; i < n; i++) {
                    if (i + 3 <= n && memcmp(p + i, RT_TOK_SPM_SPACE, 3) == 0) {
                        buf[m++] = ' ';
                        i += 2;
                    } else {
                        buf[m++] = p[i];
                    }
                }
            }
        } else {
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                int len = rt_tok_utf8_seq((const unsigned char *)p + i, n - i, &cp);
                if (len <= 0 || cp >= 0x144 || rev[cp] < 0) {
                    m = 0; /* not a byte-level string: decode to its raw bytes */
                    break;
                }
                buf[m++] = (char)rev[cp];
                i += (size_t)len;
            }
            if (m == 0)
                continue;
        }
        if (m == n && memcmp(buf, p, n) == 0)
            continue;
        err = rt_tok_arena_put(tok, buf, m, &e->dec_off);
        e->dec_len = (uint32_t)m;
    }
    free(buf);
    return err;
}

/* Byte ids: SentencePiece <0xXX> pieces; byte-level single mapped characters (all required). */
static enum rt_tok_err build_byte_ids(struct rt_tok *tok)
{
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t n;
        if (tok->kind == RT_TOK_KIND_SPM) {
            if (tok->byte_id[b] >= 0)
                continue; /* set by the tokenizer.model reader */
            n = (size_t)snprintf(s, sizeof(s), "<0x%02X>", b);
        } else {
            uint16_t cp = tok->bl_cp[b];
            if (cp < 0x80) {
                s[0] = (char)cp, n = 1;
            } else {
                s[0] = (char)(0xC0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
            }
        }
        tok->byte_id[b] = rt_tok_strmap_get(tok, s, n);
        if (tok->kind == RT_TOK_KIND_BYTELEVEL && tok->byte_id[b] < 0) {
            qs_log_error(__func__, "tokenizer.json: byte-level vocabulary lacks the token for byte 0x%02X", b);
            return RT_TOK_ERR_JSON;
        }
    }
    return RT_TOK_ERR_NONE;
}

/* True when no model piece contains "▁" right after a character other than "▁": then no merge
 * joins a character to a following "▁", and SentencePiece text can be merged word by word. */
static bool spm_word_split_ok(const struct rt_tok *tok)
{
    if (tok->kind != RT_TOK_KIND_SPM)
        return false;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        const struct rt_tok_entry *e = &tok->ent[id];
        if (!(e->attr & RT_TOKA_MODEL))
            continue;
        const char *p = tok->arena + e->model_off;
        for (uint32_t i = 1; i + 3 <= e->model_len; i++) {
            if (memcmp(p + i, RT_TOK_SPM_SPACE, 3) != 0)
                continue;
            if (i < 3 || memcmp(p + i - 3, RT_TOK_SPM_SPACE, 3) != 0)
                return false;
        }
    }
    return true;
}

enum rt_tok_err rt_tok_load(const struct rt_tok_files *files, struct rt_tok **out)
{
    if (!out)
        return RT_TOK_ERR_ARG;
    *out = NULL;
    if (!files) {
        qs_log_error(__func__, "no files given");
        return RT_TOK_ERR_ARG;
    }
    struct rt_tok *tok = NULL;
    enum rt_tok_err err;
    if (files->json) {
        struct rt_tok_json_opts o = {.tmpl_bos = -1, .tmpl_eos = -1};
        if ((err = rt_tok_json_load(files->json, files->json_len, &tok, &o)))
            return err;
        if (o.tmpl_bos >= tok->n_vocab || o.tmpl_eos >= tok->n_vocab) {
            qs_log_error(__func__, "tokenizer.json: post_processor special token id %d is outside the vocabulary [0, %d)",
                         (int)(o.tmpl_bos >= tok->n_vocab ? o.tmpl_bos : o.tmpl_eos), (int)tok->n_vocab);
            err = RT_TOK_ERR_JSON;
            goto fail;
        }
        tok->bos_id = o.tmpl_bos;
        tok->add_bos = o.tmpl_bos >= 0;
        tok->add_eos = o.tmpl_eos >= 0;
        if (o.tmpl_eos >= 0)
            tok->eos_ids[tok->n_eos++] = o.tmpl_eos;
        if (tok->kind == RT_TOK_KIND_SPM) { /* LlamaTokenizer defaults */
            if (tok->bos_id < 0)
                tok->bos_id = rt_tok_find(tok, "<s>");
            if (tok->n_eos == 0 && rt_tok_find(tok, "</s>") >= 0)
                tok->eos_ids[tok->n_eos++] = rt_tok_find(tok, "</s>");
        }
    } else if (files->model) {
        if ((err = rt_tok_spm_load(files->model, files->model_len, &tok)))
            return err;
    } else {
        qs_log_error(__func__, "neither tokenizer.json nor tokenizer.model was given");
        return RT_TOK_ERR_NO_MODEL;
    }
    if (files->config && (err = rt_tok_config_apply(tok, files->config, files->config_len)))
        goto fail;
    if (files->special_map &&
        (err = rt_tok_special_map_apply(tok, files->special_map, files->special_map_len)))
        goto fail;
    if ((err = build_added(tok, files->special_map ? RT_TOK_ERR_SPECIAL_MAP : RT_TOK_ERR_JSON)) ||
        (err = build_byte_ids(tok)) || (err = build_dec(tok)))
        goto fail;
    tok->spm_word_split = spm_word_split_ok(tok);
    /* BOS and EOS always count as special, whatever the files say about them. */
    if (tok->bos_id >= 0)
        tok->ent[tok->bos_id].attr |= RT_TOKA_SPECIAL;
    for (size_t i = 0; i < tok->n_eos; i++)
        tok->ent[tok->eos_ids[i]].attr |= RT_TOKA_SPECIAL;
    if (tok->add_bos && tok->bos_id < 0) {
        qs_log_error(__func__, "the tokenizer adds BOS but has no bos token");
        err = files->config ? RT_TOK_ERR_CONFIG : RT_TOK_ERR_JSON;
        goto fail;
    }
    if (tok->add_eos && tok->n_eos == 0) {
        qs_log_error(__func__, "the tokenizer adds EOS but has no eos token");
        err = files->config ? RT_TOK_ERR_CONFIG : RT_TOK_ERR_JSON;
        goto fail;
    }
    *out = tok;
    return RT_TOK_ERR_NONE;
fail:
    rt_tok_free(tok);
    return err;
}

// --- encoding -------------------------------------------------------------------------------

static bool is_ws_at(const char *s, size_t n, size_t i, size_t *len)
{
    uint32_t cp;
    int k = rt_tok_utf8_seq((const unsigned char *)s + i, n - i, &cp);
    if (k <= 0 || !rt_tok_uni_in(cp, rt_tok_uni_space, rt_tok_uni_space_n))
        return false;
    *len = (size_t)k;
    return true;
}

/* The longest eligible added token starting at s[p], or -1. */
static int32_t match_added(const struct rt_tok *tok, const char *s, size_t n, size_t p,
                           unsigned flags)
{
    unsigned char b = (unsigned char)s[p];
    if (tok->added_first[b] == tok->added_first[b + 1])
        return -1;
    if (!(tok->added_single[b / 8] & (1u << (b % 8)))) { /* all of them are 2+ bytes long */
        unsigned char c = p + 1 < n ? (unsigned char)s[p + 1] : 0;
        if (p + 1 >= n || !(tok->added_second[b][c / 8] & (1u << (c % 8))))
            return -1;
    }
    for (uint32_t k = tok->added_first[b]; k < tok->added_first[b + 1]; k++) {
        int32_t id = tok->added[k];
        const struct rt_tok_entry *e = &tok->ent[id];
        if ((e->attr & RT_TOKA_SPECIAL) && !(flags & RT_TOK_PARSE_SPECIAL))
            continue;
        if (e->piece_len <= n - p && memcmp(tok->arena + e->piece_off, s + p, e->piece_len) == 0)
            return id;
    }
    return -1;
}

/* Reject text that is not UTF-8. */
static enum rt_tok_err check_text(const char *text, size_t len)
{
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = rt_tok_utf8_seq((const unsigned char *)text + i, len - i, &cp);
        if (k <= 0) {
            qs_log_error(__func__, "text is not valid UTF-8 at byte %zu (0x%02X)", i, (unsigned char)text[i]);
            return RT_TOK_ERR_UTF8;
        }
        i += (size_t)k;
    }
    return RT_TOK_ERR_NONE;
}

enum rt_tok_err rt_tok_encode(const struct rt_tok *tok, const char *text, size_t len,
                              unsigned flags, int32_t **ids, size_t *n)
{
    if (ids)
        *ids = NULL;
    if (n)
        *n = 0;
    if (!tok || !ids || !n || (!text && len)) {
        qs_log_error(__func__, "NULL argument");
        return RT_TOK_ERR_ARG;
    }
    if (len >= RT_TOK_MAX_TEXT) {
        qs_log_error(__func__, "text of %zu bytes is longer than the limit of %zu", len, RT_TOK_MAX_TEXT);
        return RT_TOK_ERR_TOO_LONG;
    }
    enum rt_tok_err err = check_text(text, len);
    if (err)
        return err;
    bool bos = (flags & RT_TOK_DEFAULT_SPECIAL) ? tok->add_bos : (flags & RT_TOK_ADD_BOS) != 0;
    bool eos = (flags & RT_TOK_DEFAULT_SPECIAL) ? tok->add_eos : (flags & RT_TOK_ADD_EOS) != 0;
    struct rt_tok_ids out = {0};
    if (bos && tok->bos_id < 0) {
        qs_log_error(__func__, "BOS requested but the tokenizer has no bos token");
        return RT_TOK_ERR_ARG;
    }
    if (eos && tok->n_eos == 0) {
        qs_log_error(__func__, "EOS requested but the tokenizer has no eos token");
        return RT_TOK_ERR_ARG;
    }
    if (bos && (err = rt_tok_ids_push(&out, tok->bos_id)))
        goto fail;
    size_t seg = 0; /* start of the text not yet encoded */
    for (size_t p = 0; p <= len; p++) {
        int32_t id = p < len ? match_added(tok, text, len, p, flags) : -1;
        if (id < 0 && p < len)
            continue;
        size_t end = p, next = p;
        if (id >= 0) {
            const struct rt_tok_entry *e = &tok->ent[id];
            next = p + e->piece_len;
            if (e->attr & RT_TOKA_LSTRIP) { /* swallow whitespace on the left */
                while (end > seg) {
                    size_t q = end - 1, k;
                    while (q > seg && ((unsigned char)text[q] & 0xC0) == 0x80)
                        q--;
                    if (!is_ws_at(text, len, q, &k))
                        break;
                    end = q;
                }
            }
            if (e->attr & RT_TOKA_RSTRIP) {
                size_t k;
                while (next < len && is_ws_at(text, len, next, &k))
                    next += k;
            }
        }
        if ((err = rt_tok_encode_segment(tok, text + seg, end - seg, seg == 0, flags, &out)))
            goto fail;
        if (id >= 0) {
            /* never a second BOS: a text that starts with the BOS token already has it */
            bool dup_bos = bos && id == tok->bos_id && out.n == 1 && end == 0;
            if (!dup_bos && (err = rt_tok_ids_push(&out, id)))
                goto fail;
        }
        seg = next;
        p = next - 1; /* loop increment moves to next */
        if (id < 0)
            break;
    }
    if (eos && (err = rt_tok_ids_push(&out, tok->eos_ids[0])))
        goto fail;
    if (!out.v && !(out.v = malloc(sizeof(int32_t)))) {
        qs_log_error(__func__, "out of memory");
        err = RT_TOK_ERR_NOMEM;
        goto fail;
    }
    *ids = out.v;
    *n = out.n;
    return RT_TOK_ERR_NONE;
fail:
    free(out.v);
    return err;
}

// --- decoding -------------------------------------------------------------------------------

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* Copy s[0..n) to dst (capacity >= 3n + 3) replacing invalid UTF-8 by U+FFFD: one per maximal
 * ill-formed subpart (Unicode 15 §3.9, Rust's from_utf8_lossy), or with per_byte one per byte
 * that does not start a valid character (sentencepiece's byte pieces). A trailing incomplete
 * sequence is left out and its length stored in *held when held is non-NULL, else replaced.
 * Returns the bytes written. */
static size_t utf8_sanitize(const unsigned char *s, size_t n, char *dst, size_t *held,
                            bool per_byte)
{
    size_t m = 0;
    if (held)
        *held = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = rt_tok_utf8_seq(s + i, n - i, &cp);
        if (k > 0) {
            memcpy(dst + m, s + i, (size_t)k);
            m += (size_t)k, i += (size_t)k;
        } else if (k == 0 && held) {
            *held = n - i;
            break;
        } else {
            memcpy(dst + m, REPLACEMENT, 3);
            m += 3;
            i += per_byte ? 1 : k < 0 ? (size_t)-k : n - i;
        }
    }
    dst[m] = '\0';
    return m;
}

static bool decode_skips(const struct rt_tok *tok, int32_t id, unsigned flags)
{
    return (flags & RT_TOK_DECODE_SKIP_SPECIAL) && (tok->ent[id].attr & RT_TOKA_SPECIAL);
}

/* A SentencePiece byte piece <0xXX> (its one decoded byte). */
static bool is_byte_token(const struct rt_tok *tok, int32_t id)
{
    return tok->kind == RT_TOK_KIND_SPM && (tok->ent[id].attr & RT_TOKA_BYTE) &&
           tok->ent[id].dec_len == 1;
}

/* A run of byte tokens that has ended, HF's ByteFallback rule: the bytes if the whole run is
 * valid UTF-8, else one U+FFFD per byte of the run. */
static size_t byte_run_hf(const unsigned char *s, size_t n, char *dst)
{
    size_t held = 0, m = utf8_sanitize(s, n, dst, &held, false);
    if (held == 0 && m == n && memcmp(dst, s, n) == 0)
        return n;
    for (m = 0; m < 3 * n; m += 3)
        memcpy(dst + m, REPLACEMENT, 3);
    return m;
}

/* SentencePiece-kind decode of ids[n] (range-checked) into dst (capacity >= 3 * decoded bytes
 * + 4): pieces verbatim, byte-token runs by the tokenizer's rule (rt_tok_int.h byte_run_whole).
 * *piece_first: the first token not skipped is a piece, not a byte token (sentencepiece strips
 * the dummy-prefix space only from such a piece).
 * A skipped special token is not there for HF's rule (skip_special_tokens drops it before the
 * decoders) and ends the run for sentencepiece's (a control piece is a piece). run: scratch of
 * >= n bytes. Returns the bytes written. */
static size_t decode_spm(const struct rt_tok *tok, const int32_t *ids, size_t n, unsigned flags,
                         unsigned char *run, char *dst, bool *piece_first)
{
    size_t m = 0, nr = 0;
    bool first = true;
    *piece_first = false;
    for (size_t i = 0; i <= n; i++) {
        const bool skip = i < n && decode_skips(tok, ids[i], flags);
        if (i < n && !skip && first) { /* the first token that shows: a piece or a byte? */
            *piece_first = !is_byte_token(tok, ids[i]);
            first = false;
        }
        if (i < n && is_byte_token(tok, ids[i]) && !skip) {
            run[nr++] = (unsigned char)tok->arena[tok->ent[ids[i]].dec_off];
            continue;
        }
        if (skip && tok->byte_run_whole)
            continue;
        if (nr > 0)
            m += tok->byte_run_whole ? byte_run_hf(run, nr, dst + m) /* sentencepiece: */
                                     : utf8_sanitize(run, nr, dst + m, NULL, true);
        nr = 0;
        if (i < n && !skip) {
            const struct rt_tok_entry *e = &tok->ent[ids[i]];
            memcpy(dst + m, tok->arena + e->dec_off, e->dec_len);
            m += e->dec_len;
        }
    }
    return m;
}

enum rt_tok_err rt_tok_decode(const struct rt_tok *tok, const int32_t *ids, size_t n,
                              unsigned flags, char **text, size_t *len)
{
    if (text)
        *text = NULL;
    if (len)
        *len = 0;
    if (!tok || !text || !len || (!ids && n)) {
        qs_log_error(__func__, "NULL argument");
        return RT_TOK_ERR_ARG;
    }
    size_t raw_len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_vocab) {
            qs_log_error(__func__, "token id %d at position %zu is outside [0, %d)", (int)ids[i], i, (int)tok->n_vocab);
            return RT_TOK_ERR_ID;
        }
        if (!decode_skips(tok, ids[i], flags))
            raw_len += tok->ent[ids[i]].dec_len;
    }
    unsigned char *raw = malloc(raw_len + n + 1);
    char *dst = malloc(3 * raw_len + 4), *mid = NULL;
    if (!raw || !dst) {
        free(raw);
        free(dst);
        qs_log_error(__func__, "out of memory decoding %zu ids", n);
        return RT_TOK_ERR_NOMEM;
    }
    size_t m = 0;
    bool piece_first = true;
    if (tok->kind == RT_TOK_KIND_SPM) {
        /* pieces are UTF-8 and runs come out valid: the sanitize below changes nothing */
        mid = malloc(3 * raw_len + 4);
        if (!mid) {
            free(raw);
            free(dst);
            qs_log_error(__func__, "out of memory decoding %zu ids", n);
            return RT_TOK_ERR_NOMEM;
        }
        m = decode_spm(tok, ids, n, flags, raw, mid, &piece_first);
    } else {
        for (size_t i = 0; i < n; i++) {
            if (decode_skips(tok, ids[i], flags))
                continue;
            const struct rt_tok_entry *e = &tok->ent[ids[i]];
            memcpy(raw + m, tok->arena + e->dec_off, e->dec_len);
            m += e->dec_len;
        }
    }
    /* byte-level: String::from_utf8_lossy (HF decoders/byte_level.rs), U+FFFD per maximal
     * ill-formed subpart; then the decoder's Strip of one leading space (HF Strip: of the
     * decoded text; sentencepiece: of the first piece's "▁" only, never of a byte token) */
    const unsigned char *src = mid ? (const unsigned char *)mid : raw;
    size_t start = tok->strip_space && !(flags & RT_TOK_DECODE_KEEP_SPACE) && m > 0 &&
                   src[0] == ' ' && (piece_first || tok->byte_run_whole);
    *len = utf8_sanitize(src + start, m - start, dst, NULL, false);
    *text = dst;
    free(mid);
    free(raw);
    return RT_TOK_ERR_NONE;
}

void rt_tok_stream_init(struct rt_tok_stream *s, const struct rt_tok *tok, unsigned flags)
{
    memset(s, 0, sizeof(*s));
    s->tok = tok;
    s->flags = flags;
}

static enum rt_tok_err stream_reserve(struct rt_tok_stream *s, size_t need)
{
    if (need <= s->out_cap)
        return RT_TOK_ERR_NONE;
    size_t cap = need < 64 ? 64 : 2 * need;
    char *o = realloc(s->out, cap);
    if (!o) {
        qs_log_error(__func__, "out of memory");
        return RT_TOK_ERR_NOMEM;
    }
    s->out = o, s->out_cap = cap;
    return RT_TOK_ERR_NONE;
}

/* SentencePiece kind: the held bytes are an incomplete character of a byte run; the run ends
 * (a piece, a skipped control token under sentencepiece's rule, or the flush): one U+FFFD per
 * held byte, as both rules give for a run that ends inside a character. */
static size_t stream_end_run(struct rt_tok_stream *s, char *dst)
{
    size_t m = 0;
    for (size_t i = 0; i < s->n_hold; i++, m += 3)
        memcpy(dst + m, REPLACEMENT, 3);
    s->n_hold = 0;
    return m;
}

/* Bytes of token id (none when skip: a skipped special token) appended to the held ones, complete characters written to dst (capacity
 * >= 3 * (held + token bytes) + 4); the new incomplete tail held. Returns the bytes written. */
static size_t stream_decode(struct rt_tok_stream *s, int32_t id, bool skip,
                            const unsigned char *bytes, size_t blen, unsigned char *comb,
                            char *dst)
{
    const struct rt_tok *tok = s->tok;
    size_t m = 0, held = 0, need;
    if (tok->kind == RT_TOK_KIND_SPM && (skip || !is_byte_token(tok, id))) {
        if (skip && tok->byte_run_whole) /* HF drops skipped specials before its decoders */
            return 0;
        m = stream_end_run(s, dst);
        memcpy(dst + m, bytes, blen);
        return m + blen;
    }
    memcpy(comb, s->hold, s->n_hold);
    memcpy(comb + s->n_hold, bytes, blen);
    need = s->n_hold + blen;
    /* SentencePiece: one byte of a run, by sentencepiece's rule, eagerly */
    m = utf8_sanitize(comb, need, dst, &held, tok->kind == RT_TOK_KIND_SPM);
    memcpy(s->hold, comb + need - held, held); /* held <= 3: an incomplete character */
    s->n_hold = held;
    return m;
}

enum rt_tok_err rt_tok_stream_push(struct rt_tok_stream *s, int32_t id, const char **text,
                                   size_t *len)
{
    *text = "", *len = 0;
    const struct rt_tok *tok = s->tok;
    if (id < 0 || id >= tok->n_vocab) {
        qs_log_error(__func__, "token id %d is outside [0, %d)", (int)id, (int)tok->n_vocab);
        return RT_TOK_ERR_ID;
    }
    const struct rt_tok_entry *e = &tok->ent[id];
    const bool skip = decode_skips(tok, id, s->flags);
    size_t blen = skip ? 0 : e->dec_len;
    const unsigned char *bytes = (const unsigned char *)tok->arena + e->dec_off;
    size_t need = s->n_hold + blen;
    unsigned char local[256], *comb = local;
    if (need > sizeof(local) && !(comb = malloc(need))) {
        qs_log_error(__func__, "out of memory");
        return RT_TOK_ERR_NOMEM;
    }
    enum rt_tok_err err = stream_reserve(s, 3 * need + 4);
    if (!err) {
        size_t m = stream_decode(s, id, skip, bytes, blen, comb, s->out);
        size_t start = 0;
        /* the decoder's Strip of the first leading space: HF, of the first text that comes
         * out; sentencepiece, only when the first token that shows is a piece (rt_tok_decode) */
        const bool spm_rule = tok->kind == RT_TOK_KIND_SPM && !tok->byte_run_whole;
        if (spm_rule && !s->started && !skip) {
            s->started = true;
            start = !is_byte_token(tok, id) && m > 0 && s->out[0] == ' ';
        } else if (!spm_rule && !s->started && m > 0) {
            s->started = true;
            start = s->out[0] == ' ';
        }
        start = start && tok->strip_space && !(s->flags & RT_TOK_DECODE_KEEP_SPACE);
        memmove(s->out, s->out + start, m - start);
        s->out[m - start] = '\0';
        *len = m - start;
        *text = s->out;
    }
    if (comb != local)
        free(comb);
    return err;
}

enum rt_tok_err rt_tok_stream_flush(struct rt_tok_stream *s, const char **text, size_t *len)
{
    *text = "", *len = 0;
    enum rt_tok_err err = stream_reserve(s, 3 * s->n_hold + 4);
    if (err)
        return err;
    if (s->tok->kind == RT_TOK_KIND_SPM)
        *len = stream_end_run(s, s->out);
    else
        *len = utf8_sanitize(s->hold, s->n_hold, s->out, NULL, false);
    s->out[*len] = '\0';
    *text = s->out;
    s->n_hold = 0;
    s->started = false;
    return RT_TOK_ERR_NONE;
}

void rt_tok_stream_free(struct rt_tok_stream *s)
{
    if (!s)
        return;
    free(s->out);
    s->out = NULL;
    s->out_cap = 0;
}

// --- accessors ------------------------------------------------------------------------------

const char *rt_tok_piece(const struct rt_tok *tok, int32_t id)
{
    if (!tok || id < 0 || id >= tok->n_vocab)
        return NULL;
    return tok->arena ? tok->arena + tok->ent[id].piece_off : "";
}

const char *rt_tok_bytes(const struct rt_tok *tok, int32_t id, size_t *len)
{
    if (!tok || id < 0 || id >= tok->n_vocab)
        return NULL;
    *len = tok->ent[id].dec_len;
    return tok->arena ? tok->arena + tok->ent[id].dec_off : "";
}

int32_t rt_tok_n_vocab(const struct rt_tok *tok)
{
    return tok ? tok->n_vocab : 0;
}

int32_t rt_tok_bos_id(const struct rt_tok *tok)
{
    return tok ? tok->bos_id : -1;
}

const int32_t *rt_tok_eos_ids(const struct rt_tok *tok, size_t *n)
{
    *n = tok ? tok->n_eos : 0;
    return tok ? tok->eos_ids : NULL;
}

bool rt_tok_is_special(const struct rt_tok *tok, int32_t id)
{
    return tok && id >= 0 && id < tok->n_vocab && (tok->ent[id].attr & RT_TOKA_SPECIAL);
}

// --- reading a model directory --------------------------------------------------------------

/* Read a whole file into a malloc'd buffer, gunzipping it when it is gzip data (zlib's gzread
 * passes other files through unchanged). Returns 0 on success, ENOENT when it does not exist,
 * another errno value on failure (reported). */
static int read_file(const char *path, char **buf, size_t *len)
{
    const size_t max = (size_t)1 << 30;
    *buf = NULL, *len = 0;
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return ENOENT;
        qs_log_error(__func__, "%s: cannot open: %s", path, strerror(errno));
        return EIO;
    }
    gzbuffer(f, 1 << 16);
    size_t cap = 1 << 20, n = 0;
    char *b = malloc(cap);
    int rc = 0;
    for (;;) {
        if (!b) {
            qs_log_error(__func__, "%s: out of memory", path);
            rc = ENOMEM;
            break;
        }
        if (n == cap) {
            if (cap >= max) {
                qs_log_error(__func__, "%s: larger than %zu bytes", path, max);
                rc = EFBIG;
                break;
            }
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                b = NULL;
                continue;
            }
            b = nb, cap *= 2;
        }
        int k = gzread(f, b + n, (unsigned)(cap - n > (1u << 30) ? (1u << 30) : cap - n));
        if (k < 0) {
            int e;
            qs_log_error(__func__, "%s: read error: %s", path, gzerror(f, &e));
            rc = EIO;
            break;
        }
        if (k == 0)
            break;
        n += (size_t)k;
    }
    gzclose(f);
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b, *len = n;
    return 0;
}

enum rt_tok_err rt_tok_load_dir(const char *dir, struct rt_tok **out)
{
    static const char *const names[] = {"tokenizer.json", "tokenizer.json.gz", "tokenizer.model",
                                        "tokenizer_config.json"};
    char *buf[4] = {0};
    size_t len[4] = {0};
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    if (out)
        *out = NULL;
    if (!dir || !out)
        return RT_TOK_ERR_ARG;
    for (int i = 0; i < 4; i++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, names[i]) >= sizeof(path)) {
            qs_log_error(__func__, "path too long: %s", dir);
            err = RT_TOK_ERR_ARG;
            goto out;
        }
        if (i == 1 && buf[0])
            continue; /* tokenizer.json found: no need for the .gz */
        int rc = read_file(path, &buf[i], &len[i]);
        if (rc && rc != ENOENT) {
            err = rc == ENOMEM ? RT_TOK_ERR_NOMEM : RT_TOK_ERR_IO;
            goto out;
        }
    }
    if (!buf[0] && !buf[1] && !buf[2]) {
        qs_log_error(__func__, "%s: no tokenizer.json, tokenizer.json.gz or tokenizer.model", dir);
        err = RT_TOK_ERR_NO_MODEL;
        goto out;
    }
    struct rt_tok_files f = {
        .json = buf[0] ? buf[0] : buf[1], .json_len = buf[0] ? len[0] : len[1],
        .model = (const unsigned char *)buf[2], .model_len = len[2],
        .config = buf[3], .config_len = len[3],
    };
    err = rt_tok_load(&f, out);
out:
    for (int i = 0; i < 4; i++)
        free(buf[i]);
    return err;
}
