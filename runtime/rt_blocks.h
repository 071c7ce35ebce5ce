/*
 * rt_blocks.h - the block manager of the paged KV cache (private to runtime/): which pool
 * blocks each sequence slot holds (its block table), reference counts, and the prefix cache.
 * It lives on rank 0 (the executor, rt_exec.c), which sends each step's block tables along with
 * the batch, so every rank's pool (rt_kv.c) is written and read alike and the other ranks keep
 * no table of their own.
 *
 * Blocks: ids [1, n_blocks); block 0 is never handed out (batch padding rows write there).
 * Prefix cache (vLLM's automatic prefix caching, Kwon et al. SOSP 2023 section 4.4): a block that
 * a slot has filled completely is registered under the hash of its tokens chained with the hash
 * of the block before it (XXH64); rt_blocks_match gives a new sequence the registered blocks of
 * its longest cached prefix of whole blocks (the tokens of each block are compared, not only
 * the hash). A registered block whose last user leaves stays cached (evictable, least recently
 * used first) until its memory is needed. Copy-on-write: a step that writes into a block another
 * slot shares (a rewind into a shared prefix) first gets a private copy of it (rt_blocks_prepare
 * lists the copies; the forward does them before it runs); writing into a registered block
 * unregisters it.
 * Test: ./build/test_blocks (against a naive model of the same rules, random operations).
 */
#ifndef QS_RT_BLOCKS_H
#define QS_RT_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

#include "rt.h"

struct rt_blocks;

/* n_blocks >= 2 (block 0 reserved), block_size >= 1, n_slots >= 1 sequences of up to
 * max_blocks_per_seq blocks. prefix_cache: register full blocks and serve matches.
 * Errors: RT_ERR_ARG, RT_ERR_NOMEM. */
enum rt_err rt_blocks_create(int n_blocks, int block_size, int n_slots, int max_blocks_per_seq,
                             bool prefix_cache, struct rt_blocks **out);
void rt_blocks_free(struct rt_blocks *b); /* NULL is fine */

int rt_blocks_block_size(const struct rt_blocks *b);
int rt_blocks_total(const struct rt_blocks *b);     /* usable blocks: n_blocks - 1 */
int rt_blocks_available(const struct rt_blocks *b); /* free + cached-but-unused blocks */
int rt_blocks_used(const struct rt_blocks *b);      /* blocks held by some slot */
int rt_blocks_cached(const struct rt_blocks *b);    /* registered blocks (used or evictable) */
int rt_blocks_len(const struct rt_blocks *b, int slot);     /* positions the slot holds */
int rt_blocks_n_table(const struct rt_blocks *b, int slot); /* blocks in its table */
const int32_t *rt_blocks_table(const struct rt_blocks *b, int slot); /* [max_blocks_per_seq] */

/* New blocks a write of positions [p0, p0 + n) into `slot` takes (growth and copies-on-write;
 * blocks past the new end that a rewind frees are not counted back). */
int rt_blocks_needed(const struct rt_blocks *b, int slot, int p0, int n);

/*
 * Make positions [p0, p0 + n) of `slot` writable (0 <= p0 <= len, p0 + n within the table):
 * blocks past the new end are released (a rewind), missing blocks allocated, shared ones copied
 * (copy[2i] -> copy[2i+1] for i < *n_copy; copy has room for 2 * (n / block_size + 2) ids),
 * registered ones unregistered; the length becomes p0 + n. Errors: RT_ERR_ARG,
 * RT_ERR_KV_FULL (not enough blocks: nothing changed; rt_blocks_needed says how many).
 */
enum rt_err rt_blocks_prepare(struct rt_blocks *b, int slot, int p0, int n, int32_t *copy,
                              int *n_copy);

/* After the step that wrote them: tokens[n] at positions p0.. of `slot` (as prepared) are
 * remembered, and every block they complete is registered in the prefix cache. */
void rt_blocks_commit(struct rt_blocks *b, int slot, const int32_t *tokens, int p0, int n);

/*
 * An empty `slot` that will hold tokens[n] takes the registered blocks of the longest prefix of
 * whole blocks that is cached, leaving at least one token to compute (a step must produce the
 * last token's logits). Returns the positions now held (a multiple of block_size, < n; 0 when
 * nothing matched, the slot is not empty, or the prefix cache is off).
 */
int rt_blocks_match(struct rt_blocks *b, int slot, const int32_t *tokens, int n);

/* Release every block of `slot` (registered ones stay cached) and empty it. */
void rt_blocks_clear(struct rt_blocks *b, int slot);

/* Whether the internal invariants hold (reference counts equal table uses, lists consistent);
 * for tests. Reports the first broken one. */
bool rt_blocks_check(const struct rt_blocks *b);

#endif /* QS_RT_BLOCKS_H */
