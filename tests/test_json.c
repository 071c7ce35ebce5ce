/*
 * test_json.c - format/qs_json.h, the config readers shared by the converter and the runtime:
 * each reader on a value of every kind it must accept or refuse (type, range edges, absent and
 * null), each refusal with its status and a message naming the file, the key and the value; the
 * eos merger across two objects (duplicates, the cap, nothing changed on error); rope_scaling in
 * the spellings transformers writes (rope_type / type, "default", upper case) and the refusals
 * the converter and the runtime both rely on; transformers 5's rope_parameters keys
 * (qs_json_rope_object) and null told from absent (qs_json_is_null); object parsing against
 * duplicate keys, trailing garbage and every truncation of a valid object.
 *
 * Run from the repository root: ./build/test_json.
 */
#include <cjson/cJSON.h>
#include <float.h>
#include <string.h>

#include "qs_json.h"
#include "qs_log.h"
#include "t.h"

static const struct qs_json_ctx C = {"test", "dir", "config.json"};

/* Parse a literal object (the test's own input: must parse). */
static cJSON *obj(const char *text)
{
    cJSON *o = NULL;
    enum qs_json_err e = qs_json_parse_object(&C, text, strlen(text), &o);
    CHECK_MSG(e == QS_JSON_OK && o, "fixture object does not parse: %s", text);
    return o;
}

/* The last message names every fragment (NULL-terminated list). */
static void says(const char *what, const char *const *frags)
{
    for (; *frags; frags++)
        CHECK_MSG(strstr(qs_log_last(), *frags), "%s: message \"%s\" lacks \"%s\"", what,
                  qs_log_last(), *frags);
}

static void test_parse_object(void)
{
    static const struct {
        const char *text;
        enum qs_json_err want;
        const char *needle;
    } cases[] = {
        {"{\"a\": 1}", QS_JSON_OK, NULL},
        {"{\"a\": 1}  \n\t", QS_JSON_OK, NULL},
        {"[1, 2]", QS_JSON_ERR_SYNTAX, "not a JSON object"},
        {"7", QS_JSON_ERR_SYNTAX, "not a JSON object"},
        {"{\"a\": 1,}", QS_JSON_ERR_SYNTAX, "not a JSON object"},
        {"{\"a\": 1, \"b\": 2, \"a\": 3}", QS_JSON_ERR_SYNTAX, "\"a\" appears twice"},
        {"{\"a\": 1} x", QS_JSON_ERR_SYNTAX, "trailing garbage"},
        {"{\"a\": 1}{}", QS_JSON_ERR_SYNTAX, "trailing garbage"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *o = (cJSON *)1;
        qs_log_clear();
        enum qs_json_err e = qs_json_parse_object(&C, cases[i].text, strlen(cases[i].text), &o);
        CHECK_MSG(e == cases[i].want, "case %zu (%s): %s", i, cases[i].text, qs_json_err_str(e));
        CHECK_MSG((e == QS_JSON_OK) == (o != NULL), "case %zu: out set on error or unset", i);
        if (cases[i].needle) {
            const char *frags[] = {"dir/config.json", cases[i].needle, NULL};
            says(cases[i].text, frags);
        }
        cJSON_Delete(o);
    }
    /* a NUL after the object is padding, not garbage; bytes after `size` are not read */
    const char padded[] = "{\"a\": 1}\0\0";
    cJSON *o = NULL;
    CHECK_EQ_INT(qs_json_parse_object(&C, padded, sizeof(padded), &o), QS_JSON_OK);
    cJSON_Delete(o);
    const char longer[] = "{\"a\": 1}garbage";
    CHECK_EQ_INT(qs_json_parse_object(&C, longer, 8, &o), QS_JSON_OK);
    cJSON_Delete(o);
    /* every truncation of a valid object is refused */
    const char *full = "{\"hidden_size\": 256, \"rope_scaling\": {\"factor\": 8.0}, \"x\": [1, 2]}";
    int accepted = 0;
    for (size_t n = 0; n < strlen(full); n++) {
        o = NULL;
        accepted += qs_json_parse_object(&C, full, n, &o) == QS_JSON_OK;
        cJSON_Delete(o);
    }
    CHECK_EQ_INT(accepted, 0);
}

static void test_int(void)
{
    cJSON *o = obj("{\"a\": 7, \"n\": null, \"f\": 12.5, \"s\": \"7\", \"neg\": -3, "
                   "\"big\": 1e30, \"b\": true}");
    int64_t v = 0;
    CHECK_EQ_INT(qs_json_int(&C, o, "a", true, 0, 1, 7, &v), QS_JSON_OK);
    CHECK_EQ_INT(v, 7);
    CHECK_EQ_INT(qs_json_int(&C, o, "neg", true, 0, -3, 0, &v), QS_JSON_OK);
    CHECK_EQ_INT(v, -3);
    /* absent and null: the default, or an error when required */
    CHECK_EQ_INT(qs_json_int(&C, o, "absent", false, 42, 1, 7, &v), QS_JSON_OK);
    CHECK_EQ_INT(v, 42);
    CHECK_EQ_INT(qs_json_int(&C, o, "n", false, -1, 1, 7, &v), QS_JSON_OK);
    CHECK_EQ_INT(v, -1);
    CHECK_EQ_INT(qs_json_int(&C, o, "n", true, 0, 1, 7, &v), QS_JSON_ERR_VALUE);
    const char *miss[] = {"dir/config.json", "required key \"n\" is missing", NULL};
    says("required null", miss);
    static const struct {
        const char *key;
        int64_t lo, hi;
        const char *got;
    } bad[] = {{"a", 1, 6, "got 7"}, {"a", 8, 9, "got 7"}, {"f", 0, 100, "got 12.5"},
               {"s", 0, 100, "got \"7\""}, {"big", 0, 1ll << 40, "got 1"},
               {"b", 0, 1, "got true"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = 99;
        CHECK_MSG(qs_json_int(&C, o, bad[i].key, true, 0, bad[i].lo, bad[i].hi, &v) ==
                      QS_JSON_ERR_VALUE,
                  "int case %zu accepted", i);
        CHECK_EQ_INT(v, 99); /* untouched on error */
        char key[32];
        snprintf(key, sizeof(key), "\"%s\" must be an integer in", bad[i].key);
        const char *frags[] = {"dir/config.json", key, bad[i].got, NULL};
        says("int", frags);
    }
    cJSON_Delete(o);
}

static void test_number_bool_string(void)
{
    cJSON *o = obj("{\"x\": 0.5, \"zero\": 0, \"tiny\": 1e-46, \"small\": 1e-45, \"one\": 1, "
                   "\"s\": \"MiXeD\", \"t\": true, \"i\": 0, \"long\": \"abcdefgh\"}");
    double d = 0;
    CHECK_EQ_INT(qs_json_number(&C, o, "x", true, 0, 0.0, 1.0, &d), QS_JSON_OK);
    CHECK(d == 0.5);
    CHECK_EQ_INT(qs_json_number(&C, o, "one", true, 0, 0.0, 1.0, &d), QS_JSON_OK); /* hi in */
    CHECK_EQ_INT(qs_json_number(&C, o, "zero", true, 0, 0.0, 1.0, &d), QS_JSON_ERR_VALUE);
    const char *frags[] = {"\"zero\" must be a number in (0, 1]", "got 0", NULL};
    says("number lo exclusive", frags);
    CHECK_EQ_INT(qs_json_number(&C, o, "one", true, 0, 0.0, 0.5, &d), QS_JSON_ERR_VALUE);
    CHECK_EQ_INT(qs_json_number(&C, o, "s", true, 0, 0.0, 1.0, &d), QS_JSON_ERR_VALUE);
    /* the fp32-positive bound the runtime uses: 1e-46 rounds to 0.0f, 1e-45 does not */
    CHECK_EQ_INT(qs_json_number(&C, o, "tiny", true, 0, 0x1p-150, FLT_MAX, &d),
                 QS_JSON_ERR_VALUE);
    CHECK_EQ_INT(qs_json_number(&C, o, "small", true, 0, 0x1p-150, FLT_MAX, &d), QS_JSON_OK);
    CHECK((float)d > 0.0f);
    CHECK_EQ_INT(qs_json_number(&C, o, "absent", false, 3.25, 0.0, 1.0, &d), QS_JSON_OK);
    CHECK(d == 3.25);
    CHECK_EQ_INT(qs_json_number(&C, o, "absent", true, 0, 0.0, 1.0, &d), QS_JSON_ERR_VALUE);

    bool b = false;
    CHECK_EQ_INT(qs_json_bool(&C, o, "t", false, &b), QS_JSON_OK);
    CHECK(b);
    CHECK_EQ_INT(qs_json_bool(&C, o, "absent", true, &b), QS_JSON_OK);
    CHECK(b);
    CHECK_EQ_INT(qs_json_bool(&C, o, "i", false, &b), QS_JSON_ERR_VALUE);
    const char *bf[] = {"\"i\" must be true or false", "got 0", NULL};
    says("bool", bf);

    char buf[9];
    CHECK_EQ_INT(qs_json_string(&C, o, "s", true, buf, sizeof(buf)), QS_JSON_OK);
    CHECK_EQ_STR(buf, "mixed");
    CHECK_EQ_INT(qs_json_string(&C, o, "s", false, buf, sizeof(buf)), QS_JSON_OK);
    CHECK_EQ_STR(buf, "MiXeD");
    CHECK_EQ_INT(qs_json_string(&C, o, "absent", false, buf, sizeof(buf)), QS_JSON_OK);
    CHECK_EQ_STR(buf, "");
    CHECK_EQ_INT(qs_json_string(&C, o, "long", false, buf, 8), QS_JSON_ERR_VALUE); /* 8 + NUL */
    CHECK_EQ_INT(qs_json_string(&C, o, "long", false, buf, 9), QS_JSON_OK);
    CHECK_EQ_STR(buf, "abcdefgh");
    CHECK_EQ_INT(qs_json_string(&C, o, "t", false, buf, sizeof(buf)), QS_JSON_ERR_VALUE);
    cJSON_Delete(o);
}

static void test_eos(void)
{
    int ids[4] = {0}, n = 0;
    cJSON *a = obj("{\"eos_token_id\": [128001, 128008, 128009, 128001]}");
    cJSON *b = obj("{\"eos_token_id\": 128009}");
    cJSON *c = obj("{\"eos_token_id\": [5]}");
    CHECK_EQ_INT(qs_json_eos_ids(&C, a, 128256, ids, 4, &n), QS_JSON_OK);
    CHECK_EQ_INT(n, 3); /* the duplicate inside one list is dropped */
    CHECK(ids[0] == 128001 && ids[1] == 128008 && ids[2] == 128009);
    CHECK_EQ_INT(qs_json_eos_ids(&C, b, 128256, ids, 4, &n), QS_JSON_OK);
    CHECK_EQ_INT(n, 3); /* already there */
    CHECK_EQ_INT(qs_json_eos_ids(&C, c, 128256, ids, 4, &n), QS_JSON_OK);
    CHECK(n == 4 && ids[3] == 5);
    /* a fifth distinct id exceeds the cap: refused, nothing changed */
    cJSON *d = obj("{\"eos_token_id\": [6, 7]}");
    CHECK_EQ_INT(qs_json_eos_ids(&C, d, 128256, ids, 4, &n), QS_JSON_ERR_VALUE);
    CHECK(n == 4 && ids[3] == 5);
    const char *cap[] = {"more than 4 distinct eos_token_id", NULL};
    says("eos cap", cap);
    static const char *const bad[] = {
        "{\"eos_token_id\": -1}", "{\"eos_token_id\": 100}", "{\"eos_token_id\": 2.5}",
        "{\"eos_token_id\": \"2\"}", "{\"eos_token_id\": [2, \"x\"]}", "{\"eos_token_id\": [[2]]}",
        "{\"eos_token_id\": {\"id\": 2}}", "{\"eos_token_id\": true}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cJSON *o = obj(bad[i]);
        int v[4] = {9, 9, 9, 9}, k = 1;
        CHECK_MSG(qs_json_eos_ids(&C, o, 100, v, 4, &k) == QS_JSON_ERR_VALUE, "eos %s accepted",
                  bad[i]);
        CHECK(k == 1 && v[0] == 9); /* ids[0, n) as they were */
        const char *frags[] = {"dir/config.json", "\"eos_token_id\" must be a token id in [0, 100)",
                               NULL};
        says(bad[i], frags);
        cJSON_Delete(o);
    }
    /* absent, null, an empty list: nothing changes */
    static const char *const none[] = {"{}", "{\"eos_token_id\": null}", "{\"eos_token_id\": []}"};
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
        cJSON *o = obj(none[i]);
        int v[2] = {0}, k = 0;
        CHECK_EQ_INT(qs_json_eos_ids(&C, o, 100, v, 2, &k), QS_JSON_OK);
        CHECK_EQ_INT(k, 0);
        cJSON_Delete(o);
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(c);
    cJSON_Delete(d);
}

static void test_rope(void)
{
    static const struct {
        const char *rs; /* the value of "rope_scaling" */
        enum qs_json_err want;
        enum qs_rope_type type;
        const char *needle; /* message fragment when refused */
    } cases[] = {
        {"null", QS_JSON_OK, QS_ROPE_DEFAULT, NULL},
        {"{\"rope_type\": \"default\"}", QS_JSON_OK, QS_ROPE_DEFAULT, NULL},
        {"{}", QS_JSON_OK, QS_ROPE_DEFAULT, NULL},
        {"{\"type\": \"linear\", \"factor\": 2.0}", QS_JSON_OK, QS_ROPE_LINEAR, NULL},
        {"{\"rope_type\": \"Linear\", \"factor\": 4}", QS_JSON_OK, QS_ROPE_LINEAR, NULL},
        {"{\"rope_type\": \"llama3\", \"type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": "
         "1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
         QS_JSON_OK, QS_ROPE_LLAMA3, NULL},
        {"[1]", QS_JSON_ERR_VALUE, 0, "\"rope_scaling\" must be null or an object"},
        {"{\"type\": \"linear\"}", QS_JSON_ERR_VALUE, 0, "required key \"factor\""},
        {"{\"type\": \"linear\", \"factor\": 0}", QS_JSON_ERR_VALUE, 0, "\"factor\" must be"},
        {"{\"type\": \"linear\", \"factor\": 1e-40}", QS_JSON_ERR_VALUE, 0, "\"factor\" must be"},
        {"{\"type\": \"linear\", \"factor\": 2e6}", QS_JSON_ERR_VALUE, 0, "\"factor\" must be"},
        {"{\"rope_type\": \"linear\", \"type\": \"llama3\", \"factor\": 2}", QS_JSON_ERR_VALUE, 0,
         "disagree"},
        {"{\"rope_type\": 3, \"factor\": 2}", QS_JSON_ERR_VALUE, 0, "\"rope_type\" must be"},
        {"{\"rope_type\": \"yarn\", \"factor\": 2.0}", QS_JSON_ERR_UNSUPPORTED, 0, "yarn"},
        {"{\"type\": \"dynamic\", \"factor\": 2.0}", QS_JSON_ERR_UNSUPPORTED, 0, "dynamic"},
        {"{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, "
         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
         QS_JSON_ERR_VALUE, 0, "high_freq_factor > low_freq_factor"},
        {"{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192.5}",
         QS_JSON_ERR_VALUE, 0, "original_max_position_embeddings"},
        {"{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
         "\"high_freq_factor\": 4.0}",
         QS_JSON_ERR_VALUE, 0, "required key \"original_max_position_embeddings\""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text), "{\"rope_theta\": 1, \"rope_scaling\": %s}", cases[i].rs);
        cJSON *o = obj(text);
        struct qs_rope_scaling r;
        memset(&r, 0x5a, sizeof(r));
        enum qs_json_err e = qs_json_rope_scaling(&C, o, &r);
        CHECK_MSG(e == cases[i].want, "rope case %zu (%s): %s", i, cases[i].rs,
                  qs_json_err_str(e));
        if (e == QS_JSON_OK)
            CHECK_EQ_INT(r.type, cases[i].type);
        else
            CHECK_EQ_INT(r.type, QS_ROPE_DEFAULT); /* zeroed */
        if (cases[i].needle) {
            const char *frags[] = {"dir/config.json", cases[i].needle, NULL};
            says(cases[i].rs, frags);
        }
        cJSON_Delete(o);
    }
    /* the values as written, no fp32 rounding */
    cJSON *o = obj("{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 0.1, "
                   "\"low_freq_factor\": 1.25, \"high_freq_factor\": 4.0, "
                   "\"original_max_position_embeddings\": 8192}}");
    struct qs_rope_scaling r;
    CHECK_EQ_INT(qs_json_rope_scaling(&C, o, &r), QS_JSON_OK);
    CHECK(r.factor == 0.1 && r.low_freq_factor == 1.25 && r.high_freq_factor == 4.0);
    CHECK_EQ_INT(r.original_max_position_embeddings, 8192);
    cJSON_Delete(o);
    /* keys inside rope_scaling are named with the object: "dir/config.json rope_scaling" */
    o = obj("{\"rope_scaling\": {\"type\": \"linear\", \"factor\": -1}}");
    CHECK_EQ_INT(qs_json_rope_scaling(&C, o, &r), QS_JSON_ERR_VALUE);
    const char *fr[] = {"dir/config.json rope_scaling: \"factor\"", "got -1", NULL};
    says("rope label", fr);
    cJSON_Delete(o);
    /* without a file name the label is the place alone */
    const struct qs_json_ctx rt = {"test", "rank-0-of-1.qshard: config", NULL};
    o = obj("{\"rope_scaling\": {\"type\": \"linear\", \"factor\": -1}}");
    CHECK_EQ_INT(qs_json_rope_scaling(&rt, o, &r), QS_JSON_ERR_VALUE);
    const char *fr2[] = {"rank-0-of-1.qshard: config rope_scaling: \"factor\"", NULL};
    says("rope label without file", fr2);
    cJSON_Delete(o);
    CHECK_EQ_STR(qs_rope_type_name(QS_ROPE_LINEAR), "linear");
    CHECK_EQ_STR(qs_rope_type_name(QS_ROPE_LLAMA3), "llama3");
    CHECK_EQ_STR(qs_rope_type_name(QS_ROPE_DEFAULT), "default");
    CHECK(strstr(qs_json_err_str(QS_JSON_ERR_UNSUPPORTED), "QS_JSON_ERR_UNSUPPORTED"));
    CHECK(strstr(qs_json_err_str((enum qs_json_err)77), "unknown"));
}

/* qs_json_rope_object: transformers 5's rope_parameters keys read from one flat dict, optional
 * original_max_position_embeddings, per-layer-type dicts refused, *out zeroed on error; and
 * qs_json_is_null, which tells a null key from an absent one. */
static void test_rope_object(void)
{
    cJSON *o = obj("{\"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\": \"llama3\", "
                   "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                   "\"partial_rotary_factor\": 1.0, \"attention_factor\": 3.0}, \"n\": null, "
                   "\"z\": 0, \"e\": {}}");
    struct qs_rope_object r;
    CHECK_EQ_INT(qs_json_rope_object(&C, o, "rope_parameters", &r), QS_JSON_OK);
    CHECK(r.given && r.rope_theta == 500000.0 && r.partial_rotary_factor == 1.0);
    CHECK(r.scaling.type == QS_ROPE_LLAMA3 && r.scaling.factor == 8.0 &&
          r.scaling.low_freq_factor == 1.0 && r.scaling.high_freq_factor == 4.0);
    CHECK_EQ_INT(r.scaling.original_max_position_embeddings, 0); /* optional here */
    /* absent and null: not given */
    CHECK_EQ_INT(qs_json_rope_object(&C, o, "rope_scaling", &r), QS_JSON_OK);
    CHECK(!r.given && r.rope_theta == 0 && r.scaling.type == QS_ROPE_DEFAULT);
    CHECK_EQ_INT(qs_json_rope_object(&C, o, "n", &r), QS_JSON_OK);
    CHECK(!r.given);
    CHECK_EQ_INT(qs_json_rope_object(&C, o, "e", &r), QS_JSON_OK); /* {} says nothing */
    CHECK(!r.given && r.scaling.type == QS_ROPE_DEFAULT);
    CHECK(qs_json_is_null(o, "n") && !qs_json_is_null(o, "absent") && !qs_json_is_null(o, "z"));
    cJSON_Delete(o);
    /* rope_scaling keeps requiring original_max_position_embeddings for llama3 */
    o = obj("{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": "
            "1.0, \"high_freq_factor\": 4.0, \"rope_theta\": 1e6}}");
    struct qs_rope_scaling sc;
    CHECK_EQ_INT(qs_json_rope_scaling(&C, o, &sc), QS_JSON_ERR_VALUE);
    const char *req[] = {"dir/config.json rope_scaling: required key "
                         "\"original_max_position_embeddings\" is missing", NULL};
    says("rope_scaling omax", req);
    CHECK_EQ_INT(qs_json_rope_object(&C, o, "rope_scaling", &r), QS_JSON_OK);
    CHECK(r.given && r.rope_theta == 1e6);
    cJSON_Delete(o);
    static const struct {
        const char *rp; /* the value of "rope_parameters" */
        enum qs_json_err want;
        const char *needle;
    } bad[] = {
        {"{\"full_attention\": {\"rope_type\": \"default\"}, \"sliding_attention\": "
         "{\"rope_type\": \"default\"}}", QS_JSON_ERR_UNSUPPORTED, "per-layer-type"},
        {"{\"rope_theta\": 1e6, \"x\": {}}", QS_JSON_ERR_UNSUPPORTED, "object under \"x\""},
        {"{\"rope_theta\": -1}", QS_JSON_ERR_VALUE, "rope_parameters: \"rope_theta\" must be"},
        {"{\"rope_theta\": 2e12}", QS_JSON_ERR_VALUE, "\"rope_theta\" must be"},
        {"{\"partial_rotary_factor\": 1.5}", QS_JSON_ERR_VALUE,
         "\"partial_rotary_factor\" must be"},
        {"{\"partial_rotary_factor\": 0}", QS_JSON_ERR_VALUE, "\"partial_rotary_factor\" must be"},
        {"{\"rope_type\": \"longrope\"}", QS_JSON_ERR_UNSUPPORTED,
         "rope_parameters type \"longrope\""},
        {"{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 0}", QS_JSON_ERR_VALUE,
         "\"original_max_position_embeddings\" must be"},
        {"\"default\"", QS_JSON_ERR_VALUE, "\"rope_parameters\" must be null or an object"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text), "{\"rope_parameters\": %s}", bad[i].rp);
        o = obj(text);
        memset(&r, 0x5a, sizeof(r));
        enum qs_json_err e = qs_json_rope_object(&C, o, "rope_parameters", &r);
        CHECK_MSG(e == bad[i].want, "rope_parameters case %zu (%s): %s", i, bad[i].rp,
                  qs_json_err_str(e));
        CHECK(!r.given && r.rope_theta == 0 && r.scaling.type == QS_ROPE_DEFAULT); /* zeroed */
        const char *frags[] = {"dir/config.json", bad[i].needle, NULL};
        says(bad[i].rp, frags);
        cJSON_Delete(o);
    }
}

int main(void)
{
    T_INIT("json");
    qs_log_set_quiet(true);
    test_parse_object();
    test_int();
    test_number_bool_string();
    test_eos();
    test_rope();
    test_rope_object();
    return t_done();
}
