/*
 * rt_chat.c - chat prompt formatting for the Llama-2, Llama-3 and ChatML (Qwen) families, as
 * their Hugging Face chat templates (tokenizer_config.json "chat_template") render them; the
 * family is recognised from the template by distinctive substrings, not by running Jinja.
 *
 *   Llama-2 (meta-llama/Llama-2-7b-chat-hf):  per user turn  BOS "[INST] " strip(content) " [/INST]",
 *     per assistant turn  " " strip(content) " " EOS; a leading system message becomes
 *     "<<SYS>>\n" system "\n<</SYS>>\n\n" in front of the first user content; no generation
 *     prompt (the text already ends with "[/INST]").
 *   Llama-3 (meta-llama/Meta-Llama-3-8B-Instruct):  BOS, then per message
 *     "<|start_header_id|>" role "<|end_header_id|>\n\n" trim(content) "<|eot_id|>";
 *     generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n" (always, when the
 *     tokenizer's own template of this family does not mention add_generation_prompt).
 *   Mistral (mistralai/Mistral-7B-Instruct-v0.2, Mixtral-8x7B-Instruct-v0.1):  BOS, then per user
 *     turn "[INST] " content " [/INST]", per assistant turn content EOS (v0.1's template: EOS " ",
 *     used when the tokenizer's template has `eos_token + ' '`); no system role (the templates
 *     raise an exception), no generation prompt.
 *   ChatML (Qwen2):  per message "<|im_start|>" role "\n" content "<|im_end|>\n";
 *     generation prompt "<|im_start|>assistant\n". No BOS. Qwen's templates insert a default
 *     system message when the first message is not one ("You are a helpful assistant." in Qwen2,
 *     "You are Qwen, created by Alibaba Cloud. ..." in Qwen2.5): when the tokenizer's ChatML
 *     template holds such a literal ('<|im_start|>system\n' TEXT '<|im_end|>'), it is used too.
 *   Gemma (google/gemma-2-9b-it, google/gemma-3-1b-it):  BOS, then per message
 *     "<start_of_turn>" (user | model) "\n" trim(content) "<end_of_turn>\n"; generation prompt
 *     "<start_of_turn>model\n"; roles alternate user/assistant; Gemma 3 puts a leading system
 *     message's content + "\n\n" before the first turn's content, Gemma 2 refuses it.
 *   Phi-3 (microsoft/Phi-3.5-mini-instruct):  per message "<|" role "|>\n" content "<|end|>\n"
 *     (a system message only when its content is not empty); generation prompt
 *     "<|assistant|>\n", else the EOS text. No BOS.
 * Entry points: rt_chat_detect, rt_chat_family_parse, rt_chat_end_id, rt_chat_format (rt_tok.h).
 * Test: ./build/test_tok (exactly one BOS after encoding, per family).
 */
#include <stdlib.h>
#include <string.h>

#include "qs_log.h"     /* qs_log_error */
#include "rt_tok_int.h" /* struct rt_tok (chat_template, bos, eos), UTF-8 helpers */

enum rt_chat_family rt_chat_detect(const struct rt_tok *tok)
{
    const char *t = tok ? tok->chat_template : NULL;
    if (!t)
        return RT_CHAT_NONE;
    if (strstr(t, "<|start_header_id|>"))
        return RT_CHAT_LLAMA3;
    if (strstr(t, "<|im_start|>"))
        return RT_CHAT_CHATML;
    if (strstr(t, "[INST]") && strstr(t, "<<SYS>>"))
        return RT_CHAT_LLAMA2;
    if (strstr(t, "[INST]"))
        return RT_CHAT_MISTRAL;
    if (strstr(t, "<start_of_turn>"))
        return RT_CHAT_GEMMA;
    if (strstr(t, "<|user|>") && strstr(t, "<|end|>"))
        return RT_CHAT_PHI3;
    return RT_CHAT_NONE;
}

enum rt_chat_family rt_chat_family_parse(const char *name)
{
    if (!name)
        return RT_CHAT_NONE;
    if (strcmp(name, "llama2") == 0)
        return RT_CHAT_LLAMA2;
    if (strcmp(name, "llama3") == 0)
        return RT_CHAT_LLAMA3;
    if (strcmp(name, "chatml") == 0 || strcmp(name, "qwen") == 0)
        return RT_CHAT_CHATML;
    if (strcmp(name, "mistral") == 0)
        return RT_CHAT_MISTRAL;
    if (strcmp(name, "gemma") == 0)
        return RT_CHAT_GEMMA;
    if (strcmp(name, "phi3") == 0)
        return RT_CHAT_PHI3;
    return RT_CHAT_NONE;
}

int32_t rt_chat_end_id(const struct rt_tok *tok, enum rt_chat_family family)
{
    if (!tok)
        return -1;
    if (family == RT_CHAT_NONE)
        family = rt_chat_detect(tok);
    switch (family) {
    case RT_CHAT_LLAMA3:
        return rt_tok_find(tok, "<|eot_id|>");
    case RT_CHAT_CHATML:
        return rt_tok_find(tok, "<|im_end|>");
    case RT_CHAT_GEMMA:
        return rt_tok_find(tok, "<end_of_turn>");
    case RT_CHAT_PHI3:
        return rt_tok_find(tok, "<|end|>");
    case RT_CHAT_LLAMA2:
    case RT_CHAT_MISTRAL:
        return tok->n_eos ? tok->eos_ids[0] : -1;
    default:
        return -1;
    }
}

/* Growable output string; `err` latches the first failure so appends can be chained. */
struct sbuf {
    char *s;
    size_t n, cap;
    enum rt_tok_err err;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->err)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            qs_log_error("rt_chat_format", "out of memory for a prompt of %zu bytes", b->n + n);
            b->err = RT_TOK_ERR_NOMEM;
            return;
        }
        b->s = ns, b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void puts_(struct sbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* Append s without leading/trailing White_Space (Python str.strip / Jinja trim). */
static void put_stripped(struct sbuf *b, const char *s)
{
    size_t n = strlen(s), i = 0;
    uint32_t cp;
    int k;
    while (i < n && (k = rt_tok_utf8_seq((const unsigned char *)s + i, n - i, &cp)) > 0 &&
           rt_tok_uni_in(cp, rt_tok_uni_space, rt_tok_uni_space_n))
        i += (size_t)k;
    size_t end = i, j = i;
    while (j < n && (k = rt_tok_utf8_seq((const unsigned char *)s + j, n - j, &cp)) > 0) {
        j += (size_t)k;
        if (!rt_tok_uni_in(cp, rt_tok_uni_space, rt_tok_uni_space_n))
            end = j;
    }
    put(b, s + i, end - i);
}

static bool valid_utf8(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = rt_tok_utf8_seq((const unsigned char *)s + i, n - i, &cp);
        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

/* The family's special tokens must exist as tokens, else the prompt would be split into text. */
static bool need_tokens(const struct rt_tok *tok, const char *const *names)
{
    for (; *names; names++) {
        if (rt_tok_find(tok, *names) < 0) {
            qs_log_error("rt_chat_format", "the tokenizer has no token \"%s\" that this chat format needs", *names);
            return false;
        }
    }
    return true;
}

static enum rt_tok_err format_llama2(const struct rt_tok *tok, const struct rt_chat_msg *msgs,
                                     size_t n, struct sbuf *b)
{
    const char *bos = rt_tok_piece(tok, tok->bos_id);
    const char *eos = tok->n_eos ? rt_tok_piece(tok, tok->eos_ids[0]) : NULL;
    if (!bos || !eos) {
        qs_log_error(__func__, "Llama-2 chat needs BOS and EOS tokens");
        return RT_TOK_ERR_CHAT;
    }
    const char *sys = NULL;
    if (n > 0 && strcmp(msgs[0].role, "system") == 0)
        sys = msgs[0].content, msgs++, n--;
    for (size_t i = 0; i < n; i++) {
        bool user = strcmp(msgs[i].role, "user") == 0;
        if (user != (i % 2 == 0) || (!user && strcmp(msgs[i].role, "assistant") != 0)) {
            qs_log_error(__func__, "Llama-2 chat: message %zu has role \"%s\"; roles must alternate user/assistant after an optional system message",
                         i + (sys != NULL), msgs[i].role);
            return RT_TOK_ERR_CHAT;
        }
        if (user) {
            puts_(b, bos);
            puts_(b, "[INST] ");
            if (i == 0 && sys) {
                struct sbuf c = {0};
                puts_(&c, "<<SYS>>\n");
                puts_(&c, sys);
                puts_(&c, "\n<</SYS>>\n\n");
                puts_(&c, msgs[i].content);
                if (c.err) {
                    free(c.s);
                    return c.err;
                }
                put_stripped(b, c.s);
                free(c.s);
            } else {
                put_stripped(b, msgs[i].content);
            }
            puts_(b, " [/INST]");
        } else {
            puts_(b, " ");
            put_stripped(b, msgs[i].content);
            puts_(b, " ");
            puts_(b, eos);
        }
    }
    return b->err;
}

/* The default system text of a ChatML template: the first literal '<|im_start|>system\n TEXT
 * <|im_end|>' (TEXT without quotes), with \n escapes undone, into sb; false when none. */
static bool chatml_default_system(const char *t, struct sbuf *sb)
{
    static const char *const opens[2] = {"'<|im_start|>system\\n", "'<|im_start|>system\n"};
    for (int o = 0; o < 2 && t; o++) {
        for (const char *p = strstr(t, opens[o]); p; p = strstr(p + 1, opens[o])) {
            const char *x = p + strlen(opens[o]), *end = strstr(x, "<|im_end|>");
            if (!end || end == x || memchr(x, '\'', (size_t)(end - x)) ||
                memchr(x, '{', (size_t)(end - x)))
                continue;
            for (const char *c = x; c < end; c++) {
                if (c[0] == '\\' && c + 1 < end && c[1] == 'n') {
                    put(sb, "\n", 1);
                    c++;
                } else {
                    put(sb, c, 1);
                }
            }
            return sb->err == RT_TOK_ERR_NONE;
        }
    }
    return false;
}

static enum rt_tok_err format_mistral(const struct rt_tok *tok, const struct rt_chat_msg *msgs,
                                      size_t n, struct sbuf *b)
{
    const char *bos = rt_tok_piece(tok, tok->bos_id);
    const char *eos = tok->n_eos ? rt_tok_piece(tok, tok->eos_ids[0]) : NULL;
    bool eos_space = tok->chat_template && rt_chat_detect(tok) == RT_CHAT_MISTRAL &&
                     strstr(tok->chat_template, "eos_token + ' '");
    if (!bos || !eos) {
        qs_log_error(__func__, "Mistral chat needs BOS and EOS tokens");
        return RT_TOK_ERR_CHAT;
    }
    puts_(b, bos);
    for (size_t i = 0; i < n; i++) {
        bool user = strcmp(msgs[i].role, "user") == 0;
        if (user != (i % 2 == 0) || (!user && strcmp(msgs[i].role, "assistant") != 0)) {
            qs_log_error(__func__, "Mistral chat: message %zu has role \"%s\"; roles must alternate user/assistant (no system role)",
                         i, msgs[i].role);
            return RT_TOK_ERR_CHAT;
        }
        if (user) {
            puts_(b, "[INST] ");
            puts_(b, msgs[i].content);
            puts_(b, " [/INST]");
        } else {
            puts_(b, msgs[i].content);
            puts_(b, eos);
            if (eos_space)
                puts_(b, " ");
        }
    }
    return b->err;
}

static enum rt_tok_err format_gemma(const struct rt_tok *tok, const struct rt_chat_msg *msgs,
                                    size_t n, bool gen, struct sbuf *b)
{
    static const char *const names[] = {"<start_of_turn>", "<end_of_turn>", NULL};
    const char *bos = rt_tok_piece(tok, tok->bos_id);
    if (!need_tokens(tok, names) || !bos) {
        qs_log_error(__func__, "Gemma chat needs BOS, <start_of_turn> and <end_of_turn>");
        return RT_TOK_ERR_CHAT;
    }
    const char *sys = NULL;
    if (n > 0 && strcmp(msgs[0].role, "system") == 0) {
        const char *t = tok->chat_template;
        if (t && rt_chat_detect(tok) == RT_CHAT_GEMMA && strstr(t, "System role not supported")) {
            qs_log_error(__func__, "Gemma chat: this model's template has no system role");
            return RT_TOK_ERR_CHAT;
        }
        sys = msgs[0].content, msgs++, n--;
    }
    puts_(b, bos);
    for (size_t i = 0; i < n; i++) {
        const bool user = strcmp(msgs[i].role, "user") == 0;
        if (user != (i % 2 == 0) || (!user && strcmp(msgs[i].role, "assistant") != 0)) {
            qs_log_error(__func__, "Gemma chat: message %zu has role \"%s\"; roles must alternate "
                         "user/assistant after an optional system message", i + (sys != NULL),
                         msgs[i].role);
            return RT_TOK_ERR_CHAT;
        }
        puts_(b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == 0 && sys) {
            puts_(b, sys);
            puts_(b, "\n\n");
        }
        put_stripped(b, msgs[i].content);
        puts_(b, "<end_of_turn>\n");
    }
    if (gen)
        puts_(b, "<start_of_turn>model\n");
    return b->err;
}

static enum rt_tok_err format_phi3(const struct rt_tok *tok, const struct rt_chat_msg *msgs,
                                   size_t n, bool gen, struct sbuf *b)
{
    static const char *const names[] = {"<|user|>", "<|assistant|>", "<|end|>", NULL};
    const char *eos = tok->n_eos ? rt_tok_piece(tok, tok->eos_ids[0]) : NULL;
    const char *t = tok->chat_template;
    const bool skip_empty_sys = t && strstr(t, "'system' and message['content']");
    if (!need_tokens(tok, names) || (!gen && !eos)) {
        qs_log_error(__func__, "Phi-3 chat needs <|user|>, <|assistant|>, <|end|> (and EOS)");
        return RT_TOK_ERR_CHAT;
    }
    /* the first Phi-3-mini templates begin with {{ bos_token }} (and put the assistant header
     * after each user turn themselves; rendered here as the later templates do) */
    if (t && rt_chat_detect(tok) == RT_CHAT_PHI3 && strstr(t, "bos_token") && tok->bos_id >= 0)
        puts_(b, rt_tok_piece(tok, tok->bos_id));
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0) {
            qs_log_error(__func__, "Phi-3 chat: message %zu has role \"%s\" (system, user or "
                         "assistant)", i, r);
            return RT_TOK_ERR_CHAT;
        }
        if (strcmp(r, "system") == 0 && skip_empty_sys && !msgs[i].content[0])
            continue;
        puts_(b, "<|");
        puts_(b, r);
        puts_(b, "|>\n");
        puts_(b, msgs[i].content);
        puts_(b, "<|end|>\n");
    }
    puts_(b, gen ? "<|assistant|>\n" : eos);
    return b->err;
}

enum rt_tok_err rt_chat_format(const struct rt_tok *tok, enum rt_chat_family family,
                               const struct rt_chat_msg *msgs, size_t n,
                               bool add_generation_prompt, char **text, size_t *len)
{
    static const char *const llama3_tokens[] = {"<|start_header_id|>", "<|end_header_id|>",
                                                "<|eot_id|>", NULL};
    static const char *const chatml_tokens[] = {"<|im_start|>", "<|im_end|>", NULL};
    struct sbuf b = {0};
    enum rt_tok_err err = RT_TOK_ERR_NONE;
    if (text)
        *text = NULL;
    if (len)
        *len = 0;
    if (!tok || !text || !len || (!msgs && n)) {
        qs_log_error(__func__, "NULL argument");
        return RT_TOK_ERR_ARG;
    }
    if (family == RT_CHAT_NONE)
        family = rt_chat_detect(tok);
    /* the first Llama-3-Instruct template appends the assistant header unconditionally */
    if (tok->chat_template && rt_chat_detect(tok) == family &&
        !strstr(tok->chat_template, "add_generation_prompt"))
        add_generation_prompt = true;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0] || strpbrk(msgs[i].role, "<>\n")) {
            qs_log_error(__func__, "message %zu: missing or malformed role/content", i);
            return RT_TOK_ERR_CHAT;
        }
        if (!valid_utf8(msgs[i].content) || !valid_utf8(msgs[i].role)) {
            qs_log_error(__func__, "message %zu (%s): content is not valid UTF-8", i, msgs[i].role);
            return RT_TOK_ERR_UTF8;
        }
    }
    switch (family) {
    case RT_CHAT_LLAMA2:
        err = format_llama2(tok, msgs, n, &b);
        break;
    case RT_CHAT_MISTRAL:
        err = format_mistral(tok, msgs, n, &b);
        break;
    case RT_CHAT_GEMMA:
        err = format_gemma(tok, msgs, n, add_generation_prompt, &b);
        break;
    case RT_CHAT_PHI3:
        err = format_phi3(tok, msgs, n, add_generation_prompt, &b);
        break;
    case RT_CHAT_LLAMA3:
        if (!need_tokens(tok, llama3_tokens) || tok->bos_id < 0) {
            err = RT_TOK_ERR_CHAT;
            break;
        }
        puts_(&b, rt_tok_piece(tok, tok->bos_id));
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|start_header_id|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "<|end_header_id|>\n\n");
            put_stripped(&b, msgs[i].content);
            puts_(&b, "<|eot_id|>");
        }
        if (add_generation_prompt)
            puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        err = b.err;
        break;
    case RT_CHAT_CHATML:
        if (!need_tokens(tok, chatml_tokens)) {
            err = RT_TOK_ERR_CHAT;
            break;
        }
        if ((n == 0 || strcmp(msgs[0].role, "system") != 0) && rt_chat_detect(tok) == RT_CHAT_CHATML) {
            struct sbuf def = {0};
            if (chatml_default_system(tok->chat_template, &def)) {
                puts_(&b, "<|im_start|>system\n");
                put(&b, def.s, def.n);
                puts_(&b, "<|im_end|>\n");
            }
            free(def.s);
        }
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|im_start|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "\n");
            puts_(&b, msgs[i].content);
            puts_(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt)
            puts_(&b, "<|im_start|>assistant\n");
        err = b.err;
        break;
    default:
        qs_log_error(__func__, "no chat format: the tokenizer_config.json chat_template is missing or not a Llama-2, Llama-3, Mistral, ChatML, Gemma or Phi-3 template; choose one explicitly");
        err = RT_TOK_ERR_CHAT;
        break;
    }
    if (!err && !b.s)
        puts_(&b, ""), err = b.err;
    if (err) {
        free(b.s);
        return err;
    }
    *text = b.s;
    *len = b.n;
    return RT_TOK_ERR_NONE;
}
