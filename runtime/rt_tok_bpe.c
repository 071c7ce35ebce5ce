/*
 * rt_tok_bpe.c - the model half of encoding: one text segment (the text between added tokens)
 * -> ids. SentencePiece kind: normalise ("▁" prefix, spaces -> "▁"), one symbol per character
 * (byte fallback for characters outside the vocabulary), BPE merges. Byte-level kind: split the
 * segment with the pre-tokenizer regex (hand-written matcher below), map each word's bytes with
 * the GPT-2 byte-to-unicode table, BPE merges per word.
 *
 * Entry points: rt_tok_encode_segment (called by rt_tok_encode in rt_tok.c), rt_tok_utf8_seq,
 * rt_tok_uni_in, rt_tok_bytelevel_map. Test: ./build/test_tok.
 *
 * Merge order (both kinds): the adjacent pair with the lowest rank merges first, ties broken by
 * the leftmost position - HF tokenizers `BPE::merge_word` (rank = index in `merges`) and
 * sentencepiece `bpe_model.cc` Model::Encode (rank = order of the merged piece's score,
 * highest first, equal scores = equal rank). A binary heap of candidate pairs over a linked list
 * of symbols makes a word of n symbols O(n log n).
 */
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"     /* qs_log_error */
#include "rt_tok_int.h" /* struct rt_tok, rt_tok_ids, unicode tables */

// --- UTF-8 and Unicode classes --------------------------------------------------------------

int rt_tok_utf8_seq(const unsigned char *s, size_t n, uint32_t *cp)
{
    /* Well-formed byte sequences: Unicode 15.0 §3.9, Table 3-7. */
    unsigned b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    int len;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t c;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2, c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3, c = b0 & 0x0F;
        if (b0 == 0xE0)
            lo = 0xA0;
        if (b0 == 0xED)
            hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4, c = b0 & 0x07;
        if (b0 == 0xF0)
            lo = 0x90;
        if (b0 == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return 0;
        unsigned b = s[i];
        if (b < lo || b > hi)
            return -i;
        lo = 0x80, hi = 0xBF;
        c = (c << 6) | (b & 0x3F);
    }
    *cp = c;
    return len;
}

bool rt_tok_uni_in(uint32_t cp, const struct rt_tok_range *r, size_t n)
{
    size_t a = 0, b = n;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (cp < r[m].lo)
            b = m;
        else if (cp > r[m].hi)
            a = m + 1;
        else
            return true;
    }
    return false;
}

void rt_tok_bytelevel_map(uint16_t cp[256])
{
    unsigned extra = 0;
    for (unsigned b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        cp[b] = (uint16_t)(printable ? b : 256 + extra++);
    }
}

/* Character classes of the pre-tokenizer regexes. */
enum {
    CL_L = 1,    /* \p{L} */
    CL_N = 2,    /* \p{N} */
    CL_S = 4,    /* \s */
    CL_CRLF = 8, /* [\r\n] */
};

static unsigned char char_class(uint32_t cp)
{
    unsigned char c = 0;
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            return CL_L;
        if (cp >= '0' && cp <= '9')
            return CL_N;
        if (cp == '\r' || cp == '\n')
            return CL_S | CL_CRLF;
        if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20)
            return CL_S;
        return 0;
    }
    if (rt_tok_uni_in(cp, rt_tok_uni_letter, rt_tok_uni_letter_n))
        c |= CL_L;
    else if (rt_tok_uni_in(cp, rt_tok_uni_number, rt_tok_uni_number_n))
        c |= CL_N;
    else if (rt_tok_uni_in(cp, rt_tok_uni_space, rt_tok_uni_space_n))
        c |= CL_S;
    return c;
}

// --- id vector ------------------------------------------------------------------------------

enum rt_tok_err rt_tok_ids_push(struct rt_tok_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = realloc(ids->v, cap * sizeof(*v));
        if (!v) {
            qs_log_error(__func__, "out of memory growing the id list to %zu ids", cap);
            return RT_TOK_ERR_NOMEM;
        }
        ids->v = v, ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return RT_TOK_ERR_NONE;
}

// --- BPE merging ----------------------------------------------------------------------------

struct sym {
    int32_t id;         /* -1: absorbed into its left neighbour */
    int32_t prev, next; /* linked list of live symbols, -1 at the ends */
};

struct cand {
    int32_t rank, left; /* heap order: rank, then position */
    int32_t lid, rid;   /* ids when queued: a stale entry no longer matches */
};

/* Scratch for one segment, sized for its longest word: n symbols, 3n candidates. */
struct bpe_work {
    struct sym *sym;
    struct cand *heap;
    size_t n_heap;
    size_t cap; /* symbols */
};

static bool cand_less(const struct cand *a, const struct cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(struct bpe_work *w, struct cand c)
{
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static struct cand heap_pop(struct bpe_work *w)
{
    struct cand top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const struct cand *best = &last;
        if (l < n && cand_less(&w->heap[l], best))
            m = l, best = &w->heap[l];
        if (l + 1 < n && cand_less(&w->heap[l + 1], best))
            m = l + 1;
        if (m == i)
            break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n > 0)
        w->heap[i] = last;
    return top;
}

static void try_pair(const struct rt_tok *tok, struct bpe_work *w, int32_t l)
{
    if (l < 0)
        return;
    int32_t r = w->sym[l].next;
    if (r < 0)
        return;
    const struct rt_tok_merge *m = rt_tok_pairmap_get(&tok->merges, w->sym[l].id, w->sym[r].id);
    if (m)
        heap_push(w, (struct cand){m->rank, l, w->sym[l].id, w->sym[r].id});
}

static enum rt_tok_err work_reserve(struct bpe_work *w, size_t n)
{
    if (n <= w->cap)
        return RT_TOK_ERR_NONE;
    struct sym *s = realloc(w->sym, n * sizeof(*s));
    if (s)
        w->sym = s;
    struct cand *h = realloc(w->heap, 3 * n * sizeof(*h));
    if (h)
        w->heap = h;
    if (!s || !h) {
        qs_log_error(__func__, "out of memory for a word of %zu symbols", n);
        return RT_TOK_ERR_NOMEM;
    }
    w->cap = n;
    return RT_TOK_ERR_NONE;
}

static void work_free(struct bpe_work *w)
{
    free(w->sym);
    free(w->heap);
}

/* Output id, resegmenting SentencePiece UNUSED pieces into the pair they were merged from
 * (sentencepiece bpe_model.cc "resegment"). Depth is bounded by the piece length. */
static enum rt_tok_err emit(const struct rt_tok *tok, int32_t id, struct rt_tok_ids *out, int depth)
{
    const struct rt_tok_entry *e = &tok->ent[id];
    if ((e->attr & RT_TOKA_UNUSED) && e->split_l >= 0 && depth < 64) {
        enum rt_tok_err err = emit(tok, e->split_l, out, depth + 1);
        return err ? err : emit(tok, e->split_r, out, depth + 1);
    }
    return rt_tok_ids_push(out, id);
}

/* Merge w->sym[0..n) (linked in order) and append the resulting ids. */
static enum rt_tok_err bpe_run(const struct rt_tok *tok, struct bpe_work *w, size_t n,
                               struct rt_tok_ids *out)
{
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++)
        try_pair(tok, w, (int32_t)i);
    while (w->n_heap > 0) {
        struct cand c = heap_pop(w);
        struct sym *L = &w->sym[c.left];
        if (L->id != c.lid || L->next < 0)
            continue;
        struct sym *R = &w->sym[L->next];
        if (R->id != c.rid)
            continue;
        const struct rt_tok_merge *m = rt_tok_pairmap_get(&tok->merges, c.lid, c.rid);
        L->id = m->result;
        R->id = -1;
        L->next = R->next;
        if (R->next >= 0)
            w->sym[R->next].prev = c.left;
        try_pair(tok, w, L->prev);
        try_pair(tok, w, c.left);
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = w->sym[i].next) {
        enum rt_tok_err err = emit(tok, w->sym[i].id, out, 0);
        if (err)
            return err;
    }
    return RT_TOK_ERR_NONE;
}

static void sym_append(struct bpe_work *w, size_t *n, int32_t id)
{
    size_t i = (*n)++;
    w->sym[i] = (struct sym){id, (int32_t)i - 1, -1};
    if (i > 0)
        w->sym[i - 1].next = (int32_t)i;
}

// --- SentencePiece kind ---------------------------------------------------------------------


/* sentencepiece normalizer.cc with remove_extra_whitespaces: drop leading and trailing spaces,
 * collapse inner runs of spaces to one. Writes into dst, returns the length. */
static size_t squeeze_spaces(const char *s, size_t n, char *dst)
{
    size_t k = 0;
    bool pend = false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            pend = k > 0;
            continue;
        }
        if (pend)
            dst[k++] = ' ';
        pend = false;
        dst[k++] = s[i];
    }
    return k;
}

/* One SentencePiece word: a symbol per character (per byte when it falls back to bytes), then
 * the merges. */
static enum rt_tok_err spm_word(const struct rt_tok *tok, struct bpe_work *w, const char *norm,
                                size_t m, struct rt_tok_ids *out)
{
    enum rt_tok_err err = work_reserve(w, m);
    if (err)
        return err;
    size_t ns = 0;
    bool last_unk = false;
    for (size_t i = 0; i < m;) {
        uint32_t cp;
        int len = rt_tok_utf8_seq((const unsigned char *)norm + i, m - i, &cp);
        if (len <= 0) /* text was validated by rt_tok_encode */
            len = 1;
        int32_t id = rt_tok_strmap_get(tok, norm + i, (size_t)len);
        if (id >= 0) {
            sym_append(w, &ns, id);
            last_unk = false;
        } else {
            bool bytes_ok = tok->byte_fallback;
            for (int k = 0; k < len && bytes_ok; k++)
                bytes_ok = tok->byte_id[(unsigned char)norm[i + k]] >= 0;
            if (bytes_ok) {
                for (int k = 0; k < len; k++)
                    sym_append(w, &ns, tok->byte_id[(unsigned char)norm[i + k]]);
                last_unk = false;
            } else if (tok->unk_id < 0) {
                qs_log_error(__func__, "a character is not in the vocabulary and the tokenizer has neither byte fallback nor an unk token");
                return RT_TOK_ERR_UNSUPPORTED;
            } else if (!(last_unk && tok->fuse_unk)) {
                sym_append(w, &ns, tok->unk_id);
                last_unk = true;
            }
        }
        i += (size_t)len;
    }
    return bpe_run(tok, w, ns, out);
}

/* Merge normalised text norm[0..m) into ids, word by word where that is exact. */
static enum rt_tok_err spm_merge(const struct rt_tok *tok, struct bpe_work *w, const char *norm,
                                 size_t m, struct rt_tok_ids *out)
{
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    /* Words: when no mergeable piece has "▁" after another character (tok->spm_word_split),
     * no merge can cross a "▁" that follows a non-"▁" character, so the text is merged word by
     * word there (same result, memory bounded by the longest word); else as one word. A
     * Metaspace pre-tokenizer with split=true starts a word at every "▁" (spm_split_all). */
    for (size_t w0 = 0; w0 < m;) {
        size_t w1 = m;
        if (tok->spm_word_split || tok->spm_split_all) {
            bool prev_space = true;
            for (size_t i = w0; i < m; i++) {
                bool space = i + 3 <= m && memcmp(norm + i, RT_TOK_SPM_SPACE, 3) == 0;
                if (space && (!prev_space || tok->spm_split_all) && i > w0) {
                    w1 = i;
                    break;
                }
                if (space)
                    i += 2;
                else if (((unsigned char)norm[i] & 0xC0) != 0x80)
                    prev_space = false;
            }
        }
        if ((err = spm_word(tok, w, norm + w0, w1 - w0, out)))
            return err;
        w0 = w1;
    }
    return err;
}

static enum rt_tok_err encode_spm(const struct rt_tok *tok, const char *s, size_t n, bool first,
                                  unsigned flags, struct rt_tok_ids *out)
{
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    struct bpe_work w = {0};
    char *norm = NULL, *sq = NULL;
    if (tok->remove_extra_ws) {
        sq = malloc(n + 1);
        if (!sq)
            goto out_nomem;
        n = squeeze_spaces(s, n, sq);
        s = sq;
    }
    if (n == 0)
        goto out;
    /* Normalised text: at most 3 bytes per input byte plus the prefix. */
    norm = malloc(3 * n + 3);
    if (!norm)
        goto out_nomem;
    size_t m = 0;
    if (tok->dummy_prefix && (first || !tok->prefix_first_only) &&
        !(tok->prefix_unless_space &&
          ((s[0] == ' ' && tok->escape_spaces) || (n >= 3 && memcmp(s, RT_TOK_SPM_SPACE, 3) == 0)))) {
        memcpy(norm, RT_TOK_SPM_SPACE, 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ' && tok->escape_spaces) {
            memcpy(norm + m, RT_TOK_SPM_SPACE, 3);
            m += 3;
        } else {
            norm[m++] = s[i];
        }
    }
    /* Added tokens matched in the normalised text split it further (HF added_vocabulary.rs:
     * normalized=true tokens are found after normalisation, as their normalised content). */
    size_t a = 0;
    for (size_t p = 0; p < m && tok->n_nadded; p++) {
        int32_t id = -1;
        size_t len = 0;
        for (size_t k = 0; k < tok->n_nadded && id < 0; k++) {
            const struct rt_tok_entry *e = &tok->ent[tok->nadded[k]];
            uint32_t L = tok->nadded_len[k];
            if ((e->attr & RT_TOKA_SPECIAL) && !(flags & RT_TOK_PARSE_SPECIAL))
                continue;
            if (L <= m - p && memcmp(norm + p, tok->arena + tok->nadded_off[k], L) == 0)
                id = tok->nadded[k], len = L;
        }
        if (id < 0)
            continue;
        if ((err = spm_merge(tok, &w, norm + a, p - a, out)) || (err = rt_tok_ids_push(out, id)))
            goto out;
        a = p + len;
        p = a - 1;
    }
    err = spm_merge(tok, &w, norm + a, m - a, out);
    goto out;
out_nomem:
    qs_log_error(__func__, "out of memory normalising a segment of %zu bytes", n);
    err = RT_TOK_ERR_NOMEM;
out:
    work_free(&w);
    free(norm);
    free(sq);
    return err;
}

// --- byte-level kind: the pre-tokenizer regex -----------------------------------------------

/* A segment decoded to code points, with the byte offset of each (off[n] = byte length). */
struct cps {
    uint32_t *cp;
    uint32_t *off;
    unsigned char *cl;
    size_t n;
};

static bool is_other(unsigned char cl)
{
    return !(cl & (CL_L | CL_N | CL_S));
}

static uint32_t fold_ascii(uint32_t c)
{
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at i (case-insensitive when ci); returns the match length or 0.
 * Oniguruma's case folding also maps U+017F LATIN SMALL LETTER LONG S to 's'. */
static size_t match_contraction(const struct cps *c, size_t i, bool ci)
{
    if (c->cp[i] != '\'' || i + 1 >= c->n)
        return 0;
    uint32_t a = c->cp[i + 1], b = i + 2 < c->n ? c->cp[i + 2] : 0;
    if (ci) {
        a = a == 0x17F ? 's' : fold_ascii(a);
        b = b == 0x17F ? 's' : fold_ascii(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

static size_t run_of(const struct cps *c, size_t i, unsigned char mask)
{
    size_t j = i;
    while (j < c->n && (c->cl[j] & mask))
        j++;
    return j;
}

static size_t run_other(const struct cps *c, size_t i)
{
    size_t j = i;
    while (j < c->n && is_other(c->cl[j]))
        j++;
    return j;
}

/* \s+(?!\S) then \s+ at a whitespace character i: the longest run, minus its last character when
 * a non-space follows and the run is longer than one (the regex backtracks by one). */
static size_t match_space_tail(const struct cps *c, size_t i)
{
    size_t j = run_of(c, i, CL_S);
    if (j < c->n && j - i >= 2)
        return j - 1 - i;
    return j - i;
}

/* Length of the Llama-3 / Qwen2 pattern's match at i (max_digits 3 or 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * Alternatives are tried in order (leftmost-first, as Oniguruma does). */
static size_t match_llama3(const struct cps *c, size_t i, size_t max_digits)
{
    size_t k;
    unsigned char cl = c->cl[i];
    if ((k = match_contraction(c, i, true)))
        return k;
    if (cl & CL_L)
        return run_of(c, i, CL_L) - i;
    if (!(cl & (CL_CRLF | CL_N)) && i + 1 < c->n && (c->cl[i + 1] & CL_L))
        return run_of(c, i + 1, CL_L) - i;
    if (cl & CL_N) {
        size_t j = i;
        while (j < c->n && j - i < max_digits && (c->cl[j] & CL_N))
            j++;
        return j - i;
    }
    size_t st = (c->cp[i] == ' ' && i + 1 < c->n && is_other(c->cl[i + 1])) ? i + 1 : i;
    if (is_other(c->cl[st]))
        return run_of(c, run_other(c, st), CL_CRLF) - i;
    /* cl is whitespace from here on */
    size_t j = run_of(c, i, CL_S), last_nl = j;
    for (size_t q = i; q < j; q++)
        if (c->cl[q] & CL_CRLF)
            last_nl = q;
    if (last_nl < j)
        return last_nl + 1 - i;
    return match_space_tail(c, i);
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const struct cps *c, size_t i)
{
    size_t k;
    if ((k = match_contraction(c, i, false)))
        return k;
    size_t st = (c->cp[i] == ' ' && i + 1 < c->n) ? i + 1 : i;
    unsigned char cl = c->cl[st];
    if (st > i && (cl & CL_S))
        st = i, cl = c->cl[i];
    if (cl & CL_L)
        return run_of(c, st, CL_L) - i;
    if (cl & CL_N)
        return run_of(c, st, CL_N) - i;
    if (is_other(cl))
        return run_other(c, st) - i;
    return match_space_tail(c, i);
}

/* BPE of one pre-tokenized word [byte range of s], appending ids. */
static enum rt_tok_err encode_word(const struct rt_tok *tok, struct bpe_work *w, char *mapbuf,
                                   const unsigned char *s, size_t n, struct rt_tok_ids *out)
{
    if (tok->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            uint16_t cp = tok->bl_cp[s[i]];
            if (cp < 0x80) {
                mapbuf[m++] = (char)cp;
            } else {
                mapbuf[m++] = (char)(0xC0 | (cp >> 6));
                mapbuf[m++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        int32_t id = rt_tok_strmap_get(tok, mapbuf, m);
        if (id >= 0)
            return rt_tok_ids_push(out, id);
    }
    size_t ns = 0;
    for (size_t i = 0; i < n; i++)
        sym_append(w, &ns, tok->byte_id[s[i]]);
    return bpe_run(tok, w, ns, out);
}

/* BPE of the bytes s[0, n) as one pre-tokenized word (scratch reserved first), appending ids. */
static enum rt_tok_err encode_piece(const struct rt_tok *tok, struct bpe_work *w, char *mapbuf,
                                    const unsigned char *s, size_t n, struct rt_tok_ids *out)
{
    enum rt_tok_err err = work_reserve(w, n);
    return err ? err : encode_word(tok, w, mapbuf, s, n, out);
}

/* Whether Digits (tokenizers pre_tokenizers/digits.rs: char::is_numeric) sees a digit in byte b:
 * it runs after ByteLevel, on the byte-mapped text, where b's character is b itself for the
 * printable Latin-1 bytes: ASCII 0-9 and 0xB2 0xB3 0xB9 0xBC-0xBE (² ³ ¹ ¼ ½ ¾) are numeric. */
static bool falcon_numeric(unsigned char b)
{
    return (b >= '0' && b <= '9') || b == 0xB2 || b == 0xB3 || b == 0xB9 ||
           (b >= 0xBC && b <= 0xBE);
}

static bool ascii_digit(unsigned char b)
{
    return b >= '0' && b <= '9';
}

/* Digits then Split "[0-9][0-9][0-9]" Isolated on the bytes [p, q) of one word: runs of
 * numeric bytes apart from the rest; in a numeric run each leftmost non-overlapping triple of
 * ASCII digits is a piece of its own, what lies between them another. */
static enum rt_tok_err encode_falcon_word(const struct rt_tok *tok, struct bpe_work *w,
                                          char *mapbuf, const unsigned char *s, size_t p, size_t q,
                                          struct rt_tok_ids *out)
{
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    for (size_t r0 = p; r0 < q && !err;) {
        const bool num = falcon_numeric(s[r0]);
        size_t r1 = r0 + 1;
        while (r1 < q && falcon_numeric(s[r1]) == num)
            r1++;
        size_t last = r0;
        for (size_t j = r0; num && j + 3 <= r1 && !err;) {
            if (!(ascii_digit(s[j]) && ascii_digit(s[j + 1]) && ascii_digit(s[j + 2]))) {
                j++;
                continue;
            }
            if (j > last)
                err = encode_piece(tok, w, mapbuf, s + last, j - last, out);
            if (!err)
                err = encode_piece(tok, w, mapbuf, s + j, 3, out);
            last = j = j + 3;
        }
        if (!err && r1 > last)
            err = encode_piece(tok, w, mapbuf, s + last, r1 - last, out);
        r0 = r1;
    }
    return err;
}

/* Falcon's pre-tokenization (RT_TOK_PRETOK_FALCON; tokenizers pre_tokenizers/punctuation.rs
 * Contiguous, byte_level.rs, digits.rs, split.rs): runs of punctuation apart from the rest,
 * GPT-2's regex inside each run, then each word through Digits and the 3-digit Split on its
 * byte-mapped form (encode_falcon_word). */
static enum rt_tok_err encode_falcon(const struct rt_tok *tok, struct bpe_work *w, char *mapbuf,
                                     const char *s, const struct cps *c, struct rt_tok_ids *out)
{
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    for (size_t a = 0; a < c->n && !err;) {
        const bool pu = rt_tok_uni_in(c->cp[a], rt_tok_uni_punct, rt_tok_uni_punct_n);
        size_t b = a + 1;
        while (b < c->n && rt_tok_uni_in(c->cp[b], rt_tok_uni_punct, rt_tok_uni_punct_n) == pu)
            b++;
        const struct cps run = {c->cp + a, c->off + a, c->cl + a, b - a};
        for (size_t i = 0; i < run.n && !err;) {
            size_t k = match_gpt2(&run, i);
            k = k ? k : 1;
            err = encode_falcon_word(tok, w, mapbuf, (const unsigned char *)s, c->off[a + i],
                                     c->off[a + i + k], out);
            i += k;
        }
        a = b;
    }
    return err;
}

static enum rt_tok_err encode_bytelevel_chunk(const struct rt_tok *tok, const char *s, size_t n,
                                              struct rt_tok_ids *out)
{
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    struct bpe_work w = {0};
    struct cps c = {0};
    char *mapbuf = NULL;
    if (n == 0)
        return RT_TOK_ERR_NONE;
    c.cp = malloc(n * sizeof(*c.cp));
    c.off = malloc((n + 1) * sizeof(*c.off));
    c.cl = malloc(n);
    mapbuf = malloc(2 * n);
    if (!c.cp || !c.off || !c.cl || !mapbuf) {
        qs_log_error(__func__, "out of memory for a segment of %zu bytes", n);
        err = RT_TOK_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = rt_tok_utf8_seq((const unsigned char *)s + i, n - i, &cp);
        if (len <= 0) /* validated by rt_tok_encode */
            len = 1, cp = 0xFFFD;
        c.cp[c.n] = cp;
        c.cl[c.n] = char_class(cp);
        c.off[c.n++] = (uint32_t)i;
        i += (size_t)len;
    }
    c.off[c.n] = (uint32_t)n;
    if (tok->pretok == RT_TOK_PRETOK_FALCON) {
        err = encode_falcon(tok, &w, mapbuf, s, &c, out);
        goto out;
    }
    for (size_t i = 0; i < c.n;) {
        size_t k;
        switch (tok->pretok) {
        case RT_TOK_PRETOK_LLAMA3: k = match_llama3(&c, i, 3); break;
        case RT_TOK_PRETOK_QWEN2: k = match_llama3(&c, i, 1); break;
        case RT_TOK_PRETOK_GPT2: k = match_gpt2(&c, i); break;
        default: k = c.n - i; break;
        }
        if (k == 0) /* cannot happen: every class is covered by an alternative */
            k = 1;
        err = encode_piece(tok, &w, mapbuf, (const unsigned char *)s + c.off[i],
                           c.off[i + k] - c.off[i], out);
        if (err)
            goto out;
        i += k;
    }
out:
    work_free(&w);
    free(c.cp);
    free(c.off);
    free(c.cl);
    free(mapbuf);
    return err;
}

// --- NFC normalisation (Unicode Standard Annex #15; tables from tools/gen_unicode_tables.py) ---

/* Hangul syllable arithmetic: Unicode 15.0 §3.12. */
enum {
    HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
    HANGUL_NL = 19, HANGUL_NV = 21, HANGUL_NT = 28, HANGUL_NS = HANGUL_NL * HANGUL_NV * HANGUL_NT,
};

static unsigned ccc_of(uint32_t cp)
{
    size_t a = 0, b = rt_tok_uni_ccc_n;
    if (cp < 0x300)
        return 0;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (cp < rt_tok_uni_ccc[m].lo)
            b = m;
        else if (cp > rt_tok_uni_ccc[m].hi)
            a = m + 1;
        else
            return rt_tok_uni_ccc[m].ccc;
    }
    return 0;
}

static const struct rt_tok_decomp *decomp_of(uint32_t cp)
{
    size_t a = 0, b = rt_tok_uni_decomp_n;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (cp < rt_tok_uni_decomp[m].cp)
            b = m;
        else if (cp > rt_tok_uni_decomp[m].cp)
            a = m + 1;
        else
            return &rt_tok_uni_decomp[m];
    }
    return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_NL && b >= HANGUL_V && b < HANGUL_V + HANGUL_NV)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_NV + (b - HANGUL_V)) * HANGUL_NT;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_NS && (a - HANGUL_S) % HANGUL_NT == 0 &&
        b > HANGUL_T && b < HANGUL_T + HANGUL_NT)
        return a + (b - HANGUL_T);
    size_t lo = 0, hi = rt_tok_uni_comp_n;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        const struct rt_tok_comp *c = &rt_tok_uni_comp[m];
        if (a < c->first || (a == c->first && b < c->second))
            hi = m;
        else if (a > c->first || b > c->second)
            lo = m + 1;
        else
            return c->composite;
    }
    return 0;
}

static size_t put_utf8(char *d, uint32_t c)
{
    if (c < 0x80) {
        d[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        d[0] = (char)(0xC0 | (c >> 6)), d[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        d[0] = (char)(0xE0 | (c >> 12)), d[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        d[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (c >> 18)), d[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((c >> 6) & 0x3F)), d[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* NFC of valid UTF-8 s[0..n) into a malloc'd *out: canonical decomposition, canonical
 * ordering, canonical composition (UAX #15 §§1.3, 3.11 of the Standard). A decomposition is at
 * most 4 code points per input code point (the tables' longest), so 4n bounds the buffers. */
static enum rt_tok_err nfc(const char *s, size_t n, char **out, size_t *out_n)
{
    uint32_t *cp = malloc(4 * n * sizeof(uint32_t) + 4);
    char *dst = malloc(4 * n + 4);
    if (!cp || !dst) {
        free(cp);
        free(dst);
        qs_log_error(__func__, "out of memory normalising %zu bytes", n);
        return RT_TOK_ERR_NOMEM;
    }
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        int k = rt_tok_utf8_seq((const unsigned char *)s + i, n - i, &c);
        if (k <= 0)
            k = 1, c = 0xFFFD;
        i += (size_t)k;
        const struct rt_tok_decomp *d;
        if (c >= HANGUL_S && c < HANGUL_S + HANGUL_NS) {
            uint32_t x = c - HANGUL_S;
            cp[m++] = HANGUL_L + x / (HANGUL_NV * HANGUL_NT);
            cp[m++] = HANGUL_V + (x % (HANGUL_NV * HANGUL_NT)) / HANGUL_NT;
            if (x % HANGUL_NT)
                cp[m++] = HANGUL_T + x % HANGUL_NT;
        } else if ((d = decomp_of(c)) != NULL) {
            for (unsigned j = 0; j < d->len; j++)
                cp[m++] = rt_tok_uni_decomp_data[d->off + j];
        } else {
            cp[m++] = c;
        }
    }
    /* canonical ordering: stable insertion sort of each run of non-starters by class */
    for (size_t i = 1; i < m; i++) {
        unsigned cc = ccc_of(cp[i]);
        if (cc == 0)
            continue;
        uint32_t c = cp[i];
        size_t j = i;
        while (j > 0 && ccc_of(cp[j - 1]) > cc) {
            cp[j] = cp[j - 1];
            j--;
        }
        cp[j] = c;
    }
    /* composition: a character joins the last starter unless blocked by a character between
     * them of class 0 or of a class >= its own */
    size_t k = 0;
    long starter = -1;
    int prev_cc = -1; /* class of the last character kept after the starter; -1: none */
    for (size_t i = 0; i < m; i++) {
        uint32_t c = cp[i];
        int cc = (int)ccc_of(c);
        if (starter >= 0 && (prev_cc == -1 || (prev_cc != 0 && prev_cc < cc))) {
            uint32_t comp = compose(cp[starter], c);
            if (comp) {
                cp[starter] = comp;
                continue;
            }
        }
        if (cc == 0) {
            starter = (long)k;
            prev_cc = -1;
        } else {
            prev_cc = cc;
        }
        cp[k++] = c;
    }
    size_t len = 0;
    for (size_t i = 0; i < k; i++)
        len += put_utf8(dst + len, cp[i]);
    free(cp);
    *out = dst;
    *out_n = len;
    return RT_TOK_ERR_NONE;
}

static bool nfc_stable(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t c;
        int k = rt_tok_utf8_seq((const unsigned char *)s + i, n - i, &c);
        if (k <= 0)
            return false;
        if (c >= rt_tok_uni_nfc_unsafe[0].lo &&
            rt_tok_uni_in(c, rt_tok_uni_nfc_unsafe, rt_tok_uni_nfc_unsafe_n))
            return false;
        i += (size_t)k;
    }
    return true;
}

/* Long text is split into chunks of about CHUNK bytes at a "\n" that follows a byte other than
 * whitespace and is followed by an ASCII letter:
 * no match of the three split regexes contains both (a letter run cannot start with "\n"; the
 * other alternatives end at a newline or hold only whitespace, digits or punctuation), and the
 * regexes look only forward, so the chunks tokenize exactly like the whole. This bounds the
 * per-call scratch memory (~11 bytes per byte of chunk). */
enum { CHUNK = 1 << 16 };

static enum rt_tok_err encode_bytelevel(const struct rt_tok *tok, const char *s, size_t n,
                                        struct rt_tok_ids *out)
{
    size_t start = 0;
    while (start < n) {
        size_t cut = n;
        for (size_t i = start + CHUNK; i < n; i++) {
            char c = s[i];
            const unsigned char b2 = (unsigned char)s[i - 2]; /* no whitespace before the "\n":
                                                                * \s+(?!\S) would end there */
            if (s[i - 1] == '\n' && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') && b2 < 0x80 &&
                !strchr(" \t\r\n\v\f", b2)) {
                cut = i;
                break;
            }
        }
        enum rt_tok_err err = encode_bytelevel_chunk(tok, s + start, cut - start, out);
        if (err)
            return err;
        start = cut;
    }
    return RT_TOK_ERR_NONE;
}

enum rt_tok_err rt_tok_encode_segment(const struct rt_tok *tok, const char *s, size_t n, bool first,
                                      unsigned flags, struct rt_tok_ids *out)
{
    char *norm = NULL;
    if (tok->nfc && !nfc_stable(s, n)) { /* HF normalizers/unicode.rs NFC, per segment */
        enum rt_tok_err err = nfc(s, n, &norm, &n);
        if (err)
            return err;
        s = norm;
    }
    enum rt_tok_err err = tok->kind == RT_TOK_KIND_BYTELEVEL ? encode_bytelevel(tok, s, n, out)
                                                             : encode_spm(tok, s, n, first, flags, out);
    free(norm);
    return err;
}
