/*
 * rt_blocks.c - the block manager of the paged KV cache (rt_blocks.h): block tables, reference
 * counts, free list, and the prefix cache (hash chain of full blocks, LRU of unused ones).
 */
#include "rt_blocks.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "qs_log.h"

struct blk {
    int ref;           /* slots whose table holds it */
    bool hashed;       /* registered in the prefix cache */
    uint64_t hash;     /* chain hash of its prefix up to and including its tokens */
    int next_hash;     /* next block of its hash bucket, -1 */
    int lru_prev, lru_next; /* evictable list (ref 0 and hashed), -1 ends */
    int next_free;     /* free list (ref 0, not hashed), -1 ends */
};

struct slot {
    int len;           /* positions held */
    int n_tab;         /* blocks in the table */
    int32_t *table;    /* [max_blocks] */
    int32_t *tokens;   /* [max_blocks * bs]: the tokens of its positions (commit) */
    int n_hashed;      /* leading blocks whose hash is known (full and committed) */
    uint64_t *hash;    /* [max_blocks]: chain hash of block i (valid for i < n_hashed) */
};

struct rt_blocks {
    int n_blocks, bs, n_slots, max_blocks;
    bool prefix;
    struct blk *b;
    int free_head, n_free;
    int lru_head, lru_tail, n_lru; /* head: least recently used */
    int n_buckets;     /* power of two */
    int *bucket;       /* [n_buckets] first block, -1 */
    int n_cached;
    int32_t *btok;     /* [n_blocks][bs]: the tokens of each registered block */
    struct slot *s;
};

// --- lists ------------------------------------------------------------------------------------

static void lru_remove(struct rt_blocks *m, int id)
{
    struct blk *x = &m->b[id];
    if (x->lru_prev >= 0) m->b[x->lru_prev].lru_next = x->lru_next;
    else m->lru_head = x->lru_next;
    if (x->lru_next >= 0) m->b[x->lru_next].lru_prev = x->lru_prev;
    else m->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = -1;
    m->n_lru--;
}

static void lru_push(struct rt_blocks *m, int id) /* most recently used end */
{
    struct blk *x = &m->b[id];
    x->lru_prev = m->lru_tail;
    x->lru_next = -1;
    if (m->lru_tail >= 0) m->b[m->lru_tail].lru_next = id;
    else m->lru_head = id;
    m->lru_tail = id;
    m->n_lru++;
}

static void free_push(struct rt_blocks *m, int id)
{
    m->b[id].next_free = m->free_head;
    m->free_head = id;
    m->n_free++;
}

static void unhash(struct rt_blocks *m, int id)
{
    struct blk *x = &m->b[id];
    if (!x->hashed) return;
    int *pp = &m->bucket[x->hash & (uint64_t)(m->n_buckets - 1)];
    while (*pp != id) pp = &m->b[*pp].next_hash;
    *pp = x->next_hash;
    x->next_hash = -1;
    x->hashed = false;
    m->n_cached--;
}

/* A block with no user left: evictable when registered, else free. */
static void release(struct rt_blocks *m, int id)
{
    if (--m->b[id].ref > 0) return;
    if (m->b[id].hashed) lru_push(m, id);
    else free_push(m, id);
}

/* A block for a writer (ref 1, unregistered); -1 when none is left. */
static int take(struct rt_blocks *m)
{
    int id = -1;
    if (m->free_head >= 0) {
        id = m->free_head;
        m->free_head = m->b[id].next_free;
        m->n_free--;
    } else if (m->lru_head >= 0) { /* evict the least recently used cached block */
        id = m->lru_head;
        lru_remove(m, id);
        unhash(m, id);
    } else {
        return -1;
    }
    m->b[id].ref = 1;
    return id;
}

// --- create -----------------------------------------------------------------------------------

enum rt_err rt_blocks_create(int n_blocks, int block_size, int n_slots, int max_blocks_per_seq,
                             bool prefix_cache, struct rt_blocks **out)
{
    *out = NULL;
    if (n_blocks < 2 || block_size < 1 || n_slots < 1 || max_blocks_per_seq < 1) {
        qs_log_error(__func__, "%d blocks of %d tokens for %d sequences of up to %d blocks: need "
                     ">= 2 blocks (one is reserved) and >= 1 of the rest", n_blocks, block_size,
                     n_slots, max_blocks_per_seq);
        return RT_ERR_ARG;
    }
    struct rt_blocks *m = calloc(1, sizeof(*m));
    if (!m) goto nomem;
    m->n_blocks = n_blocks;
    m->bs = block_size;
    m->n_slots = n_slots;
    m->max_blocks = max_blocks_per_seq;
    m->prefix = prefix_cache;
    m->n_buckets = 1;
    while (m->n_buckets < n_blocks) m->n_buckets *= 2;
    m->b = calloc((size_t)n_blocks, sizeof(*m->b));
    m->bucket = malloc((size_t)m->n_buckets * sizeof(int));
    m->s = calloc((size_t)n_slots, sizeof(*m->s));
    m->btok = malloc((size_t)n_blocks * (size_t)block_size * sizeof(int32_t));
    if (!m->b || !m->bucket || !m->s || !m->btok) goto nomem;
    for (int i = 0; i < m->n_buckets; i++) m->bucket[i] = -1;
    m->free_head = m->lru_head = m->lru_tail = -1;
    for (int i = n_blocks - 1; i >= 1; i--) { /* block 1 first */
        m->b[i].next_hash = m->b[i].lru_prev = m->b[i].lru_next = -1;
        free_push(m, i);
    }
    m->b[0].ref = 1; /* reserved: never free */
    m->b[0].next_hash = m->b[0].lru_prev = m->b[0].lru_next = -1;
    for (int i = 0; i < n_slots; i++) {
        struct slot *s = &m->s[i];
        s->table = malloc((size_t)max_blocks_per_seq * sizeof(int32_t));
        s->tokens = malloc((size_t)max_blocks_per_seq * (size_t)block_size * sizeof(int32_t));
        s->hash = malloc((size_t)max_blocks_per_seq * sizeof(uint64_t));
        if (!s->table || !s->tokens || !s->hash) goto nomem;
        for (int j = 0; j < max_blocks_per_seq; j++) s->table[j] = 0;
    }
    *out = m;
    return RT_ERR_NONE;
nomem:
    qs_log_error(__func__, "out of host memory for the block tables of %d sequences", n_slots);
    rt_blocks_free(m);
    return RT_ERR_NOMEM;
}

void rt_blocks_free(struct rt_blocks *m)
{
    if (!m) return;
    for (int i = 0; m->s && i < m->n_slots; i++) {
        free(m->s[i].table);
        free(m->s[i].tokens);
        free(m->s[i].hash);
    }
    free(m->s);
    free(m->b);
    free(m->bucket);
    free(m->btok);
    free(m);
}

int rt_blocks_block_size(const struct rt_blocks *m) { return m->bs; }
int rt_blocks_total(const struct rt_blocks *m) { return m->n_blocks - 1; }
int rt_blocks_available(const struct rt_blocks *m) { return m->n_free + m->n_lru; }
int rt_blocks_used(const struct rt_blocks *m) { return m->n_blocks - 1 - m->n_free - m->n_lru; }
int rt_blocks_cached(const struct rt_blocks *m) { return m->n_cached; }

static bool slot_ok(const struct rt_blocks *m, int slot)
{
    return slot >= 0 && slot < m->n_slots;
}

int rt_blocks_len(const struct rt_blocks *m, int slot)
{
    return slot_ok(m, slot) ? m->s[slot].len : 0;
}

int rt_blocks_n_table(const struct rt_blocks *m, int slot)
{
    return slot_ok(m, slot) ? m->s[slot].n_tab : 0;
}

const int32_t *rt_blocks_table(const struct rt_blocks *m, int slot)
{
    return slot_ok(m, slot) ? m->s[slot].table : NULL;
}

// --- writes -----------------------------------------------------------------------------------

int rt_blocks_needed(const struct rt_blocks *m, int slot, int p0, int n)
{
    if (!slot_ok(m, slot) || n < 1) return 0;
    const struct slot *s = &m->s[slot];
    const int first = p0 / m->bs, last = (p0 + n - 1) / m->bs;
    int need = 0;
    for (int i = first; i <= last; i++)
        need += i >= s->n_tab || m->b[s->table[i]].ref > 1;
    return need;
}

/* Truncate slot s to `len` positions: blocks past it released, hashes past it forgotten. */
static void truncate_to(struct rt_blocks *m, struct slot *s, int len)
{
    const int keep = (len + m->bs - 1) / m->bs;
    while (s->n_tab > keep) {
        const int id = s->table[--s->n_tab];
        s->table[s->n_tab] = 0;
        release(m, id);
    }
    if (s->n_hashed > len / m->bs) s->n_hashed = len / m->bs;
    s->len = len;
}

enum rt_err rt_blocks_prepare(struct rt_blocks *m, int slot, int p0, int n, int32_t *copy,
                              int *n_copy)
{
    *n_copy = 0;
    if (!slot_ok(m, slot) || n < 1 || p0 < 0 || p0 > m->s[slot].len ||
        (int64_t)p0 + n > (int64_t)m->max_blocks * m->bs) {
        qs_log_error(__func__, "slot %d: positions %d..%d (it holds %d, at most %d)", slot, p0,
                     p0 + n - 1, slot_ok(m, slot) ? m->s[slot].len : -1, m->max_blocks * m->bs);
        return RT_ERR_ARG;
    }
    struct slot *s = &m->s[slot];
    const int need = rt_blocks_needed(m, slot, p0, n);
    /* a rewind frees the blocks past the new end first; count only those with no other user */
    int freed = 0;
    for (int i = (p0 + n + m->bs - 1) / m->bs; i < s->n_tab; i++)
        freed += m->b[s->table[i]].ref == 1;
    if (need > rt_blocks_available(m) + freed) {
        qs_log_debug("slot %d: %d more KV blocks needed, %d available", slot, need,
                     rt_blocks_available(m) + freed);
        return RT_ERR_KV_FULL;
    }
    if (p0 + n < s->len) truncate_to(m, s, p0 + n);
    if (s->n_hashed > p0 / m->bs) s->n_hashed = p0 / m->bs; /* those blocks change */
    const int first = p0 / m->bs, last = (p0 + n - 1) / m->bs;
    for (int i = first; i <= last; i++) {
        if (i >= s->n_tab) {
            s->table[s->n_tab++] = take(m);
            continue;
        }
        const int id = s->table[i];
        if (m->b[id].ref > 1) { /* shared: copy it before it is written */
            const int nid = take(m);
            m->b[id].ref--;
            s->table[i] = nid;
            if ((int64_t)i * m->bs < p0) { /* rows before p0 are kept: they must be copied */
                copy[2 * *n_copy] = id;
                copy[2 * *n_copy + 1] = nid;
                (*n_copy)++;
            }
        } else {
            unhash(m, id); /* its content changes */
        }
    }
    s->len = p0 + n;
    return RT_ERR_NONE;
}

/* The registered block other than `skip` with hash h and these tokens, or -1. */
static int lookup(const struct rt_blocks *m, uint64_t h, const int32_t *tokens, int skip)
{
    const size_t bytes = (size_t)m->bs * sizeof(int32_t);
    for (int id = m->bucket[h & (uint64_t)(m->n_buckets - 1)]; id >= 0; id = m->b[id].next_hash)
        if (id != skip && m->b[id].hash == h && !memcmp(m->btok + (size_t)id * m->bs, tokens, bytes))
            return id;
    return -1;
}

static uint64_t parent_hash(const struct slot *s, int i)
{
    return i ? s->hash[i - 1] : 0x7173686172642121ull; /* the chain's seed: "qshard!!" */
}

void rt_blocks_commit(struct rt_blocks *m, int slot, const int32_t *tokens, int p0, int n)
{
    if (!slot_ok(m, slot) || n < 1) return;
    struct slot *s = &m->s[slot];
    memcpy(s->tokens + p0, tokens, (size_t)n * sizeof(int32_t));
    for (int i = s->n_hashed; (i + 1) * m->bs <= s->len; i++) {
        const int32_t *bt = s->tokens + (size_t)i * m->bs;
        const uint64_t h = XXH64(bt, (size_t)m->bs * sizeof(int32_t), parent_hash(s, i));
        s->hash[i] = h;
        s->n_hashed = i + 1;
        const int id = s->table[i];
        struct blk *x = &m->b[id];
        if (!m->prefix || x->hashed || lookup(m, h, bt, id) >= 0) /* one copy is enough */
            continue;
        x->hash = h;
        x->hashed = true;
        memcpy(m->btok + (size_t)id * m->bs, bt, (size_t)m->bs * sizeof(int32_t));
        int *bk = &m->bucket[h & (uint64_t)(m->n_buckets - 1)];
        x->next_hash = *bk;
        *bk = id;
        m->n_cached++;
    }
}

int rt_blocks_match(struct rt_blocks *m, int slot, const int32_t *tokens, int n)
{
    if (!m->prefix || !slot_ok(m, slot) || m->s[slot].n_tab || n < 2) return 0;
    struct slot *s = &m->s[slot];
    const int most = (n - 1) / m->bs; /* whole blocks, one token left to compute */
    int i = 0;
    for (; i < most && i < m->max_blocks; i++) {
        const int32_t *bt = tokens + (size_t)i * m->bs;
        const uint64_t h = XXH64(bt, (size_t)m->bs * sizeof(int32_t), parent_hash(s, i));
        const int id = lookup(m, h, bt, -1);
        if (id < 0) break;
        if (m->b[id].ref++ == 0) lru_remove(m, id);
        s->table[s->n_tab++] = id;
        s->hash[i] = h;
        memcpy(s->tokens + (size_t)i * m->bs, bt, (size_t)m->bs * sizeof(int32_t));
    }
    s->n_hashed = i;
    s->len = i * m->bs;
    return s->len;
}

void rt_blocks_clear(struct rt_blocks *m, int slot)
{
    if (slot_ok(m, slot)) truncate_to(m, &m->s[slot], 0);
}

bool rt_blocks_check(const struct rt_blocks *m)
{
    int *ref = calloc((size_t)m->n_blocks, sizeof(int));
    bool ok = ref != NULL;
    for (int i = 0; ok && i < m->n_slots; i++) {
        const struct slot *s = &m->s[i];
        if (s->n_tab != (s->len + m->bs - 1) / m->bs || s->n_hashed > s->len / m->bs) {
            qs_log_error(__func__, "slot %d: %d blocks, %d hashed for %d positions", i, s->n_tab,
                         s->n_hashed, s->len);
            ok = false;
        }
        for (int j = 0; ok && j < s->n_tab; j++) {
            if (s->table[j] < 1 || s->table[j] >= m->n_blocks) {
                qs_log_error(__func__, "slot %d: table entry %d is block %d", i, j, s->table[j]);
                ok = false;
            } else {
                ref[s->table[j]]++;
            }
        }
    }
    int n_free = 0, n_lru = 0, n_hashed = 0, n_used = 0;
    for (int id = 1; ok && id < m->n_blocks; id++) {
        const struct blk *x = &m->b[id];
        n_hashed += x->hashed;
        n_used += ref[id] > 0;
        if (x->ref != ref[id]) {
            qs_log_error(__func__, "block %d: reference count %d, %d table uses", id, x->ref,
                         ref[id]);
            ok = false;
        }
    }
    for (int id = m->free_head; ok && id >= 0; id = m->b[id].next_free, n_free++)
        if (m->b[id].ref || m->b[id].hashed || n_free > m->n_blocks) {
            qs_log_error(__func__, "free block %d is in use or registered", id);
            ok = false;
        }
    for (int id = m->lru_head; ok && id >= 0; id = m->b[id].lru_next, n_lru++)
        if (m->b[id].ref || !m->b[id].hashed || n_lru > m->n_blocks) {
            qs_log_error(__func__, "evictable block %d is in use or unregistered", id);
            ok = false;
        }
    if (ok && (n_free != m->n_free || n_lru != m->n_lru || n_hashed != m->n_cached ||
               n_used != rt_blocks_used(m))) {
        qs_log_error(__func__, "counts: %d/%d free, %d/%d evictable, %d/%d registered", n_free,
                     m->n_free, n_lru, m->n_lru, n_hashed, m->n_cached);
        ok = false;
    }
    free(ref);
    return ok;
}
