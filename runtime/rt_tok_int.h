/*
 * rt_tok_int.h - private to the tokenizer files (rt_tok.c, rt_tok_json.c, rt_tok_spm.c,
 * rt_tok_bpe.c, rt_chat.c, rt_tok_unicode.c): the layout of struct rt_tok and the helpers they
 * share.
 * Nothing outside runtime/rt_tok*.c and runtime/rt_chat.c includes this.
 */
#ifndef RT_TOK_INT_H
#define RT_TOK_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rt_tok.h" /* enum rt_tok_err, public types */

/* Largest vocabulary accepted (ids must fit comfortably in int32 arithmetic). */
#define RT_TOK_MAX_VOCAB (1 << 22)
/* Largest input text (bytes) accepted by rt_tok_encode. */
#define RT_TOK_MAX_TEXT ((size_t)1 << 30)

/* Unicode range tables, generated into rt_tok_unicode.c by tools/gen_unicode_tables.py. */
struct rt_tok_range {
    uint32_t lo, hi; /* inclusive code point range */
};
extern const struct rt_tok_range rt_tok_uni_letter[];     /* \p{L} */
extern const size_t rt_tok_uni_letter_n;
extern const struct rt_tok_range rt_tok_uni_number[];     /* \p{N} */
extern const size_t rt_tok_uni_number_n;
extern const struct rt_tok_range rt_tok_uni_space[];      /* \s = White_Space */
extern const size_t rt_tok_uni_space_n;
extern const struct rt_tok_range rt_tok_uni_nfc_unsafe[]; /* may change under NFC */
extern const size_t rt_tok_uni_nfc_unsafe_n;
extern const struct rt_tok_range rt_tok_uni_punct[];      /* \p{P} and ASCII punctuation */
extern const size_t rt_tok_uni_punct_n;
struct rt_tok_ccc_range {
    uint32_t lo, hi;
    uint8_t ccc; /* canonical combining class, non-zero */
};
extern const struct rt_tok_ccc_range rt_tok_uni_ccc[];
extern const size_t rt_tok_uni_ccc_n;
struct rt_tok_decomp {
    uint32_t cp;       /* sorted */
    uint16_t off, len; /* full canonical decomposition: rt_tok_uni_decomp_data[off .. off+len) */
};
extern const uint32_t rt_tok_uni_decomp_data[];
extern const struct rt_tok_decomp rt_tok_uni_decomp[];
extern const size_t rt_tok_uni_decomp_n;
struct rt_tok_comp {
    uint32_t first, second, composite; /* sorted by (first, second) */
};
extern const struct rt_tok_comp rt_tok_uni_comp[];
extern const size_t rt_tok_uni_comp_n;

enum rt_tok_kind {
    RT_TOK_KIND_SPM = 1,       /* SentencePiece-style BPE on "▁"-escaped characters */
    RT_TOK_KIND_BYTELEVEL = 2, /* GPT-2 byte-level BPE after a regex split */
};

enum rt_tok_pretok {
    RT_TOK_PRETOK_NONE = 0,   /* the whole segment is one word */
    RT_TOK_PRETOK_LLAMA3 = 1, /* ... |\p{N}{1,3}| ... (Llama 3) */
    RT_TOK_PRETOK_QWEN2 = 2,  /* ... |\p{N}| ... (Qwen2) */
    RT_TOK_PRETOK_GPT2 = 3,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    RT_TOK_PRETOK_FALCON = 4, /* Falcon's Sequence: Punctuation (runs of punctuation apart), then
                               * GPT-2's regex inside each run, then ASCII digit runs apart
                               * (Digits), cut into threes from the left (Split [0-9]{3}) */
};

/* Token attribute bits (struct rt_tok_entry.attr). */
enum {
    RT_TOKA_MODEL = 1u << 0,   /* a model piece: BPE may produce it */
    RT_TOKA_ADDED = 1u << 1,   /* an added token: matched in text before the model */
    RT_TOKA_SPECIAL = 1u << 2, /* special: matched only with PARSE_SPECIAL, skipped by SKIP_SPECIAL */
    RT_TOKA_LSTRIP = 1u << 3,  /* added token swallows whitespace on its left */
    RT_TOKA_RSTRIP = 1u << 4,  /* ... and on its right */
    RT_TOKA_BYTE = 1u << 5,    /* SentencePiece byte piece <0xXX> */
    RT_TOKA_UNUSED = 1u << 6,  /* SentencePiece UNUSED piece: resegmented after merging */
    RT_TOKA_NORMALIZED = 1u << 7, /* added token with "normalized": true */
    RT_TOKA_NMATCH = 1u << 8,  /* ... matched in the normalised text (SentencePiece normalizer) */
};

/* One token id. Offsets index tok->arena. */
struct rt_tok_entry {
    uint32_t piece_off, piece_len; /* vocabulary string (model piece, or added content) */
    uint32_t dec_off, dec_len;     /* bytes it decodes to */
    uint32_t model_off, model_len; /* model piece string (key of model_map), if RT_TOKA_MODEL */
    int32_t split_l, split_r;      /* RT_TOKA_UNUSED: the pair it was merged from, else -1 */
    uint32_t attr;                 /* RT_TOKA_* */
};

/* String -> id hash map over model pieces; open addressing, slots hold ids (-1 empty). */
struct rt_tok_strmap {
    int32_t *slot;
    uint32_t mask;
};

/* (left id, right id) -> merge rank and result id; open addressing, key 0 = empty. */
struct rt_tok_merge {
    uint64_t key; /* (left + 1) << 32 | (right + 1) */
    int32_t rank; /* lower merges first; equal ranks merge leftmost first */
    int32_t result;
};
struct rt_tok_pairmap {
    struct rt_tok_merge *slot;
    uint32_t mask;
    size_t n;
};

struct rt_tok {
    enum rt_tok_kind kind;
    int32_t n_vocab;
    struct rt_tok_entry *ent; /* owned, [n_vocab] */
    char *arena;              /* owned: all strings */
    size_t arena_len, arena_cap;

    struct rt_tok_strmap model_map; /* model piece -> id */
    struct rt_tok_pairmap merges;

    int32_t byte_id[256]; /* SPM: id of <0xXX> (-1 none); byte-level: id of the mapped char */
    uint16_t bl_cp[256];  /* byte-level: GPT-2 bytes_to_unicode, byte -> code point (< 0x144) */
    bool byte_fallback;   /* SPM: unknown characters become byte tokens */
    bool fuse_unk;        /* SPM: consecutive unknowns become one unk */
    bool ignore_merges;   /* byte-level: a word found whole in the vocabulary is one token */
    bool dummy_prefix;    /* SPM: prepend "▁" to each segment (or only the first, below) */
    bool prefix_first_only;
    bool prefix_unless_space; /* Metaspace: no prefix when the segment already starts with " " */
    bool norm_prepend, norm_replace; /* the normalizer itself has Prepend "▁" / Replace " "->"▁" */
    bool escape_spaces;   /* SPM: " " -> "▁" */
    bool remove_extra_ws; /* SPM model normalizer: strip and collapse spaces */
    bool spm_word_split;  /* SPM: no model piece has "▁" after another character (see bpe) */
    bool spm_split_all;   /* Metaspace split=true: a word starts at every "▁" */
    bool strip_space;     /* decoder strips one leading space of the output */
    bool byte_run_whole;  /* SPM from tokenizer.json with a ByteFallback decoder: a run of byte
                           * tokens that is not valid UTF-8 decodes to one U+FFFD per byte of
                           * the whole run (HF decoders/byte_fallback.rs); false (tokenizer.model):
                           * sentencepiece's rule, one U+FFFD per invalid byte, valid characters
                           * of the run kept (sentencepiece_processor.cc ProcessBytePieces) */
    bool nfc;             /* normalizer NFC: only NFC-stable text is accepted */
    enum rt_tok_pretok pretok;

    int32_t unk_id, bos_id; /* -1 when absent */
    int32_t eos_ids[4];
    size_t n_eos;
    bool add_bos, add_eos;  /* defaults for RT_TOK_DEFAULT_SPECIAL */

    int32_t *added;         /* owned: added-token ids sorted by (first byte, length desc) */
    size_t n_added;
    uint32_t added_first[257]; /* added[added_first[b] .. added_first[b+1]) start with byte b */
    uint8_t added_second[256][32]; /* bit c of [b]: some added token starts with bytes b, c */
    uint8_t added_single[32];      /* bit b: an added token is the single byte b */
    /* Added tokens with normalized=true under a SentencePiece normalizer: HF matches them in the
     * normalised text, against their normalised content (added_vocabulary.rs). Longest first. */
    int32_t *nadded;               /* owned: ids */
    uint32_t *nadded_off, *nadded_len; /* owned: normalised content in the arena */
    size_t n_nadded;

    char *chat_template;    /* owned, NUL-terminated, or NULL */
};

/* U+2581 LOWER ONE EIGHTH BLOCK "▁", SentencePiece's escaped space (3 bytes). */
#define RT_TOK_SPM_SPACE "\xE2\x96\x81"

/* --- tokenizer.json / tokenizer_config.json / special map (rt_tok_json.c) --- */
/* What rt_tok_load needs from tokenizer.json besides the tokens. */
struct rt_tok_json_opts {
    bool bytelevel;             /* a ByteLevel pre-tokenizer: RT_TOK_KIND_BYTELEVEL */
    int falcon_stage;           /* steps of Falcon's pre-tokenizer Sequence seen, in order
                                 * (Punctuation, ByteLevel, Digits, Split): 0 none, 4 all */
    int32_t tmpl_bos, tmpl_eos; /* TemplateProcessing: special token before / after $A, or -1
                                 * (checked against n_vocab by the caller) */
    bool have_tmpl;
};
/* Parse tokenizer.json into a new *out (vocab, merges, added tokens, options); NULL on error. */
enum rt_tok_err rt_tok_json_load(const char *text, size_t len, struct rt_tok **out,
                                 struct rt_tok_json_opts *o);
/* Apply tokenizer_config.json: add_bos/add_eos defaults, bos/eos ids, chat_template. */
enum rt_tok_err rt_tok_config_apply(struct rt_tok *tok, const char *text, size_t len);
/* Apply a special-token map {"content": id} (rename/mark ids as special added tokens). */
enum rt_tok_err rt_tok_special_map_apply(struct rt_tok *tok, const char *text, size_t len);

/* --- shared helpers (rt_tok.c) --- */
enum rt_tok_err rt_tok_arena_put(struct rt_tok *tok, const void *s, size_t n, uint32_t *off);
enum rt_tok_err rt_tok_strmap_build(struct rt_tok *tok);
int32_t rt_tok_strmap_get(const struct rt_tok *tok, const char *s, size_t n);
enum rt_tok_err rt_tok_pairmap_init(struct rt_tok_pairmap *m, size_t n_expected);
void rt_tok_pairmap_put(struct rt_tok_pairmap *m, int32_t l, int32_t r, int32_t rank,
                        int32_t result);
const struct rt_tok_merge *rt_tok_pairmap_get(const struct rt_tok_pairmap *m, int32_t l,
                                              int32_t r);
struct rt_tok *rt_tok_alloc(int32_t n_vocab);

/* --- SentencePiece model (rt_tok_spm.c) --- */
/* Build a tokenizer from a tokenizer.model buffer (SentencePiece ModelProto, model_type BPE). */
enum rt_tok_err rt_tok_spm_load(const unsigned char *buf, size_t len, struct rt_tok **out);

/* --- UTF-8 and Unicode (rt_tok_bpe.c) --- */
/* Length of the UTF-8 sequence at s[0..n): > 0 a valid character of that length; -k an
 * ill-formed maximal subpart of k >= 1 bytes (replace by one U+FFFD); 0 a valid but incomplete
 * prefix that runs past n. */
int rt_tok_utf8_seq(const unsigned char *s, size_t n, uint32_t *cp);
bool rt_tok_uni_in(uint32_t cp, const struct rt_tok_range *r, size_t n);
/* GPT-2 bytes_to_unicode (openai/gpt-2 encoder.py): printable Latin-1 bytes map to themselves,
 * the other 68 to 256, 257, ... in byte order. */
void rt_tok_bytelevel_map(uint16_t cp[256]);

/* --- BPE (rt_tok_bpe.c) --- */
/* Output vector of ids. */
struct rt_tok_ids {
    int32_t *v;
    size_t n, cap;
};
enum rt_tok_err rt_tok_ids_push(struct rt_tok_ids *ids, int32_t id);
/* Encode one segment (text between added tokens) with the model; `first` = it starts the text;
 * flags: RT_TOK_PARSE_SPECIAL for normalised-matched special added tokens. */
enum rt_tok_err rt_tok_encode_segment(const struct rt_tok *tok, const char *s, size_t n, bool first,
                                      unsigned flags, struct rt_tok_ids *out);

#endif /* RT_TOK_INT_H */
