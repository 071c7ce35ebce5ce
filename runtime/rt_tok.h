/*
 * rt_tok.h - the qshard tokenizer: text <-> token ids for the LLaMA family, plus chat formatting.
 *
 * Two model kinds, both behaving like Hugging Face `tokenizers` / sentencepiece:
 *   - SentencePiece BPE with byte fallback (Llama 1/2, Mistral), from tokenizer.json (model BPE
 *     with merges, Prepend/Replace normalizer) or from tokenizer.model (SentencePiece ModelProto,
 *     model_type BPE; merges come from the piece scores). Text gets a dummy prefix "▁", spaces
 *     become "▁", characters outside the vocabulary become <0xXX> byte tokens. The newer
 *     Metaspace pre-tokenizer form (prepend_scheme always/first/never, split false/true) is read too.
 *   - Byte-level BPE (Llama 3, Qwen2), from tokenizer.json: the Split pre-tokenizer regex
 *     (implemented by hand for the Llama-3, Qwen2 and GPT-2 patterns), GPT-2 byte-to-unicode map,
 *     merges by rank, ignore_merges, and the NFC normalizer (Qwen2).
 * Added tokens (tokenizer.json added_tokens) are matched in the text before the model: special
 * ones only with RT_TOK_PARSE_SPECIAL, non-special ones always (as HF does). BOS/EOS defaults
 * come from tokenizer_config.json (add_bos_token / add_eos_token) or else from the tokenizer.json
 * post_processor (TemplateProcessing); tokenizer.model alone adds BOS. As in HF, the text
 * between two added tokens is normalised separately: a SentencePiece tokenizer with a per-segment
 * dummy prefix encodes "<s>Hi" (PARSE_SPECIAL) as [<s>, "▁Hi"], like HF's legacy Llama tokenizer.
 * Verified against sentencepiece 0.1.97 and HF tokenizers 0.23.2 (tests/data/PROVENANCE.md).
 * Added tokens with "normalized": true under a SentencePiece normalizer are matched, as in HF, in
 * the normalised text as "▁" + content (so "<|im_start|>" added that way to Mistral matches only
 * at the start or after a space). Not read: the added-token "single_word" flag, tokenizer_config's
 * added_tokens_decoder (tokenizer.json's added_tokens are used) and clean_up_tokenization_spaces
 * (decoding stays lossless: decode(encode(text)) == text for byte-level tokenizers).
 *
 * Who calls it: runtime/rt_session.c and rt_generate.c (prompts, streamed text; `qshard run`,
 * `tokenize`, `perplexity` through them). Ownership: rt_tok_load
 * copies what it needs, so the caller may free the input buffers right after; every array or
 * string returned through an out-parameter is malloc'd and owned by the caller (free()).
 * Errors: every function returning enum rt_tok_err reports the failure once through qs_log_error
 * (format/qs_log.h) and leaves its out-parameters NULL / 0. A loaded struct rt_tok is read-only,
 * so one may be shared by threads; a struct rt_tok_stream belongs to one thread.
 * Tests: ./build/test_tok (from the repository root), vectors in tests/data/.
 */
#ifndef RT_TOK_H
#define RT_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message): stable values, never reused. */
#define RT_TOK_ERR_LIST(X)                                                            \
    X(RT_TOK_ERR_NONE, 0, "no error")                                                 \
    X(RT_TOK_ERR_NOMEM, 1, "out of memory")                                           \
    X(RT_TOK_ERR_ARG, 2, "invalid argument")                                          \
    X(RT_TOK_ERR_NO_MODEL, 3, "neither tokenizer.json nor tokenizer.model given")     \
    X(RT_TOK_ERR_JSON, 4, "malformed tokenizer.json")                                 \
    X(RT_TOK_ERR_MODEL, 5, "malformed tokenizer.model (SentencePiece protobuf)")      \
    X(RT_TOK_ERR_CONFIG, 6, "malformed tokenizer_config.json")                        \
    X(RT_TOK_ERR_SPECIAL_MAP, 7, "malformed special-token map")                       \
    X(RT_TOK_ERR_UNSUPPORTED, 8, "unsupported tokenizer feature")                     \
    X(RT_TOK_ERR_UTF8, 9, "text is not valid UTF-8")                                  \
    X(RT_TOK_ERR_ID, 10, "token id out of range")                                     \
    X(RT_TOK_ERR_TOO_LONG, 11, "text too long")                                       \
    X(RT_TOK_ERR_CHAT, 12, "cannot format the chat")                                  \
    X(RT_TOK_ERR_IO, 13, "cannot read a tokenizer file")

enum rt_tok_err {
#define RT_TOK_X_ENUM(name, value, msg) name = value,
    RT_TOK_ERR_LIST(RT_TOK_X_ENUM)
#undef RT_TOK_X_ENUM
};

/* Message for an error code ("unknown error" for a value not in the list). */
const char *rt_tok_err_str(enum rt_tok_err err);

/* The tokenizer files, as bytes in memory (borrowed for the duration of rt_tok_load only).
 * Any member may be NULL (length ignored then); at least one of json/model is needed. When both
 * are given, tokenizer.json is used for the model and tokenizer.model is ignored.
 *   json:        tokenizer.json (HF tokenizers serialisation)
 *   model:       tokenizer.model (SentencePiece ModelProto, binary protobuf)
 *   config:      tokenizer_config.json (add_bos_token, add_eos_token, bos_token, eos_token,
 *                chat_template)
 *   special_map: JSON object {"<content>": id, ...} that renames or adds special tokens after the
 *                files are read: the token with that id gets that content, is marked special and
 *                is matched in text (use: a Llama-3 tokenizer.json with Llama-3.1 names). */
struct rt_tok_files {
    const char *json;
    size_t json_len;
    const unsigned char *model;
    size_t model_len;
    const char *config;
    size_t config_len;
    const char *special_map;
    size_t special_map_len;
};

struct rt_tok; /* opaque, read-only once loaded */

/* Parse the tokenizer files into *out (NULL on error). Errors: RT_TOK_ERR_NO_MODEL,
 * RT_TOK_ERR_JSON / _MODEL / _CONFIG / _SPECIAL_MAP for malformed input (bad syntax, missing or
 * mistyped fields, ids out of range, duplicate pieces, merges naming unknown tokens, truncated
 * protobuf), RT_TOK_ERR_UNSUPPORTED for valid files using features not implemented (Unigram /
 * WordPiece models, unknown normalizers or pre-tokenizer patterns), RT_TOK_ERR_NOMEM. */
enum rt_tok_err rt_tok_load(const struct rt_tok_files *files, struct rt_tok **out);

/* Read the tokenizer files of a model directory (tokenizer.json or tokenizer.json.gz,
 * tokenizer.model, tokenizer_config.json; missing ones are skipped) and load them.
 * Errors: those of rt_tok_load; RT_TOK_ERR_NO_MODEL when none of the model files exists;
 * RT_TOK_ERR_IO when one exists but cannot be read (or is over 1 GiB). */
enum rt_tok_err rt_tok_load_dir(const char *dir, struct rt_tok **out);

/* Free a tokenizer (NULL is fine). */
void rt_tok_free(struct rt_tok *tok);

/* Encode flags. */
enum {
    RT_TOK_ADD_BOS = 1u << 0,         /* prepend BOS (never twice: not if the text starts with the
                                       * BOS token, parsed with RT_TOK_PARSE_SPECIAL) */
    RT_TOK_ADD_EOS = 1u << 1,         /* append EOS */
    RT_TOK_DEFAULT_SPECIAL = 1u << 2, /* BOS/EOS as the tokenizer files say; ignores the two above */
    RT_TOK_PARSE_SPECIAL = 1u << 3,   /* match special added tokens ("<s>", "<|eot_id|>") in text */
};

/* Encode UTF-8 text [len bytes] into token ids: *ids = malloc'd int32 [*n] (a valid pointer even
 * when *n == 0). Flags as above. Errors: RT_TOK_ERR_UTF8 (invalid UTF-8: overlong, surrogate,
 * > U+10FFFF, truncated; the byte offset is reported), RT_TOK_ERR_TOO_LONG (len >= 2^30),
 * RT_TOK_ERR_UNSUPPORTED (a character outside the vocabulary with no byte fallback and no unk),
 * RT_TOK_ERR_NOMEM, RT_TOK_ERR_ARG (NULL pointers; BOS/EOS asked for explicitly but the
 * tokenizer has none - RT_TOK_DEFAULT_SPECIAL never asks for what is missing). Cost: O(len log len) time; scratch memory about 12 bytes
 * per byte of the longest unit merged at once (byte-level: a 64 KB chunk; SentencePiece: a
 * word, the whole segment only for vocabularies with pieces like "a▁"). Measured (test_tok,
 * this 2-core dev box, -O2): ~18 MB/s on mixed text for both kinds. */
enum rt_tok_err rt_tok_encode(const struct rt_tok *tok, const char *text, size_t len,
                              unsigned flags, int32_t **ids, size_t *n);

/* Decode flags. */
enum {
    RT_TOK_DECODE_SKIP_SPECIAL = 1u << 0, /* drop special tokens (BOS, EOS, <|eot_id|>, ...) */
    RT_TOK_DECODE_KEEP_SPACE = 1u << 1,   /* SentencePiece: keep the leading space that HF's
                                           * decoder strips (use when continuing a text) */
};

/* Decode ids [n] to UTF-8 text: *text = malloc'd, NUL-terminated, *len bytes without the NUL.
 * Follows the reference decoder of the tokenizer's files:
 *   - SentencePiece kind: "▁" -> " ", <0xXX> -> the byte, one leading space of the whole output
 *     stripped (unless RT_TOK_DECODE_KEEP_SPACE). A run of consecutive byte tokens that is not
 *     valid UTF-8 gives one U+FFFD per invalid byte:
 *       from tokenizer.json (HF tokenizers decoders/byte_fallback.rs, ByteFallback): if the
 *       whole run is not valid UTF-8, every byte of the run becomes U+FFFD (a valid character
 *       inside such a run too); skipped special tokens are removed first, so they do not end a
 *       run;
 *       from tokenizer.model (sentencepiece_processor.cc, ProcessBytePieces): valid characters
 *       of the run are kept and each byte that does not start one becomes U+FFFD; any other
 *       piece, a skipped control token included, ends the run.
 *     Both: <0xE2><0x82> (a run ending inside a character) -> two U+FFFD.
 *   - byte-level kind: GPT-2 unicode -> bytes, then invalid UTF-8 becomes U+FFFD per maximal
 *     ill-formed subpart (HF decoders/byte_level.rs: String::from_utf8_lossy; Unicode 15 §3.9).
 * Special tokens decode to their content unless RT_TOK_DECODE_SKIP_SPECIAL (HF decode's
 * skip_special_tokens=True).
 * Errors: RT_TOK_ERR_ID (an id < 0 or >= rt_tok_n_vocab), RT_TOK_ERR_NOMEM.
 * Test: ./build/test_tok (tests/data/tokenizers/decode-vectors.json, from the references). */
enum rt_tok_err rt_tok_decode(const struct rt_tok *tok, const int32_t *ids, size_t n,
                              unsigned flags, char **text, size_t *len);

/* The vocabulary string of a token as stored in the files (e.g. "▁the", "Ġthe", "<0x0A>",
 * "<|eot_id|>"), or NULL for an id out of range. Borrowed from tok. */
const char *rt_tok_piece(const struct rt_tok *tok, int32_t id);

/* The raw bytes a token decodes to (*len bytes, not NUL-terminated; SentencePiece "▁" already a
 * space, no stripping); NULL for an id out of range. Borrowed from tok. */
const char *rt_tok_bytes(const struct rt_tok *tok, int32_t id, size_t *len);

/* Token id of an exact vocabulary string (piece or added-token content), or -1. */
int32_t rt_tok_find(const struct rt_tok *tok, const char *piece);

/* Number of token ids (model vocabulary plus added tokens): ids are 0 .. n_vocab-1. */
int32_t rt_tok_n_vocab(const struct rt_tok *tok);

/* BOS id, or -1 when the tokenizer has none (Qwen2). */
int32_t rt_tok_bos_id(const struct rt_tok *tok);

/* EOS ids of the tokenizer files (config eos_token, else the model's): *ids borrowed, [*n] with
 * n >= 0. The caller adds generation_config.json's eos_token_id list. */
const int32_t *rt_tok_eos_ids(const struct rt_tok *tok, size_t *n);

/* Is the id a special token (BOS, EOS, added special tokens, SentencePiece control/unknown)? */
bool rt_tok_is_special(const struct rt_tok *tok, int32_t id);

/* --- streaming decode ---------------------------------------------------------------------
 * Feed generated ids one at a time; each push returns the text that became complete: only whole
 * UTF-8 characters are emitted, an incomplete sequence (a byte-fallback or byte-level token
 * holding part of a character) is held until the next token completes it. rt_tok_stream_flush
 * emits what is held (one U+FFFD per held byte; byte-level: per maximal subpart). The
 * concatenated output equals rt_tok_decode of all ids with the same flags, except for one case
 * the stream cannot know in advance: a tokenizer.json byte run that holds valid characters
 * before an invalid byte, where HF's rule replaces the whole run but the stream has already
 * emitted those characters (it then gives sentencepiece's form: the characters, a U+FFFD per
 * invalid byte). */
struct rt_tok_stream {
    const struct rt_tok *tok; /* borrowed */
    unsigned flags;           /* RT_TOK_DECODE_* */
    bool started;             /* some text was emitted (HF strips only the first leading space) */
    unsigned char hold[4];    /* incomplete UTF-8 prefix held across tokens */
    size_t n_hold;
    char *out;                /* owned: text returned by the last push/flush */
    size_t out_cap;
};

/* Start a stream (no allocation until the first push). */
void rt_tok_stream_init(struct rt_tok_stream *s, const struct rt_tok *tok, unsigned flags);

/* Add one id; *text / *len = newly complete text (borrowed from s, valid until the next call;
 * NUL-terminated; may be empty). Errors: RT_TOK_ERR_ID, RT_TOK_ERR_NOMEM. */
enum rt_tok_err rt_tok_stream_push(struct rt_tok_stream *s, int32_t id, const char **text,
                                   size_t *len);

/* Emit what is held (U+FFFD for an incomplete sequence) and reset the stream for reuse. */
enum rt_tok_err rt_tok_stream_flush(struct rt_tok_stream *s, const char **text, size_t *len);

/* Free the stream's buffer (the struct itself is the caller's). */
void rt_tok_stream_free(struct rt_tok_stream *s);

/* --- chat formatting ----------------------------------------------------------------------- */

enum rt_chat_family {
    RT_CHAT_NONE = 0,   /* no known template */
    RT_CHAT_LLAMA2 = 1, /* <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s> */
    RT_CHAT_LLAMA3 = 2, /* <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> */
    RT_CHAT_CHATML = 3, /* <|im_start|>{role}\n{content}<|im_end|>\n (Qwen) */
    RT_CHAT_MISTRAL = 4, /* <s>[INST] {user} [/INST]{assistant}</s> (Mistral/Mixtral Instruct) */
    RT_CHAT_GEMMA = 5,  /* <bos><start_of_turn>{user|model}\n{content}<end_of_turn>\n (Gemma 2 / 3) */
    RT_CHAT_PHI3 = 6,   /* <|{role}|>\n{content}<|end|>\n (Phi-3 / 3.5) */
};

struct rt_chat_msg {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content; /* UTF-8 */
};

/* The family of the tokenizer_config.json chat_template, recognised by distinctive substrings
 * ("<|start_header_id|>", "<|im_start|>", "[INST]" with "<<SYS>>", "[INST]" alone = Mistral,
 * "<start_of_turn>" = Gemma, "<|user|>" with "<|end|>" = Phi-3); RT_CHAT_NONE otherwise. */
enum rt_chat_family rt_chat_detect(const struct rt_tok *tok);

/* Parse a family name: "llama2", "llama3", "chatml" (or "qwen"), "mistral", "gemma", "phi3";
 * RT_CHAT_NONE if unknown. */
enum rt_chat_family rt_chat_family_parse(const char *name);

/* The token that ends an assistant turn in `family` (RT_CHAT_NONE: rt_chat_detect), to stop
 * generation on even when generation_config.json does not list it: Llama-3 <|eot_id|>,
 * ChatML <|im_end|>, Gemma <end_of_turn>, Phi-3 <|end|>, Llama-2 / Mistral the EOS token; -1
 * when the tokenizer lacks it. */
int32_t rt_chat_end_id(const struct rt_tok *tok, enum rt_chat_family family);

/* Build the prompt text for msgs [n] in `family` (RT_CHAT_NONE: use rt_chat_detect), as the HF
 * templates of that family do (Llama-2: system folded into the first user turn, contents
 * stripped; Llama-3: contents trimmed; ChatML verbatim), ending with the assistant header when
 * add_generation_prompt (or always, if the tokenizer's template of this family ignores it);
 * Mistral: contents verbatim, no system role; Gemma: BOS, roles user / model alternating,
 * contents trimmed, a leading system message put before the first user content with "\n\n"
 * (Gemma 3) or refused where the template refuses it (Gemma 2: "System role not supported");
 * Phi-3: contents verbatim, EOS after the last turn when no generation prompt, an empty system
 * message skipped where the template says so (Phi-3.5). The text contains the BOS text where the template has it; encode it with
 * RT_TOK_PARSE_SPECIAL (BOS flags are then harmless: encode never adds a second BOS).
 * *text = malloc'd, NUL-terminated, *len bytes. Errors: RT_TOK_ERR_CHAT (no family, unknown role,
 * roles not alternating user/assistant for Llama-2/Mistral/Gemma, a system message for Mistral
 * or Gemma 2, the
 * tokenizer lacks the family's special tokens),
 * RT_TOK_ERR_UTF8 (a content is not UTF-8), RT_TOK_ERR_NOMEM. */
enum rt_tok_err rt_chat_format(const struct rt_tok *tok, enum rt_chat_family family,
                               const struct rt_chat_msg *msgs, size_t n,
                               bool add_generation_prompt, char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* RT_TOK_H */
